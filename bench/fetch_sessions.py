#!/usr/bin/env python3
"""Steady-state Fetch sizes of a consumer of many partitions, with and
without a KIP-227 incremental fetch session (raw Fetch v7 on loopback).

Starts a broker on a fresh data directory (or uses --bootstrap), creates a
topic of --partitions partitions, writes one record to each, then, as a
consumer caught up on every partition would:
  * sessionless: a full Fetch of every partition (epoch -1), request and
    response bytes;
  * session: the full Fetch that opens a session (epoch 0), then
    incremental Fetches with nothing new (epoch 1, 2, ...), request and
    response bytes.
Prints one FETCHSIZES line. Bounded by timeouts; loopback only.

Usage: bench/fetch_sessions.py [--bin target/release/kaas] [--partitions 10000]
"""

import argparse
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "e2e"))
import kafka_wire as w  # noqa: E402


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def fetch(sock, cid, sid, epoch, topic, parts, max_wait_ms=0):
    body = (w.i32(-1) + w.i32(max_wait_ms) + w.i32(1) + w.i32(50 << 20) + w.i8(0)
            + w.i32(sid) + w.i32(epoch))
    if parts:
        ps = b"".join(w.i32(p) + w.i64(off) + w.i64(-1) + w.i32(1 << 20) for p, off in parts)
        body += w.i32(1) + w.string(topic) + w.i32(len(parts)) + ps
    else:
        body += w.i32(0)
    body += w.i32(0)
    req = w.request_header(1, 7, cid) + body
    resp = w.roundtrip(sock, req)
    r = w.Reader(resp)
    assert r.i32() == cid
    r.i32()
    err = r.i16()
    new_sid = r.i32()
    return len(req) + 4, len(resp) + 4, err, new_sid


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/kaas")
    ap.add_argument("--partitions", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    d = tempfile.mkdtemp(prefix="kaas-fs-")
    port, mport = free_port(), free_port()
    proc = subprocess.Popen([a.bin, "broker", "--data-dir", d, "--listen", f"127.0.0.1:{port}",
                             "--metrics-listen", f"127.0.0.1:{mport}"],
                            stdout=open(os.path.join(d, "log"), "w"), stderr=subprocess.STDOUT)
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
        topic = "fs"
        admin = AdminClient({"bootstrap.servers": boot})
        admin.create_topics([NewTopic(topic, a.partitions, 1)], operation_timeout=120)[topic].result(180)
        p = Producer({"bootstrap.servers": boot, "linger.ms": 50})
        deadline = time.monotonic() + 180
        for i in range(a.partitions):
            p.produce(topic, value=b"x", partition=i)
            p.poll(0)
        assert p.flush(180) == 0
        parts = [(i, 1) for i in range(a.partitions)]  # caught up: offset 1 = hw
        with w.connect(("127.0.0.1", port), timeout=120) as s:
            full = [fetch(s, 1 + i, 0, -1, topic, parts)[:2] for i in range(a.rounds)]
            q0, r0, err, sid = fetch(s, 100, 0, 0, topic, parts)
            assert err == 0 and sid != 0, (err, sid)
            inc = []
            for e in range(1, a.rounds + 1):
                q, r, err, _ = fetch(s, 100 + e, sid, e, topic, [])
                assert err == 0, err
                inc.append((q, r))
        med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
        print(f"FETCHSIZES partitions={a.partitions} "
              f"sessionless_request={med([x[0] for x in full])} sessionless_response={med([x[1] for x in full])} "
              f"open_request={q0} open_response={r0} "
              f"incremental_request={med([x[0] for x in inc])} incremental_response={med([x[1] for x in inc])}")
    finally:
        proc.terminate()
        proc.wait(30)
        subprocess.run(["rm", "-rf", d])


if __name__ == "__main__":
    main()
