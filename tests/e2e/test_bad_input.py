"""Malformed and hostile input on raw sockets, with hand-encoded Kafka frames.
After every case the broker is alive, never panicked, and a normal
confluent-kafka produce + consume still works."""

import struct
import time

import pytest

import kafka_wire as kw
from conftest import assert_healthy, consume_all, create_topic

MAX_REQ = 1024 * 1024
REQ_TIMEOUT_MS = 1000
BAD_INPUT_ARGS = ["--max-request-bytes", str(MAX_REQ), "--request-timeout-ms", str(REQ_TIMEOUT_MS)]

CLOSE_WAIT = 10.0  # seconds we give the broker to close a bad connection


def assert_closed(sock, what, timeout=CLOSE_WAIT):
    t = kw.wait_closed(sock, timeout)
    assert t is not None, f"broker kept the connection open after {what}"
    return t


@pytest.fixture
def bad_broker(broker_factory):
    return broker_factory(BAD_INPUT_ARGS)


def test_garbage_bytes_close_connection(bad_broker):
    # an HTTP request: its first 4 bytes read as a 1.2 GB frame length
    with kw.connect(bad_broker.addr) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert_closed(s, "HTTP garbage")
    # a plausible length followed by junk header (api key -1, version -7)
    with kw.connect(bad_broker.addr) as s:
        s.sendall(kw.frame(b"\xff\xff\xff\xf9" + b"\x13\x37" * 6))
        assert_closed(s, "junk header")
    # negative frame length
    with kw.connect(bad_broker.addr) as s:
        s.sendall(struct.pack(">i", -5) + b"\x00" * 8)
        assert_closed(s, "negative frame length")
    assert_healthy(bad_broker)


def test_truncated_frame_then_close(bad_broker):
    for _ in range(3):
        with kw.connect(bad_broker.addr) as s:
            payload = kw.api_versions_request(1, 3)
            s.sendall(struct.pack(">i", len(payload) + 100) + payload)
        # closed by us with the frame incomplete
    with kw.connect(bad_broker.addr) as s:
        s.sendall(b"\x00\x00")  # half a length prefix
    assert_healthy(bad_broker)


def test_oversized_frame_closed(bad_broker):
    with kw.connect(bad_broker.addr) as s:
        s.sendall(struct.pack(">i", MAX_REQ + 1) + b"\x00" * 64)
        t = assert_closed(s, "frame length > --max-request-bytes")
        # must be refused up front, not after waiting for the 1 MiB body
        assert t < REQ_TIMEOUT_MS / 1000.0 * 0.8, f"closed only after {t:.2f}s"
    with kw.connect(bad_broker.addr) as s:
        s.sendall(struct.pack(">i", 0x7FFFFFFF))
        assert_closed(s, "2 GiB frame length")
    assert_healthy(bad_broker)


def test_unknown_api_key(bad_broker):
    with kw.connect(bad_broker.addr) as s:
        s.sendall(kw.frame(kw.request_header(9999, 0, 42) + b"\x00" * 16))
        s.settimeout(CLOSE_WAIT)
        try:
            n = struct.unpack(">i", kw.recv_exact(s, 4))[0]
            body = kw.recv_exact(s, n)
            # a broker may answer instead of closing; then it must be our correlation id
            assert struct.unpack(">i", body[:4])[0] == 42, body[:16]
        except (ConnectionError, OSError):
            pass  # closed: what Apache Kafka does
    assert_healthy(bad_broker)


def test_api_versions_unsupported_version(bad_broker):
    with kw.connect(bad_broker.addr) as s:
        resp = kw.parse_api_versions_v0(kw.roundtrip(s, kw.api_versions_request(77, 99)))
    assert resp.correlation_id == 77
    assert resp.error_code == kw.UNSUPPORTED_VERSION
    # the v0 error response still lists ApiVersions so the client can retry
    assert kw.API_VERSIONS in resp.api_keys, resp.api_keys
    # and a supported version still works on a fresh connection
    ok = kw.api_versions(bad_broker.addr)
    assert ok.error_code == 0
    assert kw.PRODUCE in ok.api_keys and kw.FETCH in ok.api_keys and kw.METADATA in ok.api_keys
    assert_healthy(bad_broker)


def test_produce_unknown_partition(bad_broker, topic_name):
    create_topic(bad_broker.bootstrap, topic_name, 1)
    batch = kw.record_batch_v2([kw.Rec(b"x", b"k")])
    r = kw.produce_raw(bad_broker.addr, topic_name, 7, batch)
    assert (r.topic, r.partition) == (topic_name, 7)
    assert r.error_code == kw.UNKNOWN_TOPIC_OR_PARTITION, r
    assert_healthy(bad_broker)


def test_produce_valid_then_corrupt_crc(bad_broker, topic_name):
    create_topic(bad_broker.bootstrap, topic_name, 1)
    recs = [kw.Rec(b"value-%d" % i, b"key-%d" % i, [("h", b"%d" % i)], 1_700_000_000_000 + i)
            for i in range(5)]
    # the hand-built batch is valid: accepted and readable by librdkafka
    r = kw.produce_raw(bad_broker.addr, topic_name, 0, kw.record_batch_v2(recs))
    assert (r.error_code, r.base_offset) == (0, 0), r
    msgs = consume_all(bad_broker.bootstrap, topic_name, [0], timeout=20)[0]
    assert [(m.key, m.value, m.headers, m.timestamp) for m in msgs] == \
        [(x.key, x.value, tuple(x.headers), x.timestamp) for x in recs]

    # the same batch with a wrong CRC: CORRUPT_MESSAGE (2), nothing appended
    r = kw.produce_raw(bad_broker.addr, topic_name, 0, kw.record_batch_v2(recs, corrupt_crc=True))
    assert r.error_code == kw.CORRUPT_MESSAGE, r
    # a flipped payload byte after the CRC was computed
    good = bytearray(kw.record_batch_v2(recs))
    good[-3] ^= 0x55
    r = kw.produce_raw(bad_broker.addr, topic_name, 0, bytes(good))
    assert r.error_code == kw.CORRUPT_MESSAGE, r
    # truncated batch (batchLength says more than is there)
    r = kw.produce_raw(bad_broker.addr, topic_name, 0, kw.record_batch_v2(recs)[:-7])
    assert r.error_code == kw.CORRUPT_MESSAGE, r

    r = kw.produce_raw(bad_broker.addr, topic_name, 0, kw.record_batch_v2([kw.Rec(b"after")]))
    assert (r.error_code, r.base_offset) == (0, 5), r
    assert_healthy(bad_broker)


def test_produce_magic_v1_refused(bad_broker, topic_name):
    create_topic(bad_broker.bootstrap, topic_name, 1)
    r = kw.produce_raw(bad_broker.addr, topic_name, 0,
                       kw.message_set_v1([kw.Rec(b"old", b"k"), kw.Rec(b"older")]))
    assert r.error_code == kw.UNSUPPORTED_FOR_MESSAGE_FORMAT, r
    r = kw.produce_raw(bad_broker.addr, topic_name, 0, kw.record_batch_v2([kw.Rec(b"new")]))
    assert (r.error_code, r.base_offset) == (0, 0), r
    assert_healthy(bad_broker)


def test_half_frame_stall_closed_after_request_timeout(bad_broker):
    with kw.connect(bad_broker.addr) as s:
        payload = kw.api_versions_request(1, 0)
        s.sendall(struct.pack(">i", len(payload)) + payload[:3])
        t = assert_closed(s, f"half a frame and {REQ_TIMEOUT_MS} ms of silence",
                          timeout=REQ_TIMEOUT_MS / 1000.0 + 10)
    assert t >= REQ_TIMEOUT_MS / 1000.0 * 0.5, f"closed after {t:.2f}s, before the request timeout"
    # a complete request on an otherwise idle connection is unaffected by the timeout
    with kw.connect(bad_broker.addr) as s:
        time.sleep(REQ_TIMEOUT_MS / 1000.0 * 1.5)
        assert kw.parse_api_versions_v0(kw.roundtrip(s, kw.api_versions_request(5, 0))).error_code == 0
    assert_healthy(bad_broker)


def test_max_connections(broker_factory):
    LIMIT = 4
    b = broker_factory(["--max-connections", str(LIMIT)])
    time.sleep(0.5)  # let the readiness probe's connection be accounted as closed
    held = []
    try:
        for i in range(LIMIT):
            s = kw.connect(b.addr)
            held.append(s)
            resp = kw.parse_api_versions_v0(kw.roundtrip(s, kw.api_versions_request(100 + i, 0)))
            assert resp.error_code == 0, f"connection {i + 1}/{LIMIT} refused"
        extra = []
        for i in range(3):
            try:
                s = kw.connect(b.addr)
            except OSError:
                continue  # refused outright is fine too
            extra.append(s)
            try:
                s.sendall(kw.frame(kw.api_versions_request(200 + i, 0)))
            except OSError:
                pass
        for s in extra:
            assert_closed(s, f"connection over --max-connections {LIMIT}")
            s.close()
        # the held connections are still served
        for i, s in enumerate(held):
            assert kw.parse_api_versions_v0(kw.roundtrip(s, kw.api_versions_request(300 + i, 0))).error_code == 0
    finally:
        for s in held:
            s.close()

    # once they are closed, new connections are accepted again (bounded retry)
    deadline = time.monotonic() + 10
    while True:
        try:
            with kw.connect(b.addr) as s:
                if kw.parse_api_versions_v0(kw.roundtrip(s, kw.api_versions_request(1, 0))).error_code == 0:
                    break
        except (ConnectionError, OSError):
            pass
        assert time.monotonic() < deadline, "connections not accepted after the held ones closed"
        time.sleep(0.2)
    assert b.alive()
    b.assert_no_panic()
