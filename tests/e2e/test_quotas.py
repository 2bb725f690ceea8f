"""Client byte-rate quotas (DescribeClientQuotas / AlterClientQuotas, raw
v0 requests; kaas has no authentication, so entities are client ids and
users' defaults): a producer over its quota is answered with
throttle_time_ms and held back; another client is not; quotas persist in
the cluster directory across a restart; unsupported entity types and keys
get INVALID_REQUEST."""

from __future__ import annotations

import struct
import time

import kafka_wire as w
from conftest import create_topic

ALTER, DESCRIBE, PRODUCE = 49, 48, 0
INVALID_REQUEST = 42


def alter(addr, entries, validate_only=False):
    """entries: [([(type, name|None)], [(key, value, remove)])] -> [(error, message)]."""
    body = w.i32(len(entries))
    for ent, ops in entries:
        body += w.i32(len(ent)) + b"".join(w.string(t) + w.string(n) for t, n in ent)
        body += w.i32(len(ops)) + b"".join(
            w.string(k) + struct.pack(">d", v) + w.i8(1 if rm else 0) for k, v, rm in ops)
    body += w.i8(1 if validate_only else 0)
    with w.connect(addr) as s:
        r = w.Reader(w.roundtrip(s, w.request_header(ALTER, 0, 1) + body))
    assert r.i32() == 1
    r.i32()
    out = []
    for _ in range(r.i32()):
        err = r.i16()
        msg = r.string()
        for _ in range(r.i32()):
            r.string()
            r.string()
        out.append((err, msg))
    return out


def describe(addr, components, strict=False):
    """components: [(type, match_type, match|None)] -> (error, {entity: {key: value}})."""
    body = w.i32(len(components)) + b"".join(
        w.string(t) + w.i8(m) + w.string(n) for t, m, n in components) + w.i8(1 if strict else 0)
    with w.connect(addr) as s:
        r = w.Reader(w.roundtrip(s, w.request_header(DESCRIBE, 0, 2) + body))
    assert r.i32() == 2
    r.i32()
    err = r.i16()
    r.string()
    out = {}
    for _ in range(max(r.i32(), 0)):
        ent = tuple((r.string(), r.string()) for _ in range(r.i32()))
        vals = {}
        for _ in range(r.i32()):
            k = r.string()
            vals[k] = struct.unpack(">d", r.take(8))[0]
        out[ent] = vals
    return err, out


def produce_as(sock, client, topic, payload, cid):
    """A raw Produce v3 (acks=1) under `client`: (error, throttle_time_ms, seconds)."""
    batch = w.record_batch_v2([w.Rec(value=payload)])
    body = (w.string(None) + w.i16(1) + w.i32(10000) + w.i32(1) + w.string(topic)
            + w.i32(1) + w.i32(0) + w.kbytes(batch))
    t0 = time.monotonic()
    resp = w.roundtrip(sock, w.request_header(PRODUCE, 3, cid, client_id=client) + body)
    took = time.monotonic() - t0
    r = w.Reader(resp)
    assert r.i32() == cid
    r.i32()
    r.string()
    r.i32()
    r.i32()
    err = r.i16()
    r.i64()
    r.i64()
    throttle = r.i32()
    return err, throttle, took


def test_a_producer_over_its_quota_is_throttled_and_others_are_not(broker_factory, topic_name):
    b = broker_factory()
    create_topic(b.bootstrap, topic_name, 1)
    # 20 KB/s for client "slow"; unsupported entity type and key refused.
    res = alter(b.addr, [
        ([("client-id", "slow")], [("producer_byte_rate", 20_000.0, False)]),
        ([("ip", None)], [("connection_creation_rate", 5.0, False)]),
        ([("client-id", "x")], [("request_percentage", 50.0, False)]),
    ])
    assert res[0][0] == 0, res
    assert res[1][0] == INVALID_REQUEST and res[2][0] == INVALID_REQUEST, res
    err, got = describe(b.addr, [("client-id", 0, "slow")])
    assert err == 0 and got == {(("client-id", "slow"),): {"producer_byte_rate": 20_000.0}}, got
    payload = b"x" * 49_000
    with w.connect(b.addr, timeout=60) as s:
        # Kafka's window lets a burst of 10 s worth (200 KB) through, then
        # 245 KB over 10 s is 24.5 KB/s: (24.5 - 20) / 20 × 10 s = 2.25 s.
        seen = []
        for i in range(5):
            seen.append(produce_as(s, "slow", topic_name, payload, 10 + i))
        assert all(e == 0 for e, _, _ in seen), seen
        assert [t for _, t, _ in seen[:4]] == [0, 0, 0, 0], seen
        assert 1800 <= seen[4][1] <= 3000, seen
        assert seen[4][2] >= 1.8, f"not held back: {seen}"
        # Another client id on the same connection is not throttled.
        for i in range(5):
            e, t, took = produce_as(s, "fast", topic_name, payload, 20 + i)
            assert (e, t) == (0, 0) and took < 2.0
    # Persisted in the cluster directory: a restart keeps it.
    b.stop()
    b.start()
    err, got = describe(b.addr, [("client-id", 2, None)])
    assert got == {(("client-id", "slow"),): {"producer_byte_rate": 20_000.0}}, got
    # Removing it.
    assert alter(b.addr, [([("client-id", "slow")], [("producer_byte_rate", 0.0, True)])])[0][0] == 0
    assert describe(b.addr, [("client-id", 2, None)])[1] == {}
