#!/usr/bin/env python3
"""kaas failover benchmark: 3 brokers on one data directory (loopback only).

1. Failover time, `--runs` times (default 10) for each kind of victim: a
   producer (acks=all) sends to every partition every few ms; a leader is
   killed with SIGKILL — a leader that is not the controller (the
   partition-failover path), and the controller's own broker (the successor
   must win the election, then re-grant); `--kill leader|controller` runs
   one kind only. Reported separately, each against its target (issue 12):
   controller <= 5 s, non-controller <= lease + grace + 0.5 s. Failover = time
   from the kill to the first acknowledgement, on *every* partition the
   victim led, of a record sent after the kill (necessarily from its new
   leader): the slowest of its partitions. The broker is restarted and the
   cluster re-balanced before the next run.
2. Rolling restart: SIGTERM each broker in turn (controlled shutdown, then
   restart); reports the longest gap between consecutive acknowledgements
   within one partition (the stall a client of that partition sees), and
   per-broker exit codes.
Every acknowledged record is read back at the end (zero loss is checked,
not assumed). Lease settings are the broker defaults unless --broker-args.

With --data-dirs D0,D1,D2 broker i keeps its data in Di instead (e.g. the
same directory of a shared volume reached through three clients, one per
"host": bench/substrates.py); they are not removed afterwards.

Usage: python3 bench/failover.py [--runs 10] [--kill both|leader|controller] [--no-rolling]
                                 [--broker-args "--lease-ms 3000"] [--data-dirs D0,D1,D2]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parents[1]
PARTS = 6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    def __init__(self, i: int, data: Path, logs: Path, extra: list[str]):
        self.id, self.data, self.extra = i, data, extra
        self.port, self.mport = free_port(), free_port()
        self.log = logs / f"broker{i}.log"
        self.proc = None

    @property
    def boot(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self):
        binary = os.environ.get("KAAS_BIN", str(ROOT / "target/release/kaas"))
        with open(self.log, "ab") as log:
            # Each run starts from a whole cluster: the restarted broker
            # gets its share back at once, not after the production
            # default's 60 s of stable membership (--broker-args overrides).
            env = {"KAAS_REBALANCE_DELAY_MS": "0", **os.environ}
            self.proc = subprocess.Popen(
                [binary, "broker", "--broker-id", str(self.id), "--data-dir", str(self.data),
                 "--listen", self.boot, "--metrics-listen", f"127.0.0.1:{self.mport}", *self.extra],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env)

    def wait_ready(self, timeout=60):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise SystemExit(f"broker {self.id} not ready")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None


def meta(brokers, topic=None):
    boot = ",".join(b.boot for b in brokers if b.alive())
    return AdminClient({"bootstrap.servers": boot}).list_topics(topic=topic, timeout=5)


def leaders(brokers, topic):
    return {p: m.leader for p, m in meta(brokers, topic).topics[topic].partitions.items()}


def wait_whole(brokers, topic, timeout=60):
    """All brokers up, each leading its share (after a restart the controller
    re-balances by moving partitions back)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            ls = leaders(brokers, topic)
            counts = {b.id: list(ls.values()).count(b.id) for b in brokers}
            if len(ls) == PARTS and all(c == PARTS // len(brokers) for c in counts.values()):
                return
        except Exception:
            pass
        time.sleep(0.2)
    raise SystemExit(f"cluster not whole: {ls}")


def watch_leaders(brokers, victim, topic, parts, t0, out, timeout=60.0):
    """Append to `out` the time (since `t0`) at which Metadata from the
    surviving brokers first names a live leader other than `victim` for
    every partition in `parts`."""
    boot = ",".join(b.boot for b in brokers if b is not victim)
    admin = AdminClient({"bootstrap.servers": boot})
    while time.monotonic() - t0 < timeout:
        try:
            ps = admin.list_topics(topic=topic, timeout=1).topics[topic].partitions
            if all(ps[p].leader not in (-1, victim.id) for p in parts):
                out.append(time.monotonic() - t0)
                return
        except Exception:
            pass
        time.sleep(0.02)


class Load:
    def __init__(self, boot, topic):
        self.p = Producer({"bootstrap.servers": boot, "acks": "all", "linger.ms": 1,
                           "enable.idempotence": False,
                           "max.in.flight.requests.per.connection": 1,
                           "retries": 10**6, "retry.backoff.ms": 20, "retry.backoff.max.ms": 100,
                           "message.timeout.ms": 120000, "topic.metadata.refresh.interval.ms": 1000,
                           "reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 200,
                           # e.g. BENCH_PRODUCER_DEBUG=metadata,topic: when the
                           # client learnt of each leader change (stderr)
                           **({"debug": os.environ["BENCH_PRODUCER_DEBUG"]}
                              if os.environ.get("BENCH_PRODUCER_DEBUG") else {})})
        self.topic = topic
        self.acks: list[tuple[float, int, int]] = []  # (time, partition, seq)
        self.errors = []
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.seq = 0

    def cb(self, err, m):
        if err:
            self.errors.append(str(err))
        else:
            self.acks.append((time.monotonic(), m.partition(), int(m.value())))

    def run(self):
        while not self.stop.is_set():
            for p in range(PARTS):
                self.p.produce(self.topic, str(self.seq).encode(), partition=p, on_delivery=self.cb)
                self.seq += 1
            self.p.poll(0)
            time.sleep(0.003)
        self.p.flush(120)


def verify(brokers, topic, load):
    want = {p: set() for p in range(PARTS)}
    for _, p, s in load.acks:
        want[p].add(s)
    c = Consumer({"bootstrap.servers": ",".join(b.boot for b in brokers), "group.id": "x",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTS)])
    got = {p: set() for p in range(PARTS)}
    eof = set()
    end = time.monotonic() + 120
    while len(eof) < PARTS and time.monotonic() < end:
        for m in c.consume(10000, 1.0):
            if m.error():
                if m.error().code() == -191:
                    eof.add(m.partition())
                continue
            got[m.partition()].add(int(m.value()))
    c.close()
    lost = sum(len(want[p] - got[p]) for p in range(PARTS))
    return lost, sum(len(v) for v in want.values())


def _flag(args: str, name: str, default: int) -> int:
    """The value of `name` in the broker args, or the broker's default."""
    words = shlex.split(args)
    return int(words[words.index(name) + 1]) if name in words else default


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--broker-args", default="")
    ap.add_argument("--kill", choices=["both", "leader", "controller"], default="both",
                    help="whose broker to kill: a non-controller leader, the controller, "
                         "or each in turn (default), --runs times each")
    ap.add_argument("--no-rolling", action="store_true", help="skip the rolling restart")
    ap.add_argument("--keep", action="store_true",
                    help="keep the brokers' logs and data even when every run met its target")
    ap.add_argument("--data-dirs", default="", metavar="D0,D1,D2",
                    help="each broker's data directory (default: one directory for all "
                         "three in the temp dir)")
    a = ap.parse_args()
    dirs = [Path(d) for d in a.data_dirs.split(",")] if a.data_dirs else []
    if dirs and len(dirs) != 3:
        ap.error("--data-dirs takes three directories, comma-separated")
    work = Path(tempfile.mkdtemp(prefix="kaas-failover-", dir=os.environ.get("BENCH_DIR")))
    dirs = dirs or [work / "data"] * 3
    brokers = [Broker(i, dirs[i], work, shlex.split(a.broker_args)) for i in range(3)]
    for b in brokers:
        b.start()
    for b in brokers:
        b.wait_ready()
    boot = ",".join(b.boot for b in brokers)
    topic = "failover"
    admin = AdminClient({"bootstrap.servers": boot})
    admin.create_topics([NewTopic(topic, PARTS, 1)])[topic].result(30)
    wait_whole(brokers, topic)
    load = Load(boot, topic)
    load.t.start()
    kinds = ["leader", "controller"] if a.kill == "both" else [a.kill]
    times: dict[str, list[float]] = {k: [] for k in kinds}
    adv: dict[str, list[float]] = {k: [] for k in kinds}
    try:
        for kind, run in [(k, r) for k in kinds for r in range(a.runs)]:
            time.sleep(1.0)
            ctl = meta(brokers).controller_id
            ls = leaders(brokers, topic)
            if kind == "controller":
                victim = brokers[ctl]
            else:
                victim = next((b for b in brokers if b.id == ls[0] and b.id != ctl), None)
                if victim is None:  # partition 0 led by the controller: pick another
                    victim = brokers[next(l for l in ls.values() if l != ctl)]
            parts = sorted(p for p, l in ls.items() if l == victim.id)
            seq0 = load.seq  # count only records sent after the kill
            t0, wall0 = time.monotonic(), time.time()
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait()
            # kaas's own part: when a surviving broker first advertises a
            # new, live leader for every partition the victim led (polled
            # every 20 ms); the rest, up to the first ack, is the client's
            # discovery (librdkafka re-queries a leaderless partition on a
            # fixed 1 s topic scan).
            advertised: list[float] = []
            threading.Thread(target=watch_leaders, daemon=True,
                             args=(brokers, victim, topic, parts, t0, advertised)).start()
            first: dict[int, float] = {}
            while len(first) < len(parts):
                for t, p, q in load.acks[-20000:]:
                    if p in parts and p not in first and q >= seq0:
                        first[p] = t - t0
                if time.monotonic() - t0 > 60:
                    raise SystemExit(f"no acknowledgement within 60 s of the kill: {first}")
                time.sleep(0.01)
            times[kind].append(max(first.values()))
            deadline = time.monotonic() + 5
            while not advertised and time.monotonic() < deadline:
                time.sleep(0.01)
            adv[kind].append(advertised[0] if advertised else float("nan"))
            role = "controller" if victim.id == ctl else "non-controller"
            at = time.strftime("%H:%M:%S", time.gmtime(wall0)) + f".{int(wall0 % 1 * 1000):03d}Z"
            print(f"{kind} run {run + 1}: killed broker {victim.id} at {at} ({role}, leader of "
                  f"{', '.join(f'p{p}' for p in parts)}): first ack on every one after "
                  f"{times[kind][-1]:.3f} s ({', '.join(f'p{p} {first[p]:.3f}' for p in parts)}); "
                  f"new leaders advertised after {adv[kind][-1]:.3f} s",
                  flush=True)
            victim.start()
            victim.wait_ready()
            wait_whole(brokers, topic)
        # Rolling restart
        time.sleep(1.0)
        t_roll = time.monotonic()
        codes = []
        for b in [] if a.no_rolling else brokers:
            b.proc.send_signal(signal.SIGTERM)
            codes.append(b.proc.wait(60))
            b.start()
            b.wait_ready()
            wait_whole(brokers, topic)
        time.sleep(1.0)
        stall = 0.0
        for part in range(PARTS):
            roll = [t for t, p, _ in load.acks if t >= t_roll and p == part]
            stall = max(stall, max((y - x for x, y in zip(roll, roll[1:])), default=0.0))
    finally:
        load.stop.set()
        load.t.join(150)
    lost, acked = verify(brokers, topic, load)
    for b in brokers:
        b.proc.send_signal(signal.SIGTERM)
    for b in brokers:
        b.proc.wait(60)
    print()
    print(f"broker args: {a.broker_args or '(defaults: --lease-ms 3000 --lease-grace-ms 1000 --heartbeat-ms 500 --poll-ms 100)'}")
    lease, grace = _flag(a.broker_args, "--lease-ms", 3000), _flag(a.broker_args, "--lease-grace-ms", 1000)
    targets = {"leader": (lease + grace) / 1000 + 0.5, "controller": 5.0}
    missed = False
    for kind, ts in times.items():
        missed |= max(ts) > targets[kind]
        what = "controller" if kind == "controller" else "non-controller leader"
        med = statistics.median(ts)
        print(f"failover of a {what} (kill -9 -> first ack on every partition it led), {len(ts)} runs: "
              f"median {med:.3f} s, max {max(ts):.3f} s, min {min(ts):.3f} s "
              f"(target {targets[kind]:.1f} s: median {'met' if med <= targets[kind] else 'MISSED'}, "
              f"max {'met' if max(ts) <= targets[kind] else 'MISSED'})")
        seen = [x for x in adv[kind] if x == x]
        if seen:
            print(f"  of which kill -9 -> new live leader advertised for all of them: "
                  f"median {statistics.median(seen):.3f} s, max {max(seen):.3f} s; the rest is "
                  f"the client finding it (median {statistics.median(t - x for t, x in zip(ts, adv[kind]) if x == x):.3f} s)")
    if not a.no_rolling:
        print(f"rolling restart (SIGTERM x3): max produce stall {stall:.3f} s; exit codes {codes}")
    print(f"acknowledged {acked} records, lost {lost}; producer errors {len(load.errors)}")
    if missed or lost or a.keep:
        # The brokers' logs (appended across restarts) are the only record
        # of why a run was slow: keep them.
        print(f"{'a run missed its target: ' if missed or lost else ''}logs and data kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if lost or load.errors else 0


if __name__ == "__main__":
    sys.exit(main())
