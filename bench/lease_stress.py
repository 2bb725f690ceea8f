#!/usr/bin/env python3
"""Heartbeat latency under data-plane stress (issue 13): what the lease
must out-last.

Starts one broker with the default lease (3 s) and heartbeat on a fresh
data directory, keeps an acks=all producer running on 8 partitions, and
runs one phase per load — idle, a CPU hog (2 busy processes per core), an
fsync storm on the data volume (2 writers fdatasyncing 1 MiB blocks), a
connection flood (600 idle connections under a 512-descriptor limit), and
all of them at once — reading `kaas_heartbeat_seconds` before and after
each. Prints one LEASESTRESS line per phase: heartbeat p50/p99/max as
bucket upper bounds, heartbeat failures (late or failed: each would risk
the lease), lease lapses in the log, and produce acks/s.

Usage: bench/lease_stress.py [--bin target/release/kaas] [--seconds 20]
"""

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "e2e"))
from stressors import (connection_flood, cpu_hog, fsync_storm,  # noqa: E402
                       heartbeat_histogram, quantile_bound)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/kaas")
    ap.add_argument("--seconds", type=float, default=20)
    a = ap.parse_args()
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    d = Path(tempfile.mkdtemp(prefix="kaas-ls-"))
    data = d / "data"
    port, mport = free_port(), free_port()
    log = open(d / "log", "w")
    proc = subprocess.Popen(["prlimit", "--nofile=512:512", "--", a.bin, "broker", "--data-dir", str(data),
                             "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{mport}"],
                            stdout=log, stderr=subprocess.STDOUT)

    def metrics():
        with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10) as r:
            return r.read().decode()

    try:
        boot = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.3).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "broker did not start"
                time.sleep(0.1)
        admin = AdminClient({"bootstrap.servers": boot})
        admin.create_topics([NewTopic("ls", 8, 1)], operation_timeout=30)["ls"].result(60)
        phases = {
            "idle": lambda: contextlib.nullcontext(),
            "cpu_hog": lambda: cpu_hog(),
            "fsync_storm": lambda: fsync_storm(d / "storm"),
            "conn_flood": lambda: connection_flood(("127.0.0.1", port), 600),
            "all": lambda: contextlib.ExitStack(),
        }
        for name, make in phases.items():
            acked = [0]

            def cb(err, _msg):
                if not err:
                    acked[0] += 1

            p = Producer({"bootstrap.servers": boot, "acks": "all", "linger.ms": 5})
            before, f0 = heartbeat_histogram(metrics())
            lapses0 = (d / "log").read_text().count("lease lapsed")
            with make() as stack:
                if name == "all":
                    stack.enter_context(cpu_hog())
                    stack.enter_context(fsync_storm(d / "storm"))
                    stack.enter_context(connection_flood(("127.0.0.1", port), 600))
                t0 = time.monotonic()
                i = 0
                while time.monotonic() - t0 < a.seconds:
                    p.produce("ls", value=b"x" * 100, partition=i % 8, on_delivery=cb)
                    i += 1
                    p.poll(0.001)
                p.flush(60)
                took = time.monotonic() - t0
            after, f1 = heartbeat_histogram(metrics())
            lapses = (d / "log").read_text().count("lease lapsed") - lapses0
            q = lambda x: quantile_bound(before, after, x)  # noqa: E731
            print(f"LEASESTRESS phase={name} seconds={a.seconds:g} heartbeat_p50_le={q(0.5)} "
                  f"heartbeat_p99_le={q(0.99)} heartbeat_max_le={q(1.0)} heartbeat_failures={f1 - f0} "
                  f"lapses={lapses} acks_per_s={acked[0] / took:.0f}", flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
        subprocess.run(["rm", "-rf", str(d)])


if __name__ == "__main__":
    main()
