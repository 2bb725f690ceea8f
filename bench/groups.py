#!/usr/bin/env python3
"""kaas consumer-group benchmark (loopback only).

On one broker (fresh data dir under $BENCH_DIR or a temp dir beside the repo):

1. Offset commit throughput: `--procs` processes, each with `--conns`
   connections (one group each), each keeping `--depth` OffsetCommit v2
   requests in flight for `--seconds`. Every answer is checked (error 0), and
   the broker answers a commit only once it is fsynced (group commit: one
   fsync covers every commit appended meanwhile). Reported twice: requests
   of one partition each (the worst case: one offset per request), and
   requests of 10 partitions (what a consumer of 10 partitions sends).
2. Commit latency at a moderate rate: one connection, one request in flight,
   paced at `--rate` commits/s for `--seconds`: p50/p99. Then, in the same
   run on the same directory, the fsync latency of the volume: 4 KiB
   write + fdatasync x 1000, p50/p99 — the floor under a durable commit.
3. Rebalance time of a 3-member group: 3 confluent-kafka consumers subscribe
   at once to a 3-partition topic that holds records; time from subscribe
   to every member's first record, `--runs` times, median. Includes the
   broker's group.initial.rebalance.delay.ms (default 3000, as in Kafka;
   like Kafka's, it is extended once when members join during it); then
   again on a broker started with the delay at 0.

On three brokers sharing one data dir:

4. Coordinator takeover after kill -9: a standalone consumer commits in a
   loop (synchronously); the broker coordinating its group's shard is killed
   with SIGKILL; takeover = kill to the first commit acknowledged after it
   (by the new owner, after the client rediscovers the coordinator),
   `--runs` times, median. Target: lease + grace + 1 s (defaults 3 + 1 + 1).

Usage: python3 bench/groups.py [--seconds 10] [--runs 5] [--quick]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import select
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from failover import Broker  # noqa: E402

from confluent_kafka import Consumer, Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OFFSET_COMMIT, FIND_COORDINATOR = 8, 10


# ------------------------------------------------------------------ wire
def kstr(s: str | None) -> bytes:
    if s is None:
        return struct.pack(">h", -1)
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def header(key: int, ver: int, cid: int) -> bytes:
    return struct.pack(">hhi", key, ver, cid) + kstr("kaas-bench")


def commit_v2(cid: int, group: str, topic: str, parts: list[int], offset: int) -> bytes:
    body = (kstr(group) + struct.pack(">i", -1) + kstr("") + struct.pack(">q", -1)
            + struct.pack(">i", 1) + kstr(topic) + struct.pack(">i", len(parts))
            + b"".join(struct.pack(">iq", p, offset) + kstr(None) for p in parts))
    payload = header(OFFSET_COMMIT, 2, cid) + body
    return struct.pack(">i", len(payload)) + payload


def first_error(resp: bytes, topic: str) -> int:
    # corr(4) topics(4) name(2+n) partitions(4) partition(4) error(2)
    at = 4 + 4 + 2 + len(topic.encode()) + 4 + 4
    return struct.unpack_from(">h", resp, at)[0]


def connect(addr) -> socket.socket:
    s = socket.create_connection(addr, timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


class Frames:
    """Length-prefixed frames from a socket, parsed from one buffer."""

    def __init__(self, s: socket.socket):
        self.s, self.buf = s, bytearray()

    def _pop(self) -> bytes | None:
        if len(self.buf) < 4:
            return None
        n = struct.unpack_from(">i", self.buf, 0)[0]
        if len(self.buf) < 4 + n:
            return None
        f = bytes(self.buf[4:4 + n])
        del self.buf[:4 + n]
        return f

    def _recv(self) -> None:
        chunk = self.s.recv(1 << 20)
        if not chunk:
            raise ConnectionError("closed")
        self.buf += chunk

    def drain(self) -> list[bytes]:
        """One recv, then every complete frame."""
        self._recv()
        out = []
        while (f := self._pop()) is not None:
            out.append(f)
        return out

    def one(self) -> bytes:
        while (f := self._pop()) is None:
            self._recv()
        return f


def storm(addr, topic, groups, parts, depth, seconds, out, idx):
    """One process: pipelined commits on one connection per group."""
    socks = [connect(tuple(addr)) for _ in groups]
    frames = {s.fileno(): Frames(s) for s in socks}
    group_of = {s.fileno(): g for s, g in zip(socks, groups)}
    cid = 0
    reqs = 0
    bad = 0

    def send(s, k):
        nonlocal cid
        buf = []
        for _ in range(k):
            cid += 1
            buf.append(commit_v2(cid, group_of[s.fileno()], topic, parts, cid))
        s.sendall(b"".join(buf))
    for s in socks:
        send(s, depth)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ready, _, _ = select.select(socks, [], [], 1.0)
        for s in ready:
            got = frames[s.fileno()].drain()
            for f in got:
                if first_error(f, topic) != 0:
                    bad += 1
            reqs += len(got)
            if got:
                send(s, len(got))
    out[idx] = reqs if bad == 0 else -bad


def commit_throughput(b, topic, procs, conns, depth, seconds, parts):
    ctx = multiprocessing.get_context("fork")
    out = ctx.Array("q", procs)
    ps = [ctx.Process(target=storm, args=(("127.0.0.1", b.port), topic,
                                          [f"bench-{len(parts)}-{k}-{g}" for g in range(conns)],
                                          parts, depth, seconds, out, k))
          for k in range(procs)]
    t0 = time.monotonic()
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    el = time.monotonic() - t0
    counts = list(out)
    if any(c < 0 for c in counts):
        raise SystemExit(f"commits refused: {counts}")
    # Every process ran `seconds`; startup cost is outside the window.
    return sum(counts) / seconds, el


def paced_latency(b, topic, rate, seconds):
    s = connect(("127.0.0.1", b.port))
    fr = Frames(s)
    lat = []
    gap = 1.0 / rate
    nxt = time.monotonic()
    end = nxt + seconds
    cid = 0
    while time.monotonic() < end:
        now = time.monotonic()
        if now < nxt:
            time.sleep(nxt - now)
        nxt += gap
        cid += 1
        t = time.perf_counter()
        s.sendall(commit_v2(cid, "bench-lat", topic, [0], cid))
        f = fr.one()
        lat.append(time.perf_counter() - t)
        assert first_error(f, topic) == 0
    s.close()
    return lat


def fsync_latency(d: Path, n=1000):
    path = d / "fsync-probe"
    lat = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        block = b"x" * 4096
        for _ in range(n):
            t = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t)
    finally:
        os.close(fd)
        path.unlink()
    return lat


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def create(boot, name, parts):
    a = AdminClient({"bootstrap.servers": boot})
    a.create_topics([NewTopic(name, parts, 1)])[name].result(30)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        md = a.list_topics(topic=name, timeout=5).topics.get(name)
        if md and md.error is None and len(md.partitions) == parts and all(
                p.leader >= 0 for p in md.partitions.values()):
            return
        time.sleep(0.1)
    raise SystemExit(f"topic {name} not ready")


def rebalance_time(boot, topic, run):
    group = f"bench-rb-{run}-{time.time_ns()}"
    cs = [Consumer({"bootstrap.servers": boot, "group.id": group, "auto.offset.reset": "earliest",
                    "enable.auto.commit": False, "fetch.wait.max.ms": 50,
                    "heartbeat.interval.ms": 500, "session.timeout.ms": 10000})
          for _ in range(3)]
    t0 = time.monotonic()
    for c in cs:
        c.subscribe([topic])
    first = [None] * 3
    end = t0 + 60
    while None in first and time.monotonic() < end:
        for i, c in enumerate(cs):
            m = c.poll(0.01)
            if m is not None and m.error() is None and first[i] is None:
                first[i] = time.monotonic() - t0
    for c in cs:
        c.close()
    if None in first:
        raise SystemExit("a member never got a record")
    return max(first)


def coordinator_of(brokers, group):
    for b in brokers:
        if not b.alive():
            continue
        try:
            s = connect(("127.0.0.1", b.port))
            payload = header(FIND_COORDINATOR, 1, 1) + kstr(group) + b"\x00"
            s.sendall(struct.pack(">i", len(payload)) + payload)
            f = Frames(s).one()
            s.close()
            # corr(4) throttle(4) error(2) msg(2+n) node(4)
            err = struct.unpack_from(">h", f, 8)[0]
            n = struct.unpack_from(">h", f, 10)[0]
            node = struct.unpack_from(">i", f, 12 + max(n, 0))[0]
            if err == 0:
                return node
        except OSError:
            pass
    return None


def commit_loop(brokers, group, topic, acks, stop):
    """Commit in a loop, as a client does: find the coordinator, commit,
    and on an error or a dropped connection look again (10 ms backoff).
    Brokers known dead (their process exited) are not asked."""
    sock, node, i = None, None, 0
    while not stop.is_set():
        try:
            if sock is None:
                node = coordinator_of(brokers, group)
                if node is None:
                    time.sleep(0.01)
                    continue
                sock = connect(("127.0.0.1", brokers[node].port))
                sock.settimeout(2)
                fr = Frames(sock)
            i += 1
            sock.sendall(commit_v2(i, group, topic, [0], i))
            if first_error(fr.one(), topic) == 0:
                acks.append((time.monotonic(), node))
                continue
        except OSError:
            pass
        if sock is not None:
            sock.close()
        sock = None
        time.sleep(0.01)
    if sock is not None:
        sock.close()


def takeover(runs, workdir: Path, extra):
    data = workdir / "cluster"
    data.mkdir()
    brokers = [Broker(i, data, workdir, extra) for i in range(3)]
    for b in brokers:
        b.start()
    for b in brokers:
        b.wait_ready()
    boot = ",".join(b.boot for b in brokers)
    topic = "bench-takeover"
    create(boot, topic, 3)
    out = []
    try:
        for run in range(runs):
            group = f"bench-to-{run}"
            acks: list[tuple[float, int]] = []
            stop = threading.Event()
            t = threading.Thread(target=commit_loop, args=(brokers, group, topic, acks, stop),
                                 daemon=True)
            t.start()
            end = time.monotonic() + 60
            while len(acks) < 50:
                if time.monotonic() > end:
                    raise SystemExit("no commits before the kill")
                time.sleep(0.05)
            victim = acks[-1][1]
            killed = time.monotonic()
            brokers[victim].proc.kill()
            brokers[victim].proc.wait()
            end = killed + 60
            while not any(a > killed and n != victim for a, n in acks) and time.monotonic() < end:
                time.sleep(0.01)
            after = [a for a, n in acks if a > killed and n != victim]
            stop.set()
            t.join(10)
            if not after:
                raise SystemExit(f"run {run}: no commit after the kill")
            out.append(after[0] - killed)
            print(f"  takeover run {run}: broker {victim} killed, first commit on the new "
                  f"coordinator after {out[-1]:.2f} s", file=sys.stderr)
            brokers[victim].start()
            brokers[victim].wait_ready()
            time.sleep(5)  # let the controller re-balance the shards
    finally:
        for b in brokers:
            if b.alive():
                b.proc.kill()
                b.proc.wait()
    return out


def fsync_hist(b) -> list[tuple[float, int]]:
    """The broker's kaas_fsync_seconds buckets: [(le, cumulative count)]."""
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{b.mport}/metrics", timeout=5).read().decode()
    out = []
    for line in text.splitlines():
        if line.startswith("kaas_fsync_seconds_bucket{"):
            le = line.split('le="')[1].split('"')[0]
            out.append((float("inf") if le == "+Inf" else float(le), int(line.split()[-1])))
    return out


def hist_pct(before, after, q) -> float:
    """Upper bound of the bucket holding quantile q of the delta."""
    d = [(le, a - b) for (le, a), (_, b) in zip(after, before)]
    total = d[-1][1]
    for le, c in d:
        if c >= q * total:
            return le
    return float("inf")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--conns", type=int, default=16)
    ap.add_argument("--depth", type=int, default=64)
    ap.add_argument("--rate", type=float, default=500)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--broker-args", default="")
    a = ap.parse_args()
    if a.quick:
        a.seconds, a.runs = 3, 2
    extra = a.broker_args.split()
    (ROOT / "bench" / "out").mkdir(parents=True, exist_ok=True)
    base = Path(os.environ.get("BENCH_DIR") or tempfile.mkdtemp(prefix="groups-",
                                                                 dir=ROOT / "bench" / "out"))
    work = base / "groups"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    data = work / "data"
    data.mkdir()
    b = Broker(0, data, work, extra)
    b.start()
    b.wait_ready()
    rows = []
    try:
        topic = "bench-commits"
        create(b.boot, topic, 10)
        rate1, _ = commit_throughput(b, topic, a.procs, a.conns, a.depth, a.seconds, [0])
        rows.append(("offset commits/s (1 partition per request)", f"{rate1:,.0f}",
                     f"{a.procs} procs x {a.conns} groups x {a.depth} in flight, each durable"))
        rate10, _ = commit_throughput(b, topic, a.procs, a.conns, a.depth, a.seconds,
                                      list(range(10)))
        rows.append(("partition offsets committed/s (10 per request)", f"{rate10 * 10:,.0f}",
                     f"{rate10:,.0f} requests/s"))
        h0 = fsync_hist(b)
        lat = paced_latency(b, topic, a.rate, a.seconds)
        h1 = fsync_hist(b)
        fs = fsync_latency(data)
        rows.append(("commit latency p50 / p99", f"{pct(lat, .5) * 1e3:.2f} / "
                     f"{pct(lat, .99) * 1e3:.2f} ms", f"{a.rate:.0f} commits/s, one in flight"))
        rows.append(("broker fsyncs meanwhile p50 / p99 (bucket bound)",
                     f"<={hist_pct(h0, h1, .5) * 1e3:g} / <={hist_pct(h0, h1, .99) * 1e3:g} ms",
                     f"{h1[-1][1] - h0[-1][1]} fsyncs (kaas_fsync_seconds)"))
        rows.append(("fsync (4 KiB write+fdatasync) p50 / p99", f"{pct(fs, .5) * 1e3:.2f} / "
                     f"{pct(fs, .99) * 1e3:.2f} ms", f"same volume, same run, x{len(fs)}"))
        rtopic = "bench-rebalance"
        create(b.boot, rtopic, 3)
        p = Producer({"bootstrap.servers": b.boot, "acks": "all"})
        for i in range(300):
            p.produce(rtopic, b"r", partition=i % 3)
        p.flush(30)
        rb = [rebalance_time(b.boot, rtopic, r) for r in range(a.runs)]
        rows.append(("rebalance, 3 members: subscribe -> first record", f"{statistics.median(rb):.2f} s",
                     "median of " + ", ".join(f"{x:.2f}" for x in rb)
                     + " (incl. initial rebalance delay)"))
    finally:
        b.proc.kill()
        b.proc.wait()
    # The same without the initial delay: what the protocol itself costs.
    data0 = work / "data-nodelay"
    data0.mkdir()
    b0 = Broker(0, data0, work, extra + ["--group-initial-rebalance-delay-ms", "0"])
    b0.start()
    b0.wait_ready()
    try:
        create(b0.boot, "bench-rebalance", 3)
        p = Producer({"bootstrap.servers": b0.boot, "acks": "all"})
        for i in range(300):
            p.produce("bench-rebalance", b"r", partition=i % 3)
        p.flush(30)
        rb0 = [rebalance_time(b0.boot, "bench-rebalance", r) for r in range(a.runs)]
        rows.append(("  the same, --group-initial-rebalance-delay-ms 0",
                     f"{statistics.median(rb0):.2f} s",
                     "median of " + ", ".join(f"{x:.2f}" for x in rb0)))
    finally:
        b0.proc.kill()
        b0.proc.wait()
    to = takeover(a.runs, work, extra)
    rows.append(("coordinator takeover after kill -9", f"{statistics.median(to):.2f} s",
                 "median of " + ", ".join(f"{x:.2f}" for x in to)
                 + " (target lease+grace+1 s = 5 s at defaults)"))
    print(f"\nkaas group benchmark  {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}  "
          f"{os.cpu_count()} cores  data: {data}")
    for r in rows:
        print(f"{r[0]:<50} {r[1]:>18}  {r[2]}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
