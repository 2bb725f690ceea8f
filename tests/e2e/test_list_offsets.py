"""ListOffsets: by timestamp (exact, between, before first, after last),
earliest (-2), latest (-1) and max timestamp (-3, ListOffsets v7, raw)."""

import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

import kafka_wire as kw
from conftest import client_conf, create_topic, producer_conf

pytestmark = pytest.mark.substrates("local", "weakfs")

N_BATCHED = 10   # first 10 records produced together (one or few batches)
N_SINGLE = 10    # next 10 each in its own batch
STEP = 1000      # ms between record timestamps


def test_list_offsets(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 1)
    t0 = int(time.time() * 1000) - 600_000
    ts = [t0 + i * STEP for i in range(N_BATCHED + N_SINGLE)]
    n = len(ts)

    p = Producer(producer_conf(broker.bootstrap, **{"linger.ms": 200}))
    for i in range(N_BATCHED):
        p.produce(topic_name, value=b"%d" % i, partition=0, timestamp=ts[i])
    assert p.flush(30) == 0
    for i in range(N_BATCHED, n):
        p.produce(topic_name, value=b"%d" % i, partition=0, timestamp=ts[i])
        assert p.flush(30) == 0

    c = Consumer(client_conf(broker.bootstrap, **{"group.id": "lo-" + topic_name,
                                                  "enable.auto.commit": False}))
    try:
        tp = TopicPartition(topic_name, 0)
        assert c.get_watermark_offsets(tp, timeout=10) == (0, n)

        def for_time(t):
            [r] = c.offsets_for_times([TopicPartition(topic_name, 0, t)], timeout=10)
            assert r.error is None, r.error
            return r.offset

        assert for_time(ts[0]) == 0                       # exact first
        assert for_time(ts[3]) == 3                       # exact, inside the batched part
        assert for_time(ts[3] + STEP // 2) == 4           # between -> next record
        assert for_time(ts[N_BATCHED + 2]) == N_BATCHED + 2  # exact, single batches
        assert for_time(ts[N_BATCHED + 2] + 1) == N_BATCHED + 3
        assert for_time(t0 - 86_400_000) == 0             # before first -> first
        assert for_time(ts[-1]) == n - 1                  # exact last
        assert for_time(ts[-1] + 1) == -1                 # after last -> -1 (no such offset)
    finally:
        c.close()

    # raw ListOffsets v7 for the special timestamps
    av = kw.api_versions(broker.addr)
    assert av.error_code == 0
    lo_v, hi_v = av.api_keys.get(kw.LIST_OFFSETS, (None, None))
    assert hi_v is not None and hi_v >= 7, f"ListOffsets v7 (MAX_TIMESTAMP) not advertised: {lo_v}..{hi_v}"

    r = kw.list_offsets_v7(broker.addr, topic_name, 0, kw.EARLIEST_TIMESTAMP)
    assert (r.error_code, r.offset) == (0, 0), r
    r = kw.list_offsets_v7(broker.addr, topic_name, 0, kw.LATEST_TIMESTAMP)
    assert (r.error_code, r.offset) == (0, n), r
    r = kw.list_offsets_v7(broker.addr, topic_name, 0, kw.MAX_TIMESTAMP)
    assert (r.error_code, r.offset, r.timestamp) == (0, n - 1, ts[-1]), r
    r = kw.list_offsets_v7(broker.addr, topic_name, 0, ts[5])
    assert (r.error_code, r.offset, r.timestamp) == (0, 5, ts[5]), r
    r = kw.list_offsets_v7(broker.addr, topic_name, 99, kw.LATEST_TIMESTAMP)
    assert r.error_code == kw.UNKNOWN_TOPIC_OR_PARTITION, r
