#!/usr/bin/env python3
"""A/B transactions/s of several broker binaries, in one run.

The machine is shared and noisy, so binaries are compared as ratios of
medians measured in the same run, with the order rotated every round.

Usage:
  bench/txn_ab.py --rounds 5 --producers 8 base=/tmp/kaas-old new=target/release/kaas
  bench/txn_ab.py --rounds 5 --producers 1,4,8,16 new=target/release/kaas
  bench/txn_ab.py --from-log out.txt     # the summary of an earlier run's lines

Each run: a fresh data directory, one broker on free 127.0.0.1 ports, a
1-partition topic (--partitions), then bench/transactions.py (100 records
of 100 B per transaction, `--txns` transactions across the producers).
Alongside, from the broker's /metrics before and after: fsyncs per
transaction (kaas_fsyncs_total) and the messages the transaction
coordinator and the partition leaders handled per transaction; and the
broker's CPU time per transaction (utime + stime, /proc/<pid>/stat). Prints one
line per run, then per (producers, binary) the medians and their ratio to
the first binary. Loopback only; every run is bounded by a timeout.
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
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        k, v = line.rsplit(" ", 1)
        try:
            out[k] = float(v)
        except ValueError:
            pass
    return out


def cpu_seconds(pid):
    """utime + stime of a process, seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def per_txn(before, after, n):
    """fsyncs and coordinator/leader messages per transaction."""
    def d(k):
        return after.get(k, 0.0) - before.get(k, 0.0)
    out = {"fsyncs": d("kaas_fsyncs_total") / max(n, 1)}
    for k in after:
        m = re.match(r'kaas_actor_messages_total\{kind="(txn_coordinator|partition_leader)",message="([^"]+)"\}', k)
        if m and d(k) > 0:
            out[f"{m.group(1)[:4]}.{m.group(2)}"] = d(k) / max(n, 1)
    return out


@contextlib.contextmanager
def broker(binary, keep_logs):
    d = tempfile.mkdtemp(prefix="txnab.")
    port, mport = free_port(), free_port()
    log = open(os.path.join(d, "broker.log"), "w")
    p = subprocess.Popen(
        [binary, "broker", "--data-dir", os.path.join(d, "data"),
         "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{mport}",
         "--broker-id", "0"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                metrics(mport)
                break
            except OSError:
                time.sleep(0.2)
        yield port, mport, p.pid
    finally:
        p.terminate()
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()
        if not keep_logs:
            shutil.rmtree(d, ignore_errors=True)


def create_topic(port, topic, partitions):
    from confluent_kafka.admin import AdminClient, NewTopic
    a = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "broker.address.family": "v4"})
    a.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def run_one(binary, producers, a, tag):
    with broker(binary, a.keep_logs) as (port, mport, pid):
        topic = f"txab-{tag}"
        create_topic(port, topic, a.partitions)
        before = metrics(mport)
        cpu0 = cpu_seconds(pid)
        cmd = [sys.executable, os.path.join(HERE, "transactions.py"),
               "--bootstrap", f"127.0.0.1:{port}", "--topic", topic,
               "--txns", str(a.txns), "--producers", str(producers),
               "--partitions", str(a.partitions)]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout).stdout
        except subprocess.TimeoutExpired:
            return None
        after = metrics(mport)
        cpu = cpu_seconds(pid) - cpu0
        line = [x for x in out.splitlines() if x.startswith("TXNS ")]
        errors = [x for x in out.splitlines() if x.startswith("producer error")]
        if not line:
            print(f"  no result: {out[-500:]}", flush=True)
            return None
        r = dict(kv.split("=") for kv in line[0].split()[1:])
        res = {k: float(v) for k, v in r.items()}
        res["errors"] = len(errors)
        res["per_txn"] = per_txn(before, after, int(res["n"]))
        # The read_committed check runs inside this window too (one fetch
        # pass of the records, small next to the transactions).
        res["per_txn"]["broker_cpu_ms"] = cpu * 1000 / max(res["n"], 1)
        return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--producers", default="8", help="comma-separated list")
    ap.add_argument("--txns", type=int, default=2000)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--keep-logs", action="store_true")
    ap.add_argument("--from-log", help="summarize the per-run lines of an earlier run's output")
    ap.add_argument("binaries", nargs="*", help="name=path")
    a = ap.parse_args()
    if a.from_log:
        from_log(a.from_log)
        return
    bins = [b.split("=", 1) for b in a.binaries]
    plist = [int(x) for x in a.producers.split(",")]
    results = {}  # (producers, name) -> [res]
    for rnd in range(a.rounds):
        for producers in plist:
            order = bins[rnd % len(bins):] + bins[:rnd % len(bins)]
            for name, path in order:
                load = open("/proc/loadavg").read().split()[0]
                try:
                    r = run_one(path, producers, a, f"{rnd}-{producers}-{name}")
                except Exception as e:  # noqa: BLE001 - a failed run (e.g. a lease lapse under load) is reported, not fatal
                    print(f"round={rnd} producers={producers} {name}: error {e!r}", flush=True)
                    r = None
                if r is None:
                    print(f"round={rnd} producers={producers} {name}: failed", flush=True)
                    continue
                results.setdefault((producers, name), []).append(r)
                pt = " ".join(f"{k}={v:.2f}" for k, v in sorted(r["per_txn"].items()))
                print(f"round={rnd} producers={producers} {name}: txn/s={r['txn_per_s']:.0f} "
                      f"p50={r['commit_p50_ms']:.2f} p99={r['commit_p99_ms']:.2f} "
                      f"seen={r['seen']:.0f}/{r['n'] * 100:.0f} errors={r['errors']} "
                      f"load={load} | per txn: {pt}", flush=True)
    summary(plist, [n for n, _ in bins], results)


def from_log(path):
    """Re-read the per-run lines of an earlier (possibly interrupted) run."""
    results, plist, names = {}, [], []
    pat = re.compile(r"round=\d+ producers=(\d+) (\S+): txn/s=(\d+) p50=([\d.]+) p99=([\d.]+) .*"
                     r"broker_cpu_ms=([\d.]+) fsyncs=([\d.]+)")
    for line in open(path):
        m = pat.match(line)
        if not m:
            continue
        producers, name = int(m.group(1)), m.group(2)
        if producers not in plist:
            plist.append(producers)
        if name not in names:
            names.append(name)
        results.setdefault((producers, name), []).append({
            "txn_per_s": float(m.group(3)), "commit_p50_ms": float(m.group(4)),
            "commit_p99_ms": float(m.group(5)),
            "per_txn": {"broker_cpu_ms": float(m.group(6)), "fsyncs": float(m.group(7))}})
    summary(plist, names, results)


def summary(plist, names, results):
    print()
    print("producers binary runs median_txn/s median_p50_ms median_p99_ms "
          "median_fsyncs/txn median_cpu_ms/txn ratio_txn/s ratio_p99 ratio_cpu")
    for producers in plist:
        base = None
        for name in names:
            rs = results.get((producers, name), [])
            if not rs:
                continue
            tps = statistics.median(r["txn_per_s"] for r in rs)
            p50 = statistics.median(r["commit_p50_ms"] for r in rs)
            p99 = statistics.median(r["commit_p99_ms"] for r in rs)
            fs = statistics.median(r["per_txn"]["fsyncs"] for r in rs)
            cpu = statistics.median(r["per_txn"]["broker_cpu_ms"] for r in rs)
            if base is None:
                base = (tps, p99, cpu)
            runs = "/".join(f"{r['txn_per_s']:.0f}" for r in rs)
            print(f"{producers} {name} {runs} {tps:.0f} {p50:.2f} {p99:.2f} {fs:.2f} {cpu:.3f} "
                  f"{tps / base[0]:.2f} {p99 / base[1]:.2f} {cpu / base[2]:.2f}")


if __name__ == "__main__":
    main()
