"""100,000 records (key, 2 headers, explicit timestamp) acks=all across 3
partitions; consume everything back and compare byte-for-byte, with the
offsets the delivery reports gave, in order."""

import time

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, Producer

from conftest import consume_all, create_topic, producer_conf

# Run on a local dir and on a weakfs (NFS-like) mount: see conftest.py.
pytestmark = pytest.mark.substrates("local", "weakfs")

N = 100_000
PARTITIONS = 3


def record(i: int, base_ts: int):
    key = b"key-%06d" % i
    value = (b"value-%06d|" % i) + bytes((i + j) % 256 for j in range(i % 61))
    headers = [("seq", b"%d" % i), ("bin", bytes([i % 256, 0, 255, (i >> 8) % 256]))]
    return key, value, headers, base_ts + i


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_100k_records_roundtrip(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, PARTITIONS)
    base_ts = int(time.time() * 1000) - 3_600_000  # an hour ago, ms

    p = Producer(producer_conf(broker.bootstrap, **{
        "acks": "all", "linger.ms": 10, "batch.num.messages": 2000,
        "queue.buffering.max.messages": 200_000, "compression.type": "none"}))
    delivered = {}  # seq -> (partition, offset)
    errors = []

    def on_delivery(err, msg):
        seq = int(msg.key()[4:])
        if err is not None:
            errors.append((seq, err))
        else:
            delivered[seq] = (msg.partition(), msg.offset())

    t0 = time.monotonic()
    for i in range(N):
        key, value, headers, ts = record(i, base_ts)
        for _ in range(1000):
            try:
                p.produce(topic_name, key=key, value=value, headers=headers, timestamp=ts,
                          partition=i % PARTITIONS, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.05)
        else:
            pytest.fail("producer queue stayed full")
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(60) == 0, "not all records delivered within 60 s"
    produce_s = time.monotonic() - t0
    assert not errors, f"{len(errors)} delivery errors, first: {errors[:5]}"
    assert len(delivered) == N

    # Delivery offsets: per partition exactly 0..n-1, in produce order.
    by_part = {p_: [] for p_ in range(PARTITIONS)}
    for seq in range(N):
        part, off = delivered[seq]
        assert part == seq % PARTITIONS
        by_part[part].append((off, seq))
    for part, lst in by_part.items():
        offs = [o for o, _ in lst]
        assert offs == list(range(len(lst))), f"partition {part}: offsets not 0..n-1 in produce order"

    t1 = time.monotonic()
    got = consume_all(broker.bootstrap, topic_name, PARTITIONS, timeout=60)
    consume_s = time.monotonic() - t1

    for part in range(PARTITIONS):
        msgs = got[part]
        assert len(msgs) == len(by_part[part]), f"partition {part}: {len(msgs)} != {len(by_part[part])}"
        for m, (off, seq) in zip(msgs, by_part[part]):
            key, value, headers, ts = record(seq, base_ts)
            assert m.offset == off
            assert m.key == key, f"p{part}@{off}"
            assert m.value == value, f"p{part}@{off}"
            assert list(m.headers) == headers, f"p{part}@{off}: {m.headers!r}"
            assert m.timestamp_type == TIMESTAMP_CREATE_TIME, f"p{part}@{off}"
            assert m.timestamp == ts, f"p{part}@{off}"
    print(f"produce {N} in {produce_s:.1f}s, consume in {consume_s:.1f}s")
