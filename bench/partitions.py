#!/usr/bin/env python3
"""Many partitions on one broker (issue 13): creation rate, idle cost and
recovery.

Starts one broker (defaults) on a fresh data directory and creates
--topics topics of --partitions partitions each, 100 per CreateTopics
request, timing the first 1,000 and the whole. Then, idle for --idle seconds after
a settle period, reports from /proc: RSS, open descriptors, CPU (cores),
and the broker's filesystem syscalls per second (strace -c -f: opens,
reads, writes, listings, stats, renames, unlinks, fsyncs). Finally kill -9
and restart on the same directory, and time until every partition has
acknowledged an acks=all produce.

Prints PARTITIONS lines. Bounded by timeouts; loopback only.

With --by-path, another --idle seconds of the idle broker's metadata
operations grouped by call and path (strace -f -y).

Usage: bench/partitions.py [--bin target/release/kaas] [--topics 1000] [--partitions 10] [--idle 10] [--by-path]
"""

import argparse
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

FS_CALLS = ("openat", "open", "read", "pread64", "write", "pwrite64", "getdents64", "statx",
            "newfstatat", "fstat", "rename", "renameat", "renameat2", "unlink", "unlinkat",
            "fsync", "fdatasync", "mkdir", "mkdirat", "close", "lseek", "statfs")
# The calls that are a metadata operation on the volume (a round trip on NFS,
# cached or not): opens, listings, stats, statfs, renames, unlinks, mkdirs,
# fsyncs. Reads, writes and closes of an open file, and the event loops'
# eventfd reads and writes, are not counted here.
META_CALLS = ("openat", "open", "getdents64", "statx", "newfstatat", "rename", "renameat",
              "renameat2", "unlink", "unlinkat", "fsync", "fdatasync", "mkdir", "mkdirat", "statfs")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.3).close()
            return
        except OSError:
            assert time.monotonic() < deadline, "broker did not start"
            time.sleep(0.1)


def cpu_seconds(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid):
    m = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(m.group(1)) / 1024


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def fs_syscalls(pid, seconds):
    """Filesystem syscalls/s of every thread of `pid` over `seconds`
    (strace -c), or None without strace."""
    try:
        p = subprocess.Popen(["strace", "-f", "-c", "-q", "-p", str(pid), "-e", "trace=" + ",".join(FS_CALLS)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    except FileNotFoundError:
        return None
    time.sleep(seconds)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    calls = {}
    for line in err.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[-1] in FS_CALLS and parts[3].isdigit():
            calls[parts[-1]] = int(parts[3])
    return calls


def meta_paths(pid, seconds, root):
    """Metadata operations/s of `pid` by (call, path) over `seconds`
    (strace -f -y), paths under `root` shown relative to it with topic
    names, partition numbers and random or numbered names folded; top 25."""
    import collections
    out = Path(tempfile.mkdtemp(prefix="kaas-np-strace-")) / "trace"
    try:
        p = subprocess.Popen(["strace", "-f", "-q", "-y", "-o", str(out), "-p", str(pid),
                              "-e", "trace=" + ",".join(META_CALLS)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except FileNotFoundError:
        return None
    time.sleep(seconds)
    p.send_signal(signal.SIGINT)
    p.wait(30)
    counts = collections.Counter()
    for line in out.read_text(errors="replace").splitlines():
        m = re.match(r"\d+\s+(\w+)\((.*)", line)
        if not m or m.group(1) not in META_CALLS:
            continue
        pm = re.search(r'"([^"]+)"', m.group(2)) or re.search(r"<([^>]*)>", m.group(2))
        path = pm.group(1).replace(str(root), "") if pm else "?"
        path = re.sub(r"/t\d{5}", "/<topic>", path)
        path = re.sub(r"/\d+(/|$)", r"/<n>\1", path)
        path = re.sub(r"[0-9a-f]{16,}", "<hex>", path)
        path = re.sub(r"v-\d+", "v-<n>", path)
        counts[(m.group(1), path)] += 1
    subprocess.run(["rm", "-rf", str(out.parent)])
    return [(round(n / seconds, 1), c, path) for (c, path), n in counts.most_common(25)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/kaas")
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=10)
    ap.add_argument("--idle", type=float, default=10)
    ap.add_argument("--settle", type=float, default=15)
    ap.add_argument("--by-path", action="store_true",
                    help="also print the idle metadata operations by path (strace -y, another --idle seconds)")
    a = ap.parse_args()
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    d = Path(tempfile.mkdtemp(prefix="kaas-np-"))
    port, mport = free_port(), free_port()
    argv = [a.bin, "broker", "--data-dir", str(d / "data"), "--listen", f"127.0.0.1:{port}",
            "--metrics-listen", f"127.0.0.1:{mport}"]
    log = open(d / "log", "a")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_port(port)
        boot = f"127.0.0.1:{port}"
        admin = AdminClient({"bootstrap.servers": boot})
        names = [f"t{i:05d}" for i in range(a.topics)]
        t0 = time.monotonic()
        first_k = None
        for i in range(0, len(names), 100):
            batch = names[i:i + 100]
            fs = admin.create_topics([NewTopic(n, a.partitions, 1) for n in batch], operation_timeout=60)
            for f in fs.values():
                f.result(120)
            if first_k is None and i + 100 >= 1000:
                first_k = time.monotonic() - t0
        total = time.monotonic() - t0
        first_k = first_k or total
        print(f"PARTITIONS create topics={a.topics} partitions_each={a.partitions} "
              f"first_1000_s={first_k:.1f} total_s={total:.1f} topics_per_s={a.topics / total:.0f}",
              flush=True)
        time.sleep(a.settle)
        c0, t1 = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(a.idle)
        cores = (cpu_seconds(proc.pid) - c0) / (time.monotonic() - t1)
        calls = fs_syscalls(proc.pid, a.idle)
        per_s = {k: round(v / a.idle, 1) for k, v in sorted(calls.items())} if calls is not None else "n/a"
        total_ops = round(sum(calls.values()) / a.idle, 1) if calls else 0
        meta_ops = round(sum(v for k, v in calls.items() if k in META_CALLS) / a.idle, 1) if calls else 0
        nparts = a.topics * a.partitions
        print(f"PARTITIONS idle partitions={nparts} rss_mb={rss_mb(proc.pid):.0f} fds={fds(proc.pid)} "
              f"cpu_cores={cores:.3f} fs_syscalls_per_s={total_ops} metadata_ops_per_s={meta_ops} by_call={per_s}", flush=True)
        if a.by_path:
            for per_s, call, path in meta_paths(proc.pid, a.idle, d / "data") or []:
                print(f"PARTITIONS idle_path per_s={per_s} call={call} path={path}", flush=True)
        # kill -9, restart on the same directory, time until every partition acks.
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        t2 = time.monotonic()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        wait_port(port, timeout=120)
        pending = {(n, i) for n in names for i in range(a.partitions)}
        p = Producer({"bootstrap.servers": boot, "acks": "all", "linger.ms": 20,
                      "message.timeout.ms": 300000, "queue.buffering.max.messages": 200000})

        def cb(err, msg):
            if not err:
                pending.discard((msg.topic(), msg.partition()))

        for n in names:
            for i in range(a.partitions):
                p.produce(n, value=b"x", partition=i, on_delivery=cb)
                p.poll(0)
        deadline = time.monotonic() + 300
        while pending and time.monotonic() < deadline:
            p.poll(0.1)
        recovered = time.monotonic() - t2
        print(f"PARTITIONS recovery partitions={nparts} kill9_to_all_acked_s={recovered:.1f} "
              f"unacked={len(pending)}", flush=True)
        p.flush(10)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        subprocess.run(["rm", "-rf", str(d)])


if __name__ == "__main__":
    main()
