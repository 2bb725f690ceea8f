"""A request over `--max-request-bytes` (issue 13).

A Produce over the limit is answered MESSAGE_TOO_LARGE (10) for every
partition it lists and the connection is kept: closing it (what the broker
did before) makes a producer reconnect and resend the same request in a
loop until its message timeout. The broker keeps only the request's head
and drops the rest as it arrives, so the request costs no memory. Any other
request over the limit closes the connection, as Kafka does, logged once
per interval with a count and the api's name.
"""

import json
import struct
import time

from confluent_kafka import KafkaError, Producer

import kafka_wire as kw
from conftest import assert_healthy, create_topic, producer_conf

MAX_REQ = 200_000
BIG = 20 * 1024 * 1024
MESSAGE_TOO_LARGE = 10


def vm_hwm_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_oversized_produce_gets_message_too_large_and_keeps_the_connection(broker_factory, topic_name):
    b = broker_factory(["--max-request-bytes", str(MAX_REQ)])
    create_topic(b.bootstrap, topic_name, 1)
    stats = []
    p = Producer(producer_conf(
        b.bootstrap,
        **{"message.max.bytes": 2 * BIG, "message.timeout.ms": 15000,
           "compression.type": "none", "statistics.interval.ms": 200,
           "stats_cb": stats.append}))
    got = []
    # Warm the connection: a small record first.
    p.produce(topic_name, value=b"before", partition=0, on_delivery=lambda e, m: got.append(e))
    assert p.flush(30) == 0 and got == [None], got
    hwm_before = vm_hwm_kib(b.pid)

    got.clear()
    t0 = time.monotonic()
    p.produce(topic_name, value=b"x" * BIG, partition=0, on_delivery=lambda e, m: got.append(e))
    assert p.flush(30) == 0
    took = time.monotonic() - t0
    assert len(got) == 1 and got[0] is not None, got
    assert got[0].code() == KafkaError.MSG_SIZE_TOO_LARGE, got[0]
    # An answer, not the message timeout of a resend loop.
    assert took < 10, f"delivery report after {took:.1f}s"

    # The connection is still usable: a small record goes through.
    got.clear()
    p.produce(topic_name, value=b"after", partition=0, on_delivery=lambda e, m: got.append(e))
    assert p.flush(30) == 0 and got == [None], got
    p.poll(0.5)
    p.flush(1)
    last = json.loads(stats[-1])
    disconnects = {name: br.get("disconnects", 0) for name, br in last["brokers"].items()}
    assert sum(disconnects.values()) == 0, disconnects

    # The 20 MiB body was dropped as it arrived, never held.
    grew = vm_hwm_kib(b.pid) - hwm_before
    assert grew < 8 * 1024, f"peak RSS grew by {grew} KiB for a dropped {BIG >> 20} MiB request"
    log = b.log_text()
    assert "answered MESSAGE_TOO_LARGE" in log, b.log_tail()
    assert "closing connection" not in log, b.log_tail()
    assert_healthy(b)


def test_oversized_requests_on_the_wire(broker_factory, topic_name):
    b = broker_factory(["--max-request-bytes", str(MAX_REQ)])
    create_topic(b.bootstrap, topic_name, 2)
    big = kw.record_batch_v2([kw.Rec(value=b"y" * (2 * MAX_REQ))])
    with kw.connect(b.addr) as s:
        for cid in (41, 42):  # twice on one connection: it stays open
            cid_got, results = kw.parse_produce_response_v3(
                kw.roundtrip(s, kw.produce_request_v3(cid, topic_name, 0, big)))
            assert cid_got == cid
            assert [(r.topic, r.partition, r.error_code) for r in results] == \
                [(topic_name, 0, MESSAGE_TOO_LARGE)], results
        # Two partitions, each with records over the limit: both answered
        # (the records are cut out as they arrive, the list is kept).
        two = (kw.string(None) + kw.i16(-1) + kw.i32(10000) + kw.i32(1) + kw.string(topic_name)
               + kw.i32(2) + kw.i32(0) + kw.kbytes(big) + kw.i32(1) + kw.kbytes(big))
        cid_got, results = kw.parse_produce_response_v3(
            kw.roundtrip(s, kw.request_header(0, 3, 45) + two))
        assert cid_got == 45
        assert [(r.partition, r.error_code) for r in results] == \
            [(0, MESSAGE_TOO_LARGE), (1, MESSAGE_TOO_LARGE)], results
        # acks=0: no answer, the connection still serves the next request.
        s.sendall(kw.frame(kw.produce_request_v3(43, topic_name, 0, big, acks=0)))
        small = kw.record_batch_v2([kw.Rec(value=b"small")])
        cid_got, results = kw.parse_produce_response_v3(
            kw.roundtrip(s, kw.produce_request_v3(44, topic_name, 0, small)))
        assert cid_got == 44 and results[0].error_code == 0, results

    # Any other api over the limit: closed, logged once with its name.
    for _ in range(5):
        with kw.connect(b.addr) as s:
            s.sendall(kw.frame(kw.request_header(3, 4, 1) + b"\x00" * (MAX_REQ + 10)))
            assert kw.wait_closed(s, 10) is not None
    log = b.log_text()
    assert log.count("request over --max-request-bytes; closing connection") == 1, b.log_tail()
    assert "api=Metadata" in log, b.log_tail()
    assert_healthy(b)


def vm_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {key}")


def test_many_100_mib_prefixes_cost_no_memory(broker):
    """300 connections each declaring a 100 MiB request (the default limit)
    and sending 1 KiB of it: the buffers grow with what arrives, so neither
    the address space (31 GB before the fix) nor the resident set grows by
    anything near 300 × 100 MiB, and the broker keeps serving."""
    size = 100 * 1024 * 1024
    vm_before, hwm_before = vm_kib(broker.pid, "VmSize"), vm_kib(broker.pid, "VmHWM")
    socks = []
    try:
        for _ in range(300):
            s = kw.connect(broker.addr)
            s.sendall(struct.pack(">i", size) + kw.request_header(0, 9, 1) + b"\x00" * 1024)
            socks.append(s)
        time.sleep(1)
        vm_grew = vm_kib(broker.pid, "VmSize") - vm_before
        hwm_grew = vm_kib(broker.pid, "VmHWM") - hwm_before
        assert vm_grew < 2 * 1024 * 1024, f"address space grew by {vm_grew} KiB"
        assert hwm_grew < 128 * 1024, f"peak RSS grew by {hwm_grew} KiB"
        assert_healthy(broker)
    finally:
        for s in socks:
            s.close()
    assert_healthy(broker)
