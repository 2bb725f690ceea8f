"""KIP-227 incremental fetch sessions: raw Fetch v7 requests for the exact
protocol (session ids, epochs, which partitions an incremental answer
carries, the error codes), and kafka-python (which uses sessions by
default) consuming many partitions through them."""

from __future__ import annotations

import time

import kafka_wire as w
from conftest import create_topic, producer_conf

FETCH = 1
FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH = 70, 71


def fetch_v7(sock, cid, session_id, epoch, parts, forgotten=(), topic="", max_wait_ms=0):
    """Fetch v7: `parts` = [(partition, offset)] of `topic`. Returns
    (error, session_id, {partition: (error, hw, n_record_bytes)})."""
    body = (w.i32(-1) + w.i32(max_wait_ms) + w.i32(1) + w.i32(1 << 20) + w.i8(0)
            + w.i32(session_id) + w.i32(epoch))
    if parts:
        ps = b"".join(w.i32(p) + w.i64(off) + w.i64(-1) + w.i32(1 << 20) for p, off in parts)
        body += w.i32(1) + w.string(topic) + w.i32(len(parts)) + ps
    else:
        body += w.i32(0)
    if forgotten:
        body += w.i32(1) + w.string(topic) + w.i32(len(forgotten)) + b"".join(w.i32(p) for p in forgotten)
    else:
        body += w.i32(0)
    r = w.Reader(w.roundtrip(sock, w.request_header(FETCH, 7, cid) + body))
    assert r.i32() == cid
    r.i32()  # throttle
    err = r.i16()
    sid = r.i32()
    out = {}
    for _ in range(r.i32()):
        assert r.string() == topic
        for _ in range(r.i32()):
            p = r.i32()
            perr = r.i16()
            hw = r.i64()
            r.i64()
            r.i64()
            for _ in range(max(r.i32(), 0)):
                r.i64()
                r.i64()
            n = r.i32()
            if n > 0:
                r.take(n)
            out[p] = (perr, hw, max(n, 0))
    return err, sid, out


def produce_to(bootstrap, topic, partition, n):
    from confluent_kafka import Producer
    p = Producer(producer_conf(bootstrap))
    for i in range(n):
        p.produce(topic, value=b"v%d" % i, partition=partition)
    assert p.flush(30) == 0


def test_incremental_fetch_answers_only_what_changed(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 4)
    produce_to(broker.bootstrap, topic_name, 0, 3)
    with w.connect(broker.addr) as s:
        # Epoch 0: a full fetch that opens a session.
        err, sid, out = fetch_v7(s, 1, 0, 0, [(p, 0) for p in range(4)], topic=topic_name)
        assert err == 0 and sid != 0
        assert set(out) == {0, 1, 2, 3}
        assert out[0][1] == 3 and out[0][2] > 0
        # Epoch 1: p0 moves to 3; nothing is new anywhere: an empty answer.
        err, sid1, out = fetch_v7(s, 2, sid, 1, [(0, 3)], topic=topic_name)
        assert (err, sid1, out) == (0, sid, {})
        # Records land on p2: only p2 comes back.
        produce_to(broker.bootstrap, topic_name, 2, 2)
        err, _, out = fetch_v7(s, 3, sid, 2, [], topic=topic_name)
        assert err == 0 and set(out) == {2}, out
        assert out[2][1] == 2 and out[2][2] > 0
        # A replayed epoch, an unknown session.
        err, sid2, _ = fetch_v7(s, 4, sid, 2, [], topic=topic_name)
        assert (err, sid2) == (INVALID_FETCH_SESSION_EPOCH, 0)
        err, _, _ = fetch_v7(s, 5, sid + 1 if sid + 1 != 0 else 2, 1, [], topic=topic_name)
        assert err == FETCH_SESSION_ID_NOT_FOUND
        # The session survives a bad request: epoch 3, forget p2, then a
        # produce to p2 is not reported; p1 added back with a new offset.
        err, _, out = fetch_v7(s, 6, sid, 3, [], forgotten=[2], topic=topic_name)
        assert err == 0 and out == {}
        produce_to(broker.bootstrap, topic_name, 2, 1)
        err, _, out = fetch_v7(s, 7, sid, 4, [], topic=topic_name)
        assert err == 0 and 2 not in out
        # Epoch -1: a sessionless full fetch closes it.
        err, sid3, out = fetch_v7(s, 8, sid, -1, [(1, 0)], topic=topic_name)
        assert (err, sid3) == (0, 0) and set(out) == {1}
        err, _, _ = fetch_v7(s, 9, sid, 5, [], topic=topic_name)
        assert err == FETCH_SESSION_ID_NOT_FOUND


def test_kafka_python_consumes_many_partitions_through_a_session(broker, topic_name):
    """kafka-python uses incremental fetch sessions by default: a consumer
    of 64 partitions reads every record, including ones produced while it
    is already polling (answered incrementally)."""
    from kafka import KafkaConsumer, TopicPartition
    parts = 64
    create_topic(broker.bootstrap, topic_name, parts)
    from confluent_kafka import Producer
    p = Producer(producer_conf(broker.bootstrap))
    for i in range(parts * 5):
        p.produce(topic_name, value=b"%d" % i, partition=i % parts)
    assert p.flush(30) == 0
    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                      auto_offset_reset="earliest", fetch_max_wait_ms=100,
                      enable_incremental_fetch_sessions=True)
    try:
        c.assign([TopicPartition(topic_name, i) for i in range(parts)])
        seen = set()
        deadline = time.monotonic() + 60
        more_sent = False
        while len(seen) < parts * 10 and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=200).values():
                seen.update(int(r.value) for r in recs)
            if len(seen) >= parts * 5 and not more_sent:
                for i in range(parts * 5, parts * 10):
                    p.produce(topic_name, value=b"%d" % i, partition=i % parts)
                assert p.flush(30) == 0
                more_sent = True
        assert seen == set(range(parts * 10)), len(seen)
    finally:
        c.close()
