#!/usr/bin/env python3
"""What the successor probe adds to a group commit, on this volume.

After every group-commit fsync a partition leader looks up the next epoch's
claim (`leader-e<E+1>.claim`) by exact name before it acknowledges
(ARCHITECTURE.md, "One volume, one cluster"). This measures that step
against the fsync it follows, in one run, on the directory given (put it on
the volume you mean: a local disk, an NFS or CephFS mount):

  bench/successor_probe.py [--dir DIR] [--rounds 2000] [--size 4096]

Each round appends --size bytes to a file and fdatasyncs it ("commit"),
then looks up a name that does not exist ("probe", as `Fs::lookup` does on
the real volume: lstat, ENOENT). Rounds alternate which of "commit" and
"commit + probe" is timed, so drift in the machine's load hits both alike.
Prints the median and p99 of each and the ratio of medians. Writes only
inside a temp directory it makes under --dir and removes.
"""

import argparse
import os
import statistics
import tempfile
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--size", type=int, default=4096)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kaas-probe-", dir=a.dir) as d:
        seg = os.path.join(d, "00000000000000000000-e1.log")
        claim = os.path.join(d, "leader-e2.claim")
        fd = os.open(seg, os.O_CREAT | os.O_WRONLY, 0o644)
        buf = b"x" * a.size
        pos = 0
        plain, probed, probe_only = [], [], []
        try:
            for i in range(a.rounds):
                t0 = time.perf_counter()
                os.pwrite(fd, buf, pos)
                pos += len(buf)
                os.fdatasync(fd)
                t1 = time.perf_counter()
                if i % 2:
                    try:
                        os.lstat(claim)
                        raise SystemExit("the claim exists: not a probe of an absent name")
                    except FileNotFoundError:
                        pass
                    t2 = time.perf_counter()
                    probed.append(t2 - t0)
                    probe_only.append(t2 - t1)
                else:
                    plain.append(t1 - t0)
        finally:
            os.close(fd)

    def q(xs, p):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(p * len(xs)))]

    us = 1e6
    print(f"dir {a.dir}, {a.rounds} rounds of {a.size} B append + fdatasync")
    print(f"commit          p50 {statistics.median(plain) * us:8.1f} us  p99 {q(plain, .99) * us:8.1f} us")
    print(f"commit + probe  p50 {statistics.median(probed) * us:8.1f} us  p99 {q(probed, .99) * us:8.1f} us")
    print(f"probe alone     p50 {statistics.median(probe_only) * us:8.1f} us  p99 {q(probe_only, .99) * us:8.1f} us")
    print(f"ratio of medians (commit + probe) / commit: {statistics.median(probed) / statistics.median(plain):.3f}")


if __name__ == "__main__":
    main()
