#!/usr/bin/env python3
"""What a topic-level compression.type costs the broker (issue 27 item 8).

An uncompressed producer (kcat -P, librdkafka, C speed, acks=all) sends the
same file of JSON-like ~1 KiB records to a 1-partition topic whose
compression.type is `producer` (stored as sent: the baseline) and, in the
same round, to topics whose compression.type makes the broker compress
every batch before it appends it (lz4, zstd, snappy, gzip). Each run: a
fresh broker and data directory (bench/ab.py's `broker`), the order of the
codecs rotated every round. Reported per codec: the median records/s, its
ratio to `producer` in the same run, the broker's CPU per 100 MB of
records produced (/proc/<pid>/stat), and the bytes stored per record.

Usage:
  ./.venv/bin/python3 bench/topic_compression.py --rounds 3 target/release/kaas

Loopback only; load tool and broker share the machine's cores.
"""

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from ab import broker, cpu_seconds  # noqa: E402

CODECS = ["producer", "lz4", "zstd", "snappy", "gzip"]


def write_records(path, n, seed=7):
    """`n` JSON-like lines of ~1 KiB: repeated field names, random values
    (compressible about as much as typical event payloads)."""
    rnd = random.Random(seed)
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
    with open(path, "w") as f:
        for i in range(n):
            fields = [f'"id":{i}', f'"ts":{1_700_000_000_000 + i}',
                      f'"user":"{rnd.choice(words)}-{rnd.randrange(10**6)}"']
            while sum(len(x) for x in fields) < 1000:
                k = rnd.choice(words)
                fields.append(f'"{k}_{rnd.randrange(40)}":"{rnd.choice(words)} {rnd.random():.6f}"')
            f.write("{" + ",".join(fields) + "}\n")


def create(boot, topic, codec):
    from confluent_kafka.admin import AdminClient, NewTopic

    a = AdminClient({"bootstrap.servers": boot, "broker.address.family": "v4"})
    cfg = {} if codec == "producer" else {"compression.type": codec}
    a.create_topics([NewTopic(topic, 1, 1, config=cfg)])[topic].result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        t = a.list_topics(topic=topic, timeout=10).topics.get(topic)
        if t and t.error is None and all(p.leader >= 0 for p in t.partitions.values()):
            return
        time.sleep(0.2)
    raise RuntimeError("topic not ready")


def stored_bytes(data_dir, topic):
    total = 0
    for root, _, files in os.walk(os.path.join(data_dir, topic)):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files if f.endswith(".log"))
    return total


def run(binary, codec, records, n, workdir):
    with broker(binary, workdir) as (proc, port, _):
        boot = f"127.0.0.1:{port}"
        topic = f"tc-{codec}"
        create(boot, topic, codec)
        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        r = subprocess.run(
            ["kcat", "-P", "-b", boot, "-t", topic, "-p", "0", "-l", records,
             "-X", "broker.address.family=v4", "-X", "compression.codec=none",
             "-X", "acks=all", "-X", "linger.ms=5", "-X", "batch.size=1000000",
             "-X", "queue.buffering.max.messages=1000000"],
            capture_output=True, text=True, timeout=600)
        wall = time.monotonic() - t0
        cpu = cpu_seconds(proc.pid) - cpu0
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-2000:])
        size = os.path.getsize(records)
        return {"rec/s": n / wall, "cpu ms/100MB": cpu * 1000 / (size / 1e8),
                "B/rec stored": stored_bytes(os.path.join(workdir, "data"), topic) / n}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("binary")
    args = ap.parse_args()
    binary = os.path.abspath(args.binary)
    res = {c: [] for c in CODECS}
    with tempfile.TemporaryDirectory(prefix="kaas-tc-") as tmp:
        records = os.path.join(tmp, "records.jsonl")
        write_records(records, args.records)
        for rnd in range(args.rounds):
            order = CODECS[rnd % len(CODECS):] + CODECS[:rnd % len(CODECS)]
            for codec in order:
                wd = tempfile.mkdtemp(dir=tmp)
                r = run(binary, codec, records, args.records, wd)
                res[codec].append(r)
                print(f"round {rnd} {codec:9} {r['rec/s']:>9.0f} rec/s "
                      f"{r['cpu ms/100MB']:>6.0f} cpu ms/100MB {r['B/rec stored']:>6.0f} B/rec",
                      flush=True)
    base = statistics.median(r["rec/s"] for r in res["producer"])
    print("\n| topic compression.type | rec/s (median) | ratio | broker CPU ms / 100 MB | bytes stored / record |")
    print("|---|---|---|---|---|")
    for c in CODECS:
        med = statistics.median(r["rec/s"] for r in res[c])
        cpu = statistics.median(r["cpu ms/100MB"] for r in res[c])
        b = statistics.median(r["B/rec stored"] for r in res[c])
        print(f"| {c} | {med / 1000:.0f} k | {med / base:.2f} | {cpu:.0f} | {b:.0f} |")


if __name__ == "__main__":
    main()
