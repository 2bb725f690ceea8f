#!/usr/bin/env python3
"""fdatasync latency of a 100 B write that appends (the file grows, so ext4
must commit its journal for the new size) against one that overwrites
space written and synced beforehand (no metadata to commit), in the same
directory, alternating, ROUNDS times N writes each. Prints p50/p99 per run.

  bench/fsync_probe.py [DIR] [--rounds 3] [-n 3000]
"""

import argparse
import os
import time


def run(path, overwrite, n, size=100):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if overwrite:
            os.write(fd, b"\0" * (n * size + 4096))
            os.fsync(fd)
        buf, lat = b"x" * size, []
        for i in range(n):
            os.pwrite(fd, buf, i * size)
            t = time.perf_counter()
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t)
    finally:
        os.close(fd)
        os.unlink(path)
    lat.sort()
    return lat[n // 2] * 1e3, lat[int(n * 0.99)] * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", nargs="?", default=os.path.join(os.path.dirname(__file__), "out"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=3000)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    path = os.path.join(a.dir, f"fsync-probe-{os.getpid()}")
    for _ in range(a.rounds):
        for overwrite in (False, True):
            p50, p99 = run(path, overwrite, a.n)
            print(f"{'overwrite' if overwrite else 'append':9s} p50 {p50:.3f} ms  p99 {p99:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
