#!/usr/bin/env python3
"""kaas on three substrates side by side: a local directory, GlusterFS, CephFS
(loopback only).

For each substrate in --substrates, one after the other:

1. Bring it up. local: a temp directory. glusterfs / cephfs: a throw-away
   volume started by tests/substrates/<name>.sh `up` into a temp STATE, and
   three FUSE clients of it (`mount`; each client is a "host"). A 3-broker
   cluster whose broker i keeps its data in <client i>/bench/data: the same
   directory of the volume, each broker through its own client (local: one
   directory for all three).
2. Produce throughput: one confluent-kafka Producer (acks=all, linger.ms=5)
   sends --records records of 100 bytes, round-robin over a 6-partition
   topic, after a warm-up record per partition (metadata and connections);
   records/s from the first produce() to the end of flush(). Consume
   throughput: one Consumer reads them back from offset 0; records/s from
   the first record to the last (the client's start-up, from assign() to
   the first record, is left out and logged: it would swamp a small run);
   every acknowledged record must be read.
3. Ack latency: bench/latency.py (a subprocess) paces one record every 5 ms
   (200/s, linger.ms=0, acks=all) over the 6 partitions for --seconds;
   p50/p99 of produce() -> delivery callback, and of produce -> consume.
4. Failover: bench/failover.py (a subprocess) on a fresh directory of the
   same volume, one per client (--data-dirs <client i>/bench/failover/data):
   kill -9 of a non-controller leader and of the controller, --runs times
   each; kill -> first ack, on every partition the victim led, of a record
   sent after the kill; median/max. Then its rolling restart (SIGTERM each
   broker in turn): the longest gap between acks within one partition. Every
   acknowledged record is read back; the lost count is reported.
5. Tear down, also on error or Ctrl-C: brokers SIGTERM, then SIGKILL after
   20 s (and any broker failover.py left behind, found by its process
   group); `down` of the volume (unmounts every client, stops every daemon,
   removes STATE with the volume's data).

A substrate that cannot be brought up (tools missing, GlusterFS's port 24007
taken by another volume) gets an "error" column with the reason; the others
still run. A CephFS whose default ports (3300, 6800-6899) are taken, e.g. by
a pytest session's volume, is given free ones. Prints one markdown table
(rows = figures, columns = substrates), the command line, the date, and what
bounds each figure.

Broker logs go to the temp dir; it is removed at the end unless --keep, or a
substrate failed, lost records or missed a failover target (then its path
is printed). The real volumes are always taken down (--keep cannot keep
them).

The substrate scripts' environment knobs pass through (KAAS_GLUSTER_*,
KAAS_CEPH_MON_PORT, KAAS_CEPH_PORTS, ...). Needs root and /dev/fuse for the
real substrates, target/release/kaas (or $KAAS_BIN).

Usage: python3 bench/substrates.py [--substrates local,glusterfs,cephfs] [--records 100000]
                                   [--seconds 8] [--runs 2] [--broker-args "--lease-ms 3000"]
                                   [--keep]
Smoke:  python3 bench/substrates.py --records 2000 --seconds 2 --runs 1
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shlex
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from failover import PARTS, Broker, wait_whole  # noqa: E402

ROOT = BENCH.parent
KNOWN = ("local", "glusterfs", "cephfs")
REAL = ("glusterfs", "cephfs")
SIZE = 100  # record value bytes
LAT_RATE = 200  # records/s of the paced ack-latency run: one every 5 ms
WARM = struct.pack(">Q", 2**64 - 1)  # sequence number of a warm-up record


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------- substrates


class Volume:
    """A real volume through tests/substrates/<kind>.sh (as RealVolume in
    tests/e2e/conftest.py does)."""

    def __init__(self, kind: str, root: Path):
        self.kind = kind
        self.state = root / "state"
        self.script = ROOT / "tests" / "substrates" / f"{kind}.sh"
        self.started = False
        self._env = self.env()  # the same ports for up, mount and down

    def run(self, *args: str, timeout: float) -> None:
        try:
            r = subprocess.run(["bash", str(self.script), *args], capture_output=True, text=True,
                               timeout=timeout, stdin=subprocess.DEVNULL, env=self._env)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"`{self.script.name} {args[0]}` did not finish within {timeout:.0f} s")
        if r.returncode != 0:
            tail = " | ".join((r.stdout + r.stderr).strip().splitlines()[-6:])
            raise RuntimeError(f"`{self.script.name} {args[0]}` exited {r.returncode}: {tail}")

    def up(self) -> None:
        self.started = True  # `down` even after a failed `up`: it cleans whatever is left
        self.run("up", str(self.state), timeout=240)

    def env(self) -> dict[str, str]:
        """The script's environment. A CephFS whose default ports are taken
        (e.g. by a pytest session's volume) gets free ones, unless the
        KAAS_CEPH_* knobs are set. (GlusterFS cannot move: its bricks always
        fetch their volfile from port 24007.)"""
        env = dict(os.environ)
        if self.kind == "cephfs" and not any(k in env for k in ("KAAS_CEPH_MON_PORT", "KAAS_CEPH_PORTS")):
            if not port_free(3300) or not all(port_free(q) for q in range(6800, 6900)):
                mon = next(q for q in range(3301, 3400) if port_free(q))
                lo = next(lo for lo in range(6900, 9900, 100)
                          if all(port_free(q) for q in range(lo, lo + 100)))
                env.update(KAAS_CEPH_MON_PORT=str(mon), KAAS_CEPH_PORTS=f"{lo}-{lo + 99}")
                log(f"cephfs: default ports taken; using mon port {mon}, daemons {lo}-{lo + 99}")
        return env

    def mount(self, mnt: Path) -> None:
        self.run("mount", str(self.state), str(mnt), timeout=120)

    def down(self) -> None:
        if self.started:
            self.started = False
            self.run("down", str(self.state), timeout=240)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def mkdirs(*dirs: Path) -> None:
    """mkdir -p, bounded (a hung FUSE client must not hang the bench)."""
    for d in dirs:
        r = subprocess.run(["timeout", "30", "mkdir", "-p", str(d)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"mkdir -p {d}: exit {r.returncode} {r.stderr.strip()}")


def mounts_under(root: Path) -> list[str]:
    pre = str(root).rstrip("/") + "/"
    with open("/proc/self/mountinfo") as f:
        return [ln.split()[4] for ln in f if ln.split()[4].startswith(pre)]


# ------------------------------------------------------------------- brokers


def start_cluster(dirs: list[Path], logs: Path, extra: list[str]) -> list[Broker]:
    brokers = [Broker(i, dirs[i], logs, extra) for i in range(3)]
    for b in brokers:
        b.start()
    for b in brokers:
        b.wait_ready()
        if not b.alive():
            raise RuntimeError(f"broker {b.id} exited during start-up (see {b.log})")
    return brokers


def stop_all(procs: list[subprocess.Popen], grace: float = 20.0) -> None:
    """SIGTERM every live one, wait up to `grace` s, SIGKILL the rest."""
    live = [p for p in procs if p is not None and p.poll() is None]
    for p in live:
        p.send_signal(signal.SIGTERM)
    end = time.monotonic() + grace
    for p in live:
        try:
            p.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def group_pids(pgid: int) -> list[int]:
    """Live processes of process group `pgid` (by /proc, exact match)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(d.name))
    return out


def kill_group(pgid: int, grace: float = 20.0) -> list[int]:
    """SIGTERM, then SIGKILL, whatever of process group `pgid` is left
    (brokers failover.py did not stop because it failed). Returns their pids."""
    left = group_pids(pgid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in group_pids(pgid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + grace
        while group_pids(pgid) and time.monotonic() < end:
            time.sleep(0.1)
    return left


def create_topics(brokers: list[Broker], names: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": ",".join(b.boot for b in brokers)})
    for f in admin.create_topics([NewTopic(n, PARTS, 1) for n in names]).values():
        f.result(30)
    for n in names:
        wait_whole(brokers, n)  # every broker leads its 2 partitions


# -------------------------------------------------------------------- phases


def produce(boot: str, topic: str, n: int) -> tuple[float, bytearray]:
    """records/s of n records; returns it and failed[i] = 1 for each record
    whose delivery failed."""
    failed = bytearray(n)
    pad = b"x" * (SIZE - 8)
    p = Producer({"bootstrap.servers": boot, "broker.address.family": "v4", "acks": "all",
                  "linger.ms": 5, "enable.idempotence": False,
                  "queue.buffering.max.messages": 1000000, "queue.buffering.max.kbytes": 1048576,
                  "message.timeout.ms": 120000})

    def cb(err, msg):
        if err is not None:
            seq = struct.unpack(">Q", msg.value()[:8])[0]
            if seq < n:
                failed[seq] = 1

    for part in range(PARTS):
        p.produce(topic, WARM + pad, partition=part)
    if p.flush(60):
        raise RuntimeError("warm-up records not acknowledged within 60 s")
    t0 = time.monotonic()
    for i in range(n):
        v = struct.pack(">Q", i) + pad
        while True:
            try:
                p.produce(topic, v, partition=i % PARTS, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.01)
        if not i & 1023:
            p.poll(0)
    if p.flush(300):
        raise RuntimeError("produce: records still unacknowledged 300 s after the last")
    dt = time.monotonic() - t0
    return n / dt, failed


def consume(boot: str, topic: str, n: int, failed: bytearray) -> tuple[float, int, float]:
    """records/s reading the topic from offset 0, how many acknowledged
    records were not read, and the seconds from assign() to the first."""
    seen = bytearray(n)
    c = Consumer({"bootstrap.servers": boot, "broker.address.family": "v4",
                  "group.id": "bench-substrates", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    t0 = time.monotonic()
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTS)])  # a fresh topic: no offset lookup
    eof: set[int] = set()
    count, t_first, t_last = 0, None, None
    end = time.monotonic() + 300
    try:
        while len(eof) < PARTS and time.monotonic() < end:
            for m in c.consume(10000, 1.0):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        eof.add(m.partition())
                    continue
                seq = struct.unpack(">Q", m.value()[:8])[0]
                if seq < n:
                    if t_first is None:
                        t_first = time.monotonic()
                    seen[seq] = 1
                    count += 1
                    t_last = time.monotonic()
    finally:
        c.close()
    lost = sum(1 for i in range(n) if not failed[i] and not seen[i])
    rate = (count - 1) / (t_last - t_first) if count > 1 and t_last > t_first else float("nan")
    return rate, lost, (t_first - t0 if t_first else float("nan"))


def latency(boot: str, topic: str, seconds: float) -> dict[str, float]:
    r = subprocess.run([sys.executable, str(BENCH / "latency.py"), "--bootstrap", boot,
                        "--topic", topic, "--rate", str(LAT_RATE), "--seconds", str(seconds),
                        "--size", str(SIZE), "--partitions", str(PARTS)],
                       capture_output=True, text=True, timeout=seconds + 150,
                       stdin=subprocess.DEVNULL)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("LATENCY ")), None)
    if r.returncode != 0 or line is None:
        tail = " | ".join((r.stdout + r.stderr).strip().splitlines()[-5:])
        raise RuntimeError(f"latency.py exited {r.returncode}: {tail}")
    return {k: float(v) for k, v in (w.split("=") for w in line.split()[1:])}


FAILOVER_RES = {
    "leader": re.compile(r"failover of a non-controller leader .*?median ([\d.]+) s, max ([\d.]+) s"),
    "controller": re.compile(r"failover of a controller .*?median ([\d.]+) s, max ([\d.]+) s"),
    "stall": re.compile(r"rolling restart .*?max produce stall ([\d.]+) s"),
    "acked": re.compile(r"acknowledged (\d+) records, lost (\d+); producer errors (\d+)"),
}


RDKAFKA_LOG = re.compile(r"%\d\|\d+\.\d+\|")


def failover(dirs: list[Path], work: Path, runs: int, broker_args: str, keep: bool,
             name: str) -> dict:
    """bench/failover.py on `dirs`; its output is echoed, its figures parsed.
    Any broker it leaves behind (it stops them only when it gets to its end)
    is found by its process group and stopped."""
    argv = [sys.executable, "-u", str(BENCH / "failover.py"), "--runs", str(runs),
            "--data-dirs", ",".join(map(str, dirs)), "--broker-args", broker_args]
    if keep:
        argv.append("--keep")
    env = dict(os.environ, BENCH_DIR=str(work))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    lines: list[str] = []

    def echo():
        for ln in proc.stdout:
            lines.append(ln.rstrip("\n"))
            if not RDKAFKA_LOG.match(ln):  # the client's connect/disconnect chatter
                print(f"  [{name} failover.py] {ln}", end="", flush=True)

    t = threading.Thread(target=echo, daemon=True)
    t.start()
    try:
        proc.wait(timeout=240 + runs * 2 * 150)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        lines.append("(failover.py killed: timed out)")
    finally:
        if proc.poll() is None:  # interrupted: stop it first, then its brokers
            proc.kill()
            proc.wait(10)
        left = kill_group(proc.pid)
        if left:
            log(f"{name}: stopped {len(left)} process(es) failover.py left behind: {left}")
        t.join(5)
    text = "\n".join(lines)
    out: dict = {"rc": proc.returncode, "missed": "MISSED" in text}
    for key, rx in FAILOVER_RES.items():
        m = rx.search(text)
        if m:
            out[key] = tuple(float(g) for g in m.groups())
    if "acked" not in out:
        tail = " | ".join(lines[-4:])
        raise RuntimeError(f"failover.py exited {proc.returncode} without its summary: {tail}")
    return out


def bench_substrate(kind: str, root: Path, a, extra: list[str]) -> dict:
    res: dict = {}
    vol = Volume(kind, root) if kind in REAL else None
    brokers: list[Broker] = []
    phase = "up"
    try:
        t0 = time.monotonic()
        if vol is None:
            mnts = [root / "vol"] * 3
        else:
            vol.up()
            mnts = [root / f"mnt{i}" for i in range(3)]
            for m in mnts:
                vol.mount(m)
        mkdirs(*{m / "bench" / "data" for m in mnts}, *{m / "bench" / "failover" / "data" for m in mnts})
        log(f"{kind}: up, 3 clients mounted, in {time.monotonic() - t0:.1f} s"
            if vol else f"{kind}: {mnts[0]}")

        phase = "cluster start"
        logs = root / "logs"
        logs.mkdir(exist_ok=True)
        brokers = start_cluster([m / "bench" / "data" for m in mnts], logs, extra)
        create_topics(brokers, ["tput", "lat"])
        boot = ",".join(b.boot for b in brokers)

        phase = "produce"
        res["produce"], failed = produce(boot, "tput", a.records)
        log(f"{kind}: produce {res['produce']:,.0f} records/s ({sum(failed)} failed)")
        phase = "consume"
        res["consume"], res["lost_tput"], first = consume(boot, "tput", a.records, failed)
        res["failed_tput"] = sum(failed)
        log(f"{kind}: consume {res['consume']:,.0f} records/s (first record {first:.2f} s after "
            f"assign()); acknowledged but not read: {res['lost_tput']}")

        phase = "latency"
        res["lat"] = latency(boot, "lat", a.seconds)
        log(f"{kind}: ack p50 {res['lat']['ack_p50_ms']:.2f} ms, p99 {res['lat']['ack_p99_ms']:.2f} ms")

        phase = "cluster stop"
        stop_all([b.proc for b in brokers])
        codes = [b.proc.returncode for b in brokers]
        brokers = []
        if any(codes):
            log(f"{kind}: broker exit codes after SIGTERM {codes}")

        phase = "failover"
        res["failover"] = failover([m / "bench" / "failover" / "data" for m in mnts], root,
                                   a.runs, a.broker_args, a.keep, kind)
    except (Exception, SystemExit, KeyboardInterrupt) as e:
        res["error"] = f"{phase}: {type(e).__name__}: {e}".replace("\n", " ")
        log(f"{kind}: FAILED in {res['error']}")
        if isinstance(e, KeyboardInterrupt):
            res["interrupted"] = True
    finally:
        stop_all([b.proc for b in brokers])
        if vol is not None:
            t1 = time.monotonic()
            try:
                vol.down()
                log(f"{kind}: down in {time.monotonic() - t1:.1f} s")
            except Exception as e:
                res["error"] = (res.get("error", "") + f"; down: {e}").lstrip("; ")
                log(f"{kind}: down FAILED: {e}")
    return res


# -------------------------------------------------------------------- report


def cells(res: dict) -> dict[str, str]:
    def pair(x, fmt="{:.2f}"):
        return " / ".join(fmt.format(v) for v in x) if x else "n/a"

    if "produce" not in res:
        return {}
    lat = res.get("lat", {})
    fo = res.get("failover", {})
    c = {
        "produce rec/s": f"{res['produce']:,.0f}",
        "consume rec/s": f"{res['consume']:,.0f}" if "consume" in res else "n/a",
        "ack latency p50 / p99 ms": pair((lat["ack_p50_ms"], lat["ack_p99_ms"])) if lat else "n/a",
        "produce->consume p50 / p99 ms": pair((lat["e2e_p50_ms"], lat["e2e_p99_ms"])) if lat else "n/a",
        "failover, non-controller leader, median / max s": pair(fo.get("leader")),
        "failover, controller, median / max s": pair(fo.get("controller")),
        "rolling restart max stall s": f"{fo['stall'][0]:.2f}" if "stall" in fo else "n/a",
    }
    lost = [f"{res['lost_tput']} of {res['produce_n'] - res['failed_tput']}"] if "lost_tput" in res else []
    if "acked" in fo:
        acked, lost_fo, errs = (int(x) for x in fo["acked"])
        lost.append(f"{lost_fo} of {acked}" + (f" ({errs} producer errors)" if errs else ""))
    c["lost acked records (throughput; failover)"] = "; ".join(lost) or "n/a"
    return c


ROWS = ["produce rec/s", "consume rec/s", "ack latency p50 / p99 ms", "produce->consume p50 / p99 ms",
        "failover, non-controller leader, median / max s", "failover, controller, median / max s",
        "rolling restart max stall s", "lost acked records (throughput; failover)"]


def report(results: dict[str, dict], a) -> None:
    names = list(results)
    table = {k: cells(v) for k, v in results.items()}
    print()
    print("| figure | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for row in ROWS:
        vals = [table[n].get(row, "error" if "error" in results[n] else "n/a") for n in names]
        print(f"| {row} | " + " | ".join(vals) + " |")
    print()
    for n in names:
        if "error" in results[n]:
            print(f"- {n}: error: {results[n]['error']}")
        fo = results[n].get("failover", {})
        if fo.get("missed"):
            print(f"- {n}: failover.py: a run missed its target (non-controller: lease + grace "
                  f"+ 0.5 s; controller: 5 s)")
        if fo.get("rc"):
            print(f"- {n}: failover.py exited {fo['rc']} (lost records, producer errors or a "
                  f"missed target: see its output above)")
    print()
    print("command: " + shlex.join([sys.executable, *sys.argv]))
    print("date: " + datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"))
    print(f"broker args: {a.broker_args or '(defaults: --lease-ms 3000 --lease-grace-ms 1000 --heartbeat-ms 500)'}; "
          f"{a.records} records of {SIZE} B; ack latency {LAT_RATE}/s for {a.seconds} s; "
          f"failover {a.runs} run(s) per kind; {os.cpu_count()} cores")
    print("""
What bounds each figure (everything shares this machine's cores: one Python
client, 3 brokers, and for the real substrates their daemons - glusterd and a
brick, or a mon, mgr, OSD and MDS - and 3 FUSE clients):
- produce rec/s: client-bound. One Python thread calls produce() and a
  delivery callback per record; it competes for the cores with the brokers
  and the filesystem daemons. A floor for the broker, not its ceiling (bench/run.sh
  measures the broker with rdkafka_performance). The gap between columns is
  the CPU and round trips the substrate takes away from the client.
- consume rec/s: client-bound the same way (Python decodes each record);
  with few records it is noise (they arrive in a few fetches).
- ack latency: the broker's durable-append path on the substrate (write +
  fsync through a FUSE client to the brick/OSD) at a light load (200/s), plus
  the client round trip; p99 shows the substrate's slow operations.
- produce->consume: ack path plus the fetch long-poll wake-up.
- failover: lease-bound (a non-controller leader: lease + grace, then the
  re-grant; the controller: the same, then the successor's election), plus
  librdkafka's 1 s metadata refresh to find the new leader; the substrate
  adds the latency of the heartbeat/assignment file operations.
- rolling restart stall: controlled shutdown hand-off plus the client's
  discovery of the new leader.
- lost: counted, not assumed: every acknowledged record is read back.""")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--substrates", default=",".join(KNOWN),
                    help="comma-separated, of local, glusterfs, cephfs (default: all three)")
    ap.add_argument("--records", type=int, default=100000, help="records of the throughput runs")
    ap.add_argument("--seconds", type=float, default=8.0, help="length of the ack-latency run")
    ap.add_argument("--runs", type=int, default=2, help="failover runs per kind of victim")
    ap.add_argument("--broker-args", default="", help="extra args to every broker (shlex-split)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the temp dir (broker logs; the local substrate's data)")
    a = ap.parse_args()
    subs = [s.strip() for s in a.substrates.split(",") if s.strip()]
    bad = [s for s in subs if s not in KNOWN]
    if bad or not subs:
        ap.error(f"unknown substrate(s) {bad}; known: {', '.join(KNOWN)}")
    if a.records < 1 or a.runs < 1 or a.seconds <= 0:
        ap.error("--records and --runs must be >= 1, --seconds > 0")
    extra = shlex.split(a.broker_args)
    binary = Path(os.environ.get("KAAS_BIN", ROOT / "target/release/kaas"))
    if not binary.exists():
        ap.error(f"{binary} does not exist (cargo build --release, or set KAAS_BIN)")

    # SIGTERM as Ctrl-C: the teardown in `finally` still runs.
    def on_term(*_):
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, on_term)
    tmp = Path(tempfile.mkdtemp(prefix="kaas-substrates-"))
    log(f"temp dir {tmp}")
    results: dict[str, dict] = {}
    try:
        for kind in subs:
            root = tmp / kind
            root.mkdir()
            log(f"== {kind}")
            results[kind] = bench_substrate(kind, root, a, extra)
            results[kind]["produce_n"] = a.records
            if results[kind].get("interrupted"):
                break
    finally:
        left = mounts_under(tmp)
        trouble = any("error" in r or r.get("lost_tput") or r.get("failover", {}).get("rc")
                      or r.get("failover", {}).get("missed") for r in results.values())
        if left:
            print(f"STILL MOUNTED under {tmp}: {left}; not removing it", file=sys.stderr)
        elif a.keep or trouble:
            log(f"kept {tmp}")
        else:
            subprocess.run(["timeout", "120", "rm", "-rf", "--one-file-system", str(tmp)])
    report(results, a)
    bad_run = any("error" in r or r.get("lost_tput") or r.get("failover", {}).get("rc")
                  for r in results.values())
    return 1 if bad_run or len(results) < len(subs) else 0


if __name__ == "__main__":
    sys.exit(main())
