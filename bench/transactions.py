#!/usr/bin/env python3
"""Transactions per second at a fixed batch per transaction (confluent-kafka).

`--producers` transactional producers (one thread each, own transactional.id;
librdkafka releases the GIL in its blocking calls) run `--txns` transactions
in all, of `--records` records of `--size` bytes each (begin, produce,
commit_transaction) to a topic of `--partitions` partitions, and time each
commit_transaction (EndTxn plus the flush before it: the client's view of a
commit). One producer is strictly sequential (about five round trips per
transaction), so aggregate throughput needs several. A read_committed consumer
then counts what it sees (must be txns * records).

Prints one machine-readable line at the end:
  TXNS txn_per_s=.. records_per_s=.. commit_p50_ms=.. commit_p99_ms=.. n=.. seen=..

Needs both halves of transactions (coordinator and partition side).
Usage: bench/transactions.py --bootstrap 127.0.0.1:9092 --topic tx [--txns 2000]
       [--records 100] [--size 100] [--partitions 1] [--producers 1]
"""

import argparse
import threading
import time
import uuid

from confluent_kafka import Consumer, Producer


def pct(sorted_vals, q):
    if not sorted_vals:
        return float("nan")
    i = min(len(sorted_vals) - 1, max(0, int(round(q / 100.0 * (len(sorted_vals) - 1)))))
    return sorted_vals[i]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--txns", type=int, default=2000)
    ap.add_argument("--records", type=int, default=100)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--producers", type=int, default=1)
    a = ap.parse_args()
    value = b"x" * a.size
    commits = []
    lock = threading.Lock()
    n_each = [a.txns // a.producers + (1 if i < a.txns % a.producers else 0)
              for i in range(a.producers)]
    producers = []
    for i in range(a.producers):
        p = Producer({
            "bootstrap.servers": a.bootstrap,
            "transactional.id": f"bench-{uuid.uuid4().hex[:8]}-{i}",
            "linger.ms": 0,
            "broker.address.family": "v4",
        })
        p.init_transactions(60)
        producers.append(p)
    errors = []

    def run(p, n):
        mine = []
        try:
            for _ in range(n):
                p.begin_transaction()
                for j in range(a.records):
                    p.produce(a.topic, value=value, partition=j % a.partitions)
                c0 = time.monotonic()
                p.commit_transaction(60)
                mine.append((time.monotonic() - c0) * 1000)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
        with lock:
            commits.extend(mine)

    threads = [threading.Thread(target=run, args=(p, n)) for p, n in zip(producers, n_each)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs = time.monotonic() - t0
    done = len(commits)
    c = Consumer({
        "bootstrap.servers": a.bootstrap,
        "group.id": f"bench-reader-{uuid.uuid4().hex[:6]}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "broker.address.family": "v4",
    })
    c.subscribe([a.topic])
    seen, idle = 0, time.monotonic()
    want = done * a.records
    while seen < want and time.monotonic() - idle < 10:
        for m in c.consume(10000, 0.5):
            if m.error() is None:
                seen += 1
                idle = time.monotonic()
    c.close()
    commits.sort()
    for e in errors[:5]:
        print(f"producer error: {e}")
    print(f"TXNS txn_per_s={done / secs:.0f} records_per_s={want / secs:.0f} "
          f"commit_p50_ms={pct(commits, 50):.2f} commit_p99_ms={pct(commits, 99):.2f} "
          f"n={done} producers={a.producers} seen={seen}")


if __name__ == "__main__":
    main()
