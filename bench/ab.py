#!/usr/bin/env python3
"""A/B produce throughput of several broker binaries, in one run.

The machine is shared and noisy, so binaries are compared as ratios of
medians measured in the same run, with the order rotated every round (the
first run of a round inherits the page-cache writeback of the previous one).

Usage:
  bench/ab.py --perf bench/out/rdk-build/examples/rdkafka_performance \\
      --rounds 4 base=/tmp/kaas-old new=target/release/kaas

Each round, for each binary: a fresh data directory, a broker on free
127.0.0.1 ports, then rdkafka_performance producing (acks=all) 100 B
records to 1 partition and 1 KiB records to 6 partitions (with
--idempotent: 100 B to 1 and to 6 partitions, each plain and with
enable.idempotence=true). Prints msg/s per
run, the median per binary and its ratio to the first binary; also the
broker's CPU per 100 MB produced (/proc/<pid>/stat utime+stime deltas) and,
after the produce cases, the volume's sequential write bandwidth with dd
(1 GiB of 1 MiB blocks + one fdatasync, buffered and oflag=direct) and a
socket-to-file copy (1 GiB over loopback TCP, pwrite + fdatasync every
8 MiB, no protocol), and each produce as a fraction of each of them in the
same round. Every load and every ceiling starts from a clean page cache
(`sync` first) and then waits --cold-wait seconds, so that each writes into
pages the VM's balloon has had time to hand back to the host (see settle()).
--profile: `perf record` the broker during each load and print its top
symbols.
Loopback only; every run is bounded by a timeout.

--consume: instead, each run produces 100 B records and 1 KiB records to
one partition each, then consumes them from the beginning with
rdkafka_performance -C (fetch.wait.max.ms=10, read from the page cache),
and reports consumed msgs/s; alongside, the machine's ceiling: the same
segment files copied to a loopback socket with sendfile and read by a
plain reader (reported as "ceiling <label>", in msgs/s of that size),
the broker's CPU per 100 MB served, and the client's CPU over the consume
time in % of one core (near 100: the client is the limit).
"""

import argparse
import contextlib
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

CASES = [  # (label, record size, partitions, records, extra producer flags)
    ("100 B x 1p", 100, 1, 1_000_000, []),
    ("1 KiB x 6p", 1024, 6, 200_000, []),
]
IDEM = ["-X", "enable.idempotence=true"]
# --idempotent: the 100 B cases plain and idempotent, each pair back to back.
IDEM_CASES = [
    ("100 B x 1p", 100, 1, 1_000_000, []),
    ("100 B x 1p idem", 100, 1, 1_000_000, IDEM),
    ("100 B x 6p", 100, 6, 1_000_000, []),
    ("100 B x 6p idem", 100, 6, 1_000_000, IDEM),
]


# --consume: (label, record size, records)
CONSUME_CASES = [
    ("consume 100 B x 1p", 100, 2_000_000),
    ("consume 1 KiB x 1p", 1024, 1_000_000),
]


def file_to_socket(paths):
    """Bytes/s of sendfile(2) of `paths` to a loopback TCP socket whose peer
    reads into one reused buffer: what serving these bytes costs with no
    broker at all. Best of three."""
    import threading

    total = sum(os.path.getsize(p) for p in paths)
    best = 0.0
    for _ in range(3):
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        cli = socket.create_connection(srv.getsockname())
        conn, _ = srv.accept()
        got = [0]

        def drain():
            buf = bytearray(1 << 20)
            while True:
                n = cli.recv_into(buf)
                if n == 0:
                    return
                got[0] += n

        t = threading.Thread(target=drain)
        t.start()
        t0 = time.monotonic()
        for p in paths:
            with open(p, "rb") as f:
                off, size = 0, os.path.getsize(p)
                while off < size:
                    off += os.sendfile(conn.fileno(), f.fileno(), off, size - off)
        conn.shutdown(socket.SHUT_WR)
        t.join()
        dt = time.monotonic() - t0
        conn.close(); cli.close(); srv.close()
        if got[0] == total:
            best = max(best, total / dt)
    return best


def client_run(cmd, timeout=180):
    """Run the load tool; returns (its output lines, its user+system CPU
    seconds, from the rusage of the waited-for child)."""
    import resource

    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return r.stdout.splitlines() + r.stderr.splitlines(), cpu


@contextlib.contextmanager
def profiled(pid, label, enabled):
    """With --profile: `perf record` the broker while the body runs, then
    print its top symbols (self time) under `label`."""
    if not enabled or not shutil.which("perf"):
        if enabled:
            print(f"profile {label}: perf not installed", flush=True)
        yield
        return
    data = tempfile.mktemp(prefix="kaas-ab-perf-", suffix=".data")
    rec = subprocess.Popen(["perf", "record", "-F", "999", "-o", data, "-p", str(pid)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        rec.send_signal(2)
        rec.wait(60)
        rep = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "sym",
                              "--percent-limit", "2", "--stdio"],
                             capture_output=True, text=True, timeout=120)
        top = [l.strip() for l in rep.stdout.splitlines() if l.strip() and not l.startswith("#")]
        print(f"profile {label} (broker, self time): " + " | ".join(top[:10]), flush=True)
        os.unlink(data)


def cpu_seconds(pid):
    """User + system CPU seconds of `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def broker(binary, workdir):
    """A broker on free 127.0.0.1 ports with a fresh data dir under
    `workdir`: yields (process, port, metrics port); stopped on exit."""
    port, mport = free_port(), free_port()
    data = os.path.join(workdir, "data")
    with open(os.path.join(workdir, "broker.log"), "wb") as log:
        proc = subprocess.Popen(
            [binary, "broker", "--data-dir", data, "--listen", f"127.0.0.1:{port}",
             "--metrics-listen", f"127.0.0.1:{mport}"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            if not wait_port(port, time.monotonic() + 60):
                raise RuntimeError(f"{binary} did not listen")
            yield proc, port, mport
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run_consume(binary, perf, workdir, scale, profile=False):
    out = {}
    data = os.path.join(workdir, "data")  # where broker() puts the log
    with broker(binary, workdir) as (proc, port, mport):
        boot = f"127.0.0.1:{port}"
        for i, (label, size, count) in enumerate(CONSUME_CASES):
            count = int(count * scale)
            topic = f"abc-{i}-{size}"
            create_topic(boot, topic, 1)
            subprocess.run(
                [perf, "-P", "-t", topic, "-b", boot, "-s", str(size), "-c", str(count),
                 "-a", "-1", "-X", "broker.address.family=v4", "-X", "linger.ms=5",
                 "-X", "batch.size=1000000", "-X", "queue.buffering.max.messages=1000000",
                 "-i", "1000"],
                capture_output=True, text=True, timeout=180,
            )
            cpu0 = cpu_seconds(proc.pid)
            with profiled(proc.pid, label, profile):
                lines, client_cpu = client_run(
                    [perf, "-C", "-t", topic, "-b", boot, "-p", "0", "-o", "beginning", "-e",
                     "-c", str(count), "-X", "broker.address.family=v4",
                     "-X", "fetch.wait.max.ms=10", "-i", "1000"])
            cpu = cpu_seconds(proc.pid) - cpu0
            lines = [l for l in lines if "consumed in" in l and "INTERVAL" not in l]
            m = re.search(r"(\d+) messages .* in (\d+)ms: (\d+) msgs/s", lines[-1]) if lines else None
            ok = m and int(m.group(1)) >= count
            out[label] = int(m.group(3)) if ok else float("nan")
            # The client's CPU (startup included) over the consume time, in
            # % of one core: near 100 means the client is the limit.
            out["client cpu% " + label] = int(100 * client_cpu / (int(m.group(2)) / 1000)) if ok and int(m.group(2)) else 0
            segs = []
            for d, _, names in os.walk(data):
                if topic in d.split(os.sep):
                    segs += [os.path.join(d, n) for n in names if n.endswith(".log")]
            bps = file_to_socket(sorted(segs)) if segs else 0.0
            # In records/s of the same size, with the log's framing.
            per = sum(os.path.getsize(p) for p in segs) / count if segs else 1
            out["ceiling " + label] = int(bps / per)
            # Broker CPU while consuming, in core-ms per 100 MB served.
            served = sum(os.path.getsize(p) for p in segs)
            out["cpu ms/100MB " + label] = int(cpu * 1000 / (served / 1e8)) if served else 0
    return out


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port, deadline):
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.3).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


def create_topic(boot, name, parts):
    from confluent_kafka.admin import AdminClient, NewTopic

    a = AdminClient({"bootstrap.servers": boot, "broker.address.family": "v4"})
    a.create_topics([NewTopic(name, num_partitions=parts, replication_factor=1)])[name].result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        t = a.list_topics(topic=name, timeout=10).topics.get(name)
        if t and t.error is None and len(t.partitions) == parts and all(
            p.leader >= 0 for p in t.partitions.values()
        ):
            return
        time.sleep(0.2)
    raise RuntimeError("topic not ready")


def run_one(binary, perf, workdir, scale, cases, profile=False):
    out = {}
    with broker(binary, workdir) as (proc, port, mport):
        boot = f"127.0.0.1:{port}"
        for i, (label, size, parts, count, extra) in enumerate(cases):
            topic = f"ab-{i}-{size}-{parts}"
            create_topic(boot, topic, parts)
            n = int(count * scale)
            settle()
            cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
            with profiled(proc.pid, label, profile):
                lines, client_cpu = client_run(
                    [perf, "-P", "-t", topic, "-b", boot, "-s", str(size), "-c", str(n),
                     "-a", "-1", "-X", "broker.address.family=v4", "-X", "linger.ms=5",
                     "-X", "batch.size=1000000", "-X", "queue.buffering.max.messages=1000000",
                     *extra, "-i", "1000"])
            cpu, wall = cpu_seconds(proc.pid) - cpu0, time.monotonic() - t0
            lines = [l for l in lines if "messages produced" in l]
            m = re.search(r" in \d+ms: (\d+) msgs/s", lines[-1]) if lines else None
            out[label] = int(m.group(1)) if m else float("nan")
            # Broker CPU while producing, in core-ms per 100 MB of values.
            out["cpu ms/100MB " + label] = int(cpu * 1000 / (n * size / 1e8))
            # Both sides' CPU over the load tool's run (start-up included),
            # in % of one core: near 200 together, this 2-core machine is
            # the limit, not the broker alone.
            out["broker cpu % " + label] = int(100 * cpu / wall)
            out["client cpu % " + label] = int(100 * client_cpu / wall)
    out.update(disk_ceiling(workdir))
    return out


DD_CASES = {  # label: extra dd flags; 1 GiB of 1 MiB blocks, one fdatasync at the end
    "dd buffered MB/s": [],  # page-cache writes then a flush: what kaas does
    "dd direct MB/s": ["oflag=direct"],  # the device alone, no page-cache copy
}
SOCKET_TO_FILE = "socket-to-file MB/s"


# Seconds to wait before each load and each ceiling; --cold-wait.
COLD_WAIT = 10.0
# --warm: bytes of memory touched and freed right before each load and each
# ceiling instead of the wait.
WARM = 0


def settle():
    """Write back every dirty page first, so that no measurement pays for
    the previous one's write-back; then wait COLD_WAIT seconds, so that
    every measurement writes into page-cache pages of the same temperature.
    This VM's balloon device reports free guest pages back to the host
    (virtio-balloon free page reporting, about 2 s after they are freed),
    and writing into a page the host has taken back faults it in again:
    a 1 GiB buffered dd ran at 1.3 GB/s right after 3 GiB had been freed
    and at 0.38 GB/s ten seconds later. Without the wait, whichever
    measurement ran right after a large unlink was three times faster."""
    subprocess.run(["sync"], timeout=300)
    if not WARM:
        time.sleep(COLD_WAIT)
        return
    # --warm: the opposite state, as on a machine whose page cache recycles
    # its own pages: fault WARM bytes in and free them right before the
    # measurement, which then writes into pages the host still backs (for
    # about 2 s, so keep each measurement short).
    subprocess.run([sys.executable, "-c", f"""
b = bytearray({WARM})
for i in range(0, len(b), 4096):
    b[i] = 1
"""], timeout=300)


def disk_ceiling(workdir):
    """Sequential write bandwidth of the volume under `workdir`, MB/s, each
    measured from a clean page cache; also the socket-to-file copy."""
    out = {}
    for label, flags in DD_CASES.items():
        path = os.path.join(workdir, "dd.out")
        settle()
        r = subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", "count=1024",
                            "conv=fdatasync", *flags], capture_output=True, text=True, timeout=180)
        m = re.search(r"copied, ([0-9.]+) s", r.stderr)
        out[label] = int(1024 * 1048576 / float(m.group(1)) / 1e6) if m else float("nan")
        os.unlink(path)
    settle()
    out[SOCKET_TO_FILE] = int(socket_to_file(os.path.join(workdir, "s2f.out"), 1 << 30) / 1e6)
    return out


def socket_to_file(path, total, sync_every=8 << 20):
    """Bytes/s of `total` bytes sent over a loopback TCP socket, read into
    one reused 1 MiB buffer, `pwrite`n to `path` and `fdatasync`ed every
    `sync_every` bytes and at the end: what a server that receives and
    durably writes these bytes costs on this machine with no protocol, no
    validation and no broker at all. The sender is a thread of this process
    resending one buffer, so it costs less than a real producer."""
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def send():
        with socket.create_connection(srv.getsockname()) as s:
            buf, left = memoryview(os.urandom(1 << 20)), total
            while left > 0:
                n = min(left, len(buf))
                s.sendall(buf[:n])
                left -= n

    t0 = time.monotonic()
    t = threading.Thread(target=send)
    t.start()
    conn, _ = srv.accept()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        buf = bytearray(1 << 20)
        mv, off, since = memoryview(buf), 0, 0
        while True:
            n = conn.recv_into(buf)
            if n == 0:
                break
            os.pwrite(fd, mv[:n], off)
            off, since = off + n, since + n
            if since >= sync_every:
                os.fdatasync(fd)
                since = 0
        os.fdatasync(fd)
        dt = time.monotonic() - t0
    finally:
        os.close(fd)
        os.unlink(path)
        conn.close()
        srv.close()
        t.join()
    return off / dt if off == total else float("nan")


def main():
    global COLD_WAIT, WARM
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--perf", required=True, help="rdkafka_performance binary (bench/run.sh builds it)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply record counts")
    ap.add_argument("--idempotent", action="store_true",
                    help="100 B x 1p and x 6p, each plain and with enable.idempotence=true")
    ap.add_argument("--consume", action="store_true",
                    help="consume 100 B and 1 KiB records from the page cache, with the file-to-socket ceiling")
    ap.add_argument("--profile", action="store_true",
                    help="perf record the broker during each load and print its top symbols")
    ap.add_argument("--cold-wait", type=float, default=COLD_WAIT, metavar="S",
                    help="seconds to wait (after a sync) before each load and ceiling (default %(default)s)")
    ap.add_argument("--warm", type=float, default=0, metavar="GIB",
                    help="instead of the wait, touch and free GIB GiB of memory right before each load and ceiling")
    ap.add_argument("--only", metavar="TEXT",
                    help="run only the produce cases whose label contains TEXT (e.g. '1 KiB')")
    ap.add_argument("binaries", nargs="+", help="name=path")
    a = ap.parse_args()
    COLD_WAIT, WARM = a.cold_wait, int(a.warm * (1 << 30))
    cases = IDEM_CASES if a.idempotent else CASES
    cases = [c for c in cases if a.only is None or a.only in c[0]]
    labels = [label for label, *_ in cases]
    labels += [extra + label for extra in ("cpu ms/100MB ", "broker cpu % ", "client cpu % ")
               for label in labels] + list(DD_CASES) + [SOCKET_TO_FILE]
    # Per round, each produce against the ceilings of the same round: the
    # ceilings drift several-fold within minutes on this VM, so only a
    # paired ratio means anything.
    pairs = [(f"{label} / {ceil}", label, size, ceil) for label, size, *_ in cases
             for ceil in (*DD_CASES, SOCKET_TO_FILE)]
    labels += [p[0] for p in pairs]
    if a.consume:
        labels = [l for l, _, _ in CONSUME_CASES]
        for extra in ("ceiling ", "client cpu% ", "cpu ms/100MB "):
            labels += [extra + l for l, _, _ in CONSUME_CASES]
    bins = [b.split("=", 1) for b in a.binaries]
    results = {name: {label: [] for label in labels} for name, _ in bins}
    out = os.path.join(os.path.dirname(__file__), "out")
    os.makedirs(out, exist_ok=True)  # a fresh clone has no bench/out
    root = tempfile.mkdtemp(prefix="kaas-ab-", dir=out)
    for rnd in range(a.rounds):
        order = bins[rnd % len(bins):] + bins[:rnd % len(bins)]
        for name, path in order:
            wd = os.path.join(root, f"{name}-{rnd}")
            os.makedirs(wd)
            if a.consume:
                res = run_consume(path, a.perf, wd, a.scale, a.profile)
            else:
                res = run_one(path, a.perf, wd, a.scale, cases, a.profile)
            if not a.consume:
                for pair, label, size, ceil in pairs:
                    mbs = res[label] * size / 1e6  # records/s of `size` B values
                    res[pair] = round(mbs / res[ceil], 3) if res[ceil] else float("nan")
            for label, v in res.items():
                results[name][label].append(v)
            print(f"round {rnd} {name:10s} " + "  ".join(f"{l}: {v}" for l, v in res.items()), flush=True)
            shutil.rmtree(os.path.join(wd, "data"), ignore_errors=True)
    base = bins[0][0]
    print()
    for label in labels:
        b = statistics.median(results[base][label])
        for name, _ in bins:
            m = statistics.median(results[name][label])
            unit = "" if label.startswith(("cpu ", "client ", "broker ", "dd ", "socket")) or " / " in label else " msg/s"
            print(f"{label:12s} {name:10s} median {m:>10.{3 if ' / ' in label else 0}f}{unit}  ratio to {base}: {m / b if b else float('nan'):.2f}  runs {results[name][label]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
