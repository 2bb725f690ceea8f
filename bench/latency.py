#!/usr/bin/env python3
"""Produce -> consume latency at a fixed, moderate rate (confluent-kafka).

A producer thread sends `--rate` records/s for `--seconds` (acks=all), each
value carrying its wall-clock send time in ns; a consumer in the same process
(assigned to every partition at the end offset) records receive time - send
time. Also records the producer's ack latency (send -> delivery report).

Prints one machine-readable line at the end:
  LATENCY e2e_p50_ms=.. e2e_p99_ms=.. e2e_max_ms=.. ack_p50_ms=.. ack_p99_ms=.. n=.. lost=..

Usage: bench/latency.py --bootstrap 127.0.0.1:9092 --topic lat [--rate 1000]
       [--seconds 10] [--size 100] [--partitions 1]
"""

import argparse
import struct
import sys
import threading
import time

from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition


def pct(sorted_vals, q):
    if not sorted_vals:
        return float("nan")
    i = min(len(sorted_vals) - 1, max(0, int(round(q / 100.0 * (len(sorted_vals) - 1)))))
    return sorted_vals[i]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--rate", type=int, default=1000, help="records per second")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--size", type=int, default=100, help="value bytes (>= 16)")
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--acks", default="all", help="all or 1")
    ap.add_argument("-X", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                    help="extra producer setting (default: the client's defaults)")
    a = ap.parse_args()
    if not a.bootstrap.startswith(("127.", "localhost")):
        sys.exit("refusing a non-loopback bootstrap address")

    common = {"bootstrap.servers": a.bootstrap, "broker.address.family": "v4"}
    cons = Consumer({**common, "group.id": "bench-latency", "enable.auto.commit": False,
                     "fetch.wait.max.ms": 5, "fetch.min.bytes": 1})
    tps = [TopicPartition(a.topic, p, OFFSET_END) for p in range(a.partitions)]
    cons.assign(tps)
    # make sure the consumer has resolved its start offsets before producing
    for p in range(a.partitions):
        cons.get_watermark_offsets(TopicPartition(a.topic, p), timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        cons.poll(0.1)
        try:
            if all(tp.offset >= 0 for tp in cons.position(tps)):
                break
        except Exception:
            pass

    extra = dict(kv.split("=", 1) for kv in a.extra)
    prod = Producer({**common, "acks": a.acks, "linger.ms": 0, "enable.idempotence": False, **extra})
    total = int(a.rate * a.seconds)
    ack_lat = []
    e2e_lat = []
    pad = b"x" * max(0, a.size - 16)
    done_producing = threading.Event()

    def on_delivery(err, msg):
        if err is None:
            sent = struct.unpack(">Q", msg.value()[:8])[0]
            if sent:  # 0: a warm-up record
                ack_lat.append((time.time_ns() - sent) / 1e6)

    def consume():
        seen = 0
        stop_at = None
        while True:
            # One message per call: consume(num_messages=N) would hold each
            # message until N arrive or the timeout ends, adding its own delay.
            m = cons.poll(0.05)
            if m is not None and not m.error():
                now = time.time_ns()
                sent = struct.unpack(">Q", m.value()[:8])[0]
                if not sent:
                    continue
                e2e_lat.append((now - sent) / 1e6)
                seen += 1
            if seen >= total:
                return
            if done_producing.is_set():
                stop_at = stop_at or time.monotonic() + 10
                if time.monotonic() > stop_at:
                    return

    # Warm up: the first records of a new producer wait in its queue until it
    # has bootstrapped, fetched metadata and connected to the leader (50-100 ms
    # here, librdkafka's int_latency) — client start-up, not produce latency.
    for i in range(max(10, a.partitions)):
        prod.produce(a.topic, value=struct.pack(">QQ", 0, 0) + pad,
                     partition=i % a.partitions, on_delivery=on_delivery)
    if prod.flush(30):
        sys.exit("warm-up records not delivered")
    t = threading.Thread(target=consume, daemon=True)
    t.start()
    interval = 1.0 / a.rate
    start = time.monotonic()
    for i in range(total):
        target = start + i * interval
        while True:
            now = time.monotonic()
            if now >= target:
                break
            prod.poll(min(target - now, 0.001))
        prod.produce(a.topic, value=struct.pack(">QQ", time.time_ns(), i) + pad,
                     partition=i % a.partitions, on_delivery=on_delivery)
        prod.poll(0)
    prod.flush(30)
    done_producing.set()
    t.join(40)
    cons.close()

    e2e = sorted(e2e_lat)
    ack = sorted(ack_lat)
    print(f"LATENCY e2e_p50_ms={pct(e2e, 50):.2f} e2e_p99_ms={pct(e2e, 99):.2f} "
          f"e2e_max_ms={(e2e[-1] if e2e else float('nan')):.2f} "
          f"ack_p50_ms={pct(ack, 50):.2f} ack_p99_ms={pct(ack, 99):.2f} "
          f"n={len(e2e)} lost={total - len(e2e)} rate={a.rate}")


if __name__ == "__main__":
    main()
