"""Minimal hand-rolled Kafka wire encoding for raw-socket tests.

Only what the e2e tests need: request headers (v1 and flexible v2), ApiVersions,
Produce v3-v7 and Fetch v4-v10 (non-flexible), ListOffsets v7 (flexible),
WriteTxnMarkers v1 and DescribeProducers v0 (flexible), transactional and
control batches (KIP-98),
RecordBatch v2 with CRC32C, a zstd frame of raw blocks, and a legacy magic v1
message set. Everything is built with `struct`
so the tests do not depend on any client library's encoder.
"""

from __future__ import annotations

import socket
import struct
import time
import zlib
from dataclasses import dataclass, field

# ---------------------------------------------------------------------------
# API keys and error codes (subset)
# ---------------------------------------------------------------------------
PRODUCE = 0
FETCH = 1
LIST_OFFSETS = 2
METADATA = 3
API_VERSIONS = 18

NONE = 0
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
UNSUPPORTED_VERSION = 35
INVALID_CONFIG = 40
UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
UNSUPPORTED_COMPRESSION_TYPE = 76
INVALID_RECORD = 87

# ---------------------------------------------------------------------------
# CRC32C (Castagnoli), pure python, table driven
# ---------------------------------------------------------------------------
_CRC32C_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC32C_TABLE.append(_c)
del _i, _c


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _CRC32C_TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283, "crc32c self-test"

# ---------------------------------------------------------------------------
# primitive encoders
# ---------------------------------------------------------------------------


def i8(v: int) -> bytes:
    return struct.pack(">b", v)


def i16(v: int) -> bytes:
    return struct.pack(">h", v)


def i32(v: int) -> bytes:
    return struct.pack(">i", v)


def i64(v: int) -> bytes:
    return struct.pack(">q", v)


def string(s: str | None) -> bytes:
    if s is None:
        return i16(-1)
    b = s.encode()
    return i16(len(b)) + b


def kbytes(b: bytes | None) -> bytes:
    if b is None:
        return i32(-1)
    return i32(len(b)) + b


def uvarint(v: int) -> bytes:
    out = bytearray()
    while True:
        byte = v & 0x7F
        v >>= 7
        if v:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def varint(v: int) -> bytes:
    """zig-zag signed varint (also used for varlong)."""
    return uvarint((v << 1) ^ (v >> 63))


def compact_string(s: str | None) -> bytes:
    if s is None:
        return uvarint(0)
    b = s.encode()
    return uvarint(len(b) + 1) + b


def compact_array(items: list[bytes]) -> bytes:
    return uvarint(len(items) + 1) + b"".join(items)


TAGS_NONE = uvarint(0)

# ---------------------------------------------------------------------------
# decoding
# ---------------------------------------------------------------------------


class Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError(f"short read: need {n} at {self.pos}, have {len(self.data)}")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def i8(self) -> int:
        return struct.unpack(">b", self.take(1))[0]

    def i16(self) -> int:
        return struct.unpack(">h", self.take(2))[0]

    def i32(self) -> int:
        return struct.unpack(">i", self.take(4))[0]

    def i64(self) -> int:
        return struct.unpack(">q", self.take(8))[0]

    def string(self) -> str | None:
        n = self.i16()
        return None if n < 0 else self.take(n).decode()

    def uvarint(self) -> int:
        shift = 0
        result = 0
        while True:
            b = self.take(1)[0]
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise ValueError("varint too long")

    def compact_string(self) -> str | None:
        n = self.uvarint()
        return None if n == 0 else self.take(n - 1).decode()

    def compact_array_len(self) -> int:
        n = self.uvarint()
        return -1 if n == 0 else n - 1

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.take(self.uvarint())

    def remaining(self) -> int:
        return len(self.data) - self.pos


# ---------------------------------------------------------------------------
# frames
# ---------------------------------------------------------------------------


def request_header(api_key: int, api_version: int, correlation_id: int,
                   client_id: str = "kaas-e2e", flexible: bool = False) -> bytes:
    h = i16(api_key) + i16(api_version) + i32(correlation_id) + string(client_id)
    if flexible:
        h += TAGS_NONE
    return h


def frame(payload: bytes) -> bytes:
    return i32(len(payload)) + payload


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)}/{n} bytes")
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket) -> bytes:
    (n,) = struct.unpack(">i", recv_exact(sock, 4))
    if n < 0 or n > 256 * 1024 * 1024:
        raise ValueError(f"bad response length {n}")
    return recv_exact(sock, n)


def connect(addr: tuple[str, int], timeout: float = 10.0) -> socket.socket:
    s = socket.create_connection(addr, timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def roundtrip(sock: socket.socket, payload: bytes) -> bytes:
    sock.sendall(frame(payload))
    return recv_frame(sock)


def wait_closed(sock: socket.socket, timeout: float) -> float | None:
    """Read and discard until the peer closes. Returns seconds until EOF/RST,
    or None if still open after `timeout`."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        sock.settimeout(min(left, 1.0))
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError):
            return time.monotonic() - t0
        if not chunk:
            return time.monotonic() - t0


# ---------------------------------------------------------------------------
# ApiVersions
# ---------------------------------------------------------------------------


@dataclass
class ApiVersionsResponse:
    correlation_id: int
    error_code: int
    api_keys: dict[int, tuple[int, int]] = field(default_factory=dict)


def api_versions_request(correlation_id: int, version: int = 0) -> bytes:
    """ApiVersions v0..v2 (non-flexible body is empty). For any other
    `version` we still send an empty body: a broker must answer an
    unsupported version with a v0 response carrying error 35."""
    return request_header(API_VERSIONS, version, correlation_id)


def parse_api_versions_v0(resp: bytes) -> ApiVersionsResponse:
    r = Reader(resp)
    cid = r.i32()
    err = r.i16()
    keys = {}
    n = r.i32()
    for _ in range(max(n, 0)):
        k, lo, hi = r.i16(), r.i16(), r.i16()
        keys[k] = (lo, hi)
    return ApiVersionsResponse(cid, err, keys)


def api_versions(addr: tuple[str, int]) -> ApiVersionsResponse:
    with connect(addr) as s:
        return parse_api_versions_v0(roundtrip(s, api_versions_request(1, 0)))


def metadata_v4(addr: tuple[str, int], topics: list[str] | None = None
                ) -> tuple[set[int], dict[str, tuple[int, dict[int, int]]]]:
    """One Metadata v4 request to exactly this broker (no auto-creation):
    the broker ids it lists — the brokers in the assignment it has applied —
    and per named topic (every topic for None) its error code and each
    partition's leader."""
    body = (i32(-1) if topics is None else i32(len(topics)) + b"".join(string(t) for t in topics))
    with connect(addr) as s:
        r = Reader(roundtrip(s, request_header(METADATA, 4, 1) + body + i8(0)))
    r.i32()  # correlation id
    r.i32()  # throttle
    ids = set()
    for _ in range(max(r.i32(), 0)):
        ids.add(r.i32())
        r.string()
        r.i32()
        r.string()  # rack
    r.string()  # cluster id
    r.i32()  # controller id
    out = {}
    for _ in range(max(r.i32(), 0)):
        err, name = r.i16(), r.string()
        r.i8()  # is_internal
        parts = {}
        for _ in range(max(r.i32(), 0)):
            r.i16()
            p, leader = r.i32(), r.i32()
            for _ in range(2):  # replicas, isr
                for _ in range(max(r.i32(), 0)):
                    r.i32()
            parts[p] = leader
        out[name] = (err, parts)
    return ids, out


# ---------------------------------------------------------------------------
# RecordBatch v2 and legacy message sets
# ---------------------------------------------------------------------------


@dataclass
class Rec:
    value: bytes | None
    key: bytes | None = None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    timestamp: int | None = None


def _record(r: Rec, offset_delta: int, ts_delta: int) -> bytes:
    body = i8(0) + varint(ts_delta) + varint(offset_delta)
    body += varint(-1) if r.key is None else varint(len(r.key)) + r.key
    body += varint(-1) if r.value is None else varint(len(r.value)) + r.value
    body += varint(len(r.headers))
    for hk, hv in r.headers:
        hkb = hk.encode()
        body += varint(len(hkb)) + hkb
        body += varint(-1) if hv is None else varint(len(hv)) + hv
    return varint(len(body)) + body


def record_batch_v2(records: list[Rec], base_offset: int = 0,
                    producer_id: int = -1, producer_epoch: int = -1,
                    base_sequence: int = -1, attributes: int = 0,
                    corrupt_crc: bool = False) -> bytes:
    now = int(time.time() * 1000)
    stamps = [r.timestamp if r.timestamp is not None else now for r in records]
    base_ts = min(stamps)
    max_ts = max(stamps)
    recs = b"".join(_record(r, i, ts - base_ts) for i, (r, ts) in enumerate(zip(records, stamps)))
    after_crc = (i16(attributes) + i32(len(records) - 1) + i64(base_ts) + i64(max_ts)
                 + i64(producer_id) + i16(producer_epoch) + i32(base_sequence)
                 + i32(len(records)) + recs)
    crc = crc32c(after_crc)
    if corrupt_crc:
        crc ^= 0xDEADBEEF
    # batchLength counts from partitionLeaderEpoch to the end
    rest = i32(-1) + i8(2) + struct.pack(">I", crc) + after_crc
    return i64(base_offset) + i32(len(rest)) + rest


def message_set_v1(records: list[Rec]) -> bytes:
    """Legacy MessageSet with magic=1 messages (pre-0.11 format)."""
    out = b""
    now = int(time.time() * 1000)
    for i, r in enumerate(records):
        ts = r.timestamp if r.timestamp is not None else now
        body = i8(1) + i8(0) + i64(ts) + kbytes(r.key) + kbytes(r.value)
        crc = zlib.crc32(body) & 0xFFFFFFFF
        msg = struct.pack(">I", crc) + body
        out += i64(i) + i32(len(msg)) + msg
    return out


# RecordBatch attributes: the codec in bits 0-2.
CODEC_ZSTD = 4


def zstd_raw_frame(data: bytes) -> bytes:
    """A valid zstd frame (RFC 8878) holding `data` in raw (stored) blocks,
    so tests can build zstd batches without a zstd library. Single-segment
    frame with an 8-byte content size, no checksum."""
    out = struct.pack("<I", 0xFD2FB528)
    out += bytes([0xE0])  # FCS field 8 bytes, single segment, no checksum, no dict
    out += struct.pack("<Q", len(data))
    max_block = 128 * 1024
    chunks = [data[i:i + max_block] for i in range(0, len(data), max_block)] or [b""]
    for i, chunk in enumerate(chunks):
        last = 1 if i == len(chunks) - 1 else 0
        header = last | (0 << 1) | (len(chunk) << 3)  # block type 0 = raw
        out += struct.pack("<I", header)[:3] + chunk
    return out


def record_batch_v2_zstd(records: list[Rec], **kw) -> bytes:
    """A RecordBatch v2 whose records are zstd-compressed (attributes codec 4)."""
    now = int(time.time() * 1000)
    stamps = [r.timestamp if r.timestamp is not None else now for r in records]
    base_ts = min(stamps)
    max_ts = max(stamps)
    recs = b"".join(_record(r, i, ts - base_ts) for i, (r, ts) in enumerate(zip(records, stamps)))
    attributes = kw.get("attributes", 0) | CODEC_ZSTD
    after_crc = (i16(attributes) + i32(len(records) - 1) + i64(base_ts) + i64(max_ts)
                 + i64(-1) + i16(-1) + i32(-1)
                 + i32(len(records)) + zstd_raw_frame(recs))
    rest = i32(-1) + i8(2) + struct.pack(">I", crc32c(after_crc)) + after_crc
    return i64(0) + i32(len(rest)) + rest


def batch_codecs(records: bytes) -> list[int]:
    """The codec (attributes bits 0-2) of every complete batch in `records`."""
    out = []
    pos = 0
    while pos + 61 <= len(records):
        (length,) = struct.unpack(">i", records[pos + 8:pos + 12])
        if pos + 12 + length > len(records):
            break
        (attributes,) = struct.unpack(">h", records[pos + 21:pos + 23])
        out.append(attributes & 0x07)
        pos += 12 + length
    return out


# ---------------------------------------------------------------------------
# Produce v3-v7 (the request body is the same; v5 adds log_start_offset to
# the response)
# ---------------------------------------------------------------------------


@dataclass
class ProducePartitionResult:
    topic: str
    partition: int
    error_code: int
    base_offset: int


def produce_request_v3(correlation_id: int, topic: str, partition: int,
                       records: bytes, acks: int = -1, timeout_ms: int = 10000,
                       version: int = 3, transactional_id: str | None = None) -> bytes:
    assert 3 <= version <= 7, version
    body = (string(transactional_id) + i16(acks) + i32(timeout_ms)
            + i32(1) + string(topic)
            + i32(1) + i32(partition) + kbytes(records))
    return request_header(PRODUCE, version, correlation_id) + body


def parse_produce_response_v3(resp: bytes, version: int = 3
                              ) -> tuple[int, list[ProducePartitionResult]]:
    r = Reader(resp)
    cid = r.i32()
    out = []
    for _ in range(r.i32()):
        name = r.string()
        for _ in range(r.i32()):
            p = r.i32()
            err = r.i16()
            base = r.i64()
            r.i64()  # log_append_time_ms
            if version >= 5:
                r.i64()  # log_start_offset
            out.append(ProducePartitionResult(name, p, err, base))
    r.i32()  # throttle_time_ms
    return cid, out


def produce_raw(addr: tuple[str, int], topic: str, partition: int, records: bytes,
                acks: int = -1, version: int = 3,
                transactional_id: str | None = None) -> ProducePartitionResult:
    with connect(addr) as s:
        cid, results = parse_produce_response_v3(
            roundtrip(s, produce_request_v3(7, topic, partition, records, acks,
                                            version=version,
                                            transactional_id=transactional_id)), version)
    assert cid == 7, f"correlation id mismatch: {cid}"
    assert len(results) == 1, results
    return results[0]


# ---------------------------------------------------------------------------
# Fetch v4-v10 (non-flexible)
# ---------------------------------------------------------------------------


@dataclass
class FetchResult:
    partition: int
    error_code: int
    high_watermark: int
    records: bytes
    last_stable_offset: int = -1
    # (producer_id, first_offset); None when the answer carries a null array
    aborted: list[tuple[int, int]] | None = None


def fetch_request(correlation_id: int, version: int, topic: str, partition: int,
                  offset: int, max_bytes: int = 1 << 20, max_wait_ms: int = 0,
                  isolation_level: int = 0) -> bytes:
    assert 4 <= version <= 10, version
    part = i32(partition)
    if version >= 9:
        part += i32(-1)  # current_leader_epoch: not known
    part += i64(offset)
    if version >= 5:
        part += i64(-1)  # log_start_offset (followers only)
    part += i32(max_bytes)
    body = i32(-1) + i32(max_wait_ms) + i32(1) + i32(max_bytes) + i8(isolation_level)
    if version >= 7:
        body += i32(0) + i32(-1)  # no fetch session
    body += i32(1) + string(topic) + i32(1) + part
    if version >= 7:
        body += i32(0)  # forgotten_topics_data
    return request_header(FETCH, version, correlation_id) + body


def parse_fetch_response(resp: bytes, version: int) -> tuple[int, list[FetchResult]]:
    r = Reader(resp)
    cid = r.i32()
    r.i32()  # throttle_time_ms
    if version >= 7:
        top_err = r.i16()
        assert top_err == 0, f"fetch top-level error {top_err}"
        r.i32()  # session_id
    out = []
    for _ in range(r.i32()):
        r.string()
        for _ in range(r.i32()):
            p = r.i32()
            err = r.i16()
            hw = r.i64()
            lso = r.i64()
            if version >= 5:
                r.i64()  # log_start_offset
            n_aborted = r.i32()
            aborted = None if n_aborted < 0 else [(r.i64(), r.i64()) for _ in range(n_aborted)]
            n = r.i32()
            recs = b"" if n < 0 else r.take(n)
            out.append(FetchResult(p, err, hw, recs, lso, aborted))
    return cid, out


def fetch_raw(addr: tuple[str, int], version: int, topic: str, partition: int,
              offset: int, isolation_level: int = 0) -> FetchResult:
    with connect(addr) as s:
        cid, results = parse_fetch_response(
            roundtrip(s, fetch_request(13, version, topic, partition, offset,
                                       isolation_level=isolation_level)), version)
    assert cid == 13, f"correlation id mismatch: {cid}"
    assert len(results) == 1, results
    return results[0]


# ---------------------------------------------------------------------------
# ListOffsets v7 (flexible; supports MAX_TIMESTAMP = -3)
# ---------------------------------------------------------------------------

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3


@dataclass
class ListOffsetsResult:
    partition: int
    error_code: int
    timestamp: int
    offset: int
    leader_epoch: int


def list_offsets_request_v7(correlation_id: int, topic: str, partition: int,
                            timestamp: int, isolation_level: int = 0) -> bytes:
    part = i32(partition) + i32(-1) + i64(timestamp) + TAGS_NONE
    top = compact_string(topic) + compact_array([part]) + TAGS_NONE
    body = i32(-1) + i8(isolation_level) + compact_array([top]) + TAGS_NONE
    return request_header(LIST_OFFSETS, 7, correlation_id, flexible=True) + body


def parse_list_offsets_v7(resp: bytes) -> tuple[int, list[ListOffsetsResult]]:
    r = Reader(resp)
    cid = r.i32()
    r.skip_tags()  # response header v1
    r.i32()  # throttle
    out = []
    for _ in range(r.compact_array_len()):
        r.compact_string()
        for _ in range(r.compact_array_len()):
            p = r.i32()
            err = r.i16()
            ts = r.i64()
            off = r.i64()
            epoch = r.i32()
            r.skip_tags()
            out.append(ListOffsetsResult(p, err, ts, off, epoch))
        r.skip_tags()
    r.skip_tags()
    return cid, out


def list_offsets_v7(addr: tuple[str, int], topic: str, partition: int,
                    timestamp: int, isolation_level: int = 0) -> ListOffsetsResult:
    with connect(addr) as s:
        cid, results = parse_list_offsets_v7(
            roundtrip(s, list_offsets_request_v7(11, topic, partition, timestamp,
                                                 isolation_level)))
    assert cid == 11
    assert len(results) == 1, results
    return results[0]


# ---------------------------------------------------------------------------
# InitProducerId v0 (non-flexible) and Produce on a caller's socket
# ---------------------------------------------------------------------------

INIT_PRODUCER_ID = 22
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47


def init_producer_id(addr: tuple[str, int], transactional_id: str | None = None,
                     ) -> tuple[int, int, int]:
    """(error_code, producer_id, producer_epoch) from InitProducerId v0."""
    body = string(transactional_id) + i32(60_000)
    with connect(addr) as s:
        r = Reader(roundtrip(s, request_header(INIT_PRODUCER_ID, 0, 21) + body))
    assert r.i32() == 21
    r.i32()  # throttle_time_ms
    return r.i16(), r.i64(), r.i16()


def produce_on(sock: socket.socket, correlation_id: int, topic: str, partition: int,
               records: bytes, version: int = 3) -> ProducePartitionResult:
    """Produce on an open connection and read the answer."""
    cid, results = parse_produce_response_v3(
        roundtrip(sock, produce_request_v3(correlation_id, topic, partition, records,
                                           version=version)), version)
    assert cid == correlation_id, (cid, correlation_id)
    assert len(results) == 1, results
    return results[0]


# ---------------------------------------------------------------------------
# Transactions (KIP-98): batches, WriteTxnMarkers v1, DescribeProducers v0
# ---------------------------------------------------------------------------

WRITE_TXN_MARKERS = 27
DESCRIBE_PRODUCERS = 61
NOT_LEADER_OR_FOLLOWER = 6
INVALID_TXN_STATE = 48
TRANSACTION_COORDINATOR_FENCED = 52
READ_COMMITTED = 1
ATTR_TRANSACTIONAL = 1 << 4
ATTR_CONTROL = 1 << 5


def txn_batch(values: list[bytes], pid: int, epoch: int, seq: int) -> bytes:
    """A transactional RecordBatch v2 of `values` from producer `pid`."""
    return record_batch_v2([Rec(v) for v in values], producer_id=pid,
                           producer_epoch=epoch, base_sequence=seq,
                           attributes=ATTR_TRANSACTIONAL)


@dataclass
class StoredBatch:
    base_offset: int
    last_offset: int
    attributes: int
    producer_id: int
    # control batches: "COMMIT" / "ABORT" and the coordinator epoch
    marker: str | None = None
    coordinator_epoch: int | None = None

    @property
    def control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)


def batches(records: bytes) -> list[StoredBatch]:
    """Every complete batch of a fetch answer, decoding control records (the
    key: version, type 0 abort / 1 commit; the value: version, coordinator
    epoch)."""
    out = []
    pos = 0
    while pos + 61 <= len(records):
        (base,) = struct.unpack(">q", records[pos:pos + 8])
        (length,) = struct.unpack(">i", records[pos + 8:pos + 12])
        end = pos + 12 + length
        if end > len(records):
            break
        (attributes,) = struct.unpack(">h", records[pos + 21:pos + 23])
        (delta,) = struct.unpack(">i", records[pos + 23:pos + 27])
        (pid,) = struct.unpack(">q", records[pos + 43:pos + 51])
        b = StoredBatch(base, base + delta, attributes, pid)
        if b.control:
            r = Reader(records[pos + 61:end])
            r.uvarint()  # record length
            r.i8()  # attributes
            r.uvarint()  # timestamp delta
            r.uvarint()  # offset delta
            klen = (lambda v: (v >> 1) ^ -(v & 1))(r.uvarint())
            key = r.take(klen)
            vlen = (lambda v: (v >> 1) ^ -(v & 1))(r.uvarint())
            value = r.take(vlen)
            (kver, kind) = struct.unpack(">hh", key[:4])
            assert kver == 0, key
            b.marker = {0: "ABORT", 1: "COMMIT"}[kind]
            (vver, b.coordinator_epoch) = struct.unpack(">hi", value[:6])
            assert vver == 0, value
        out.append(b)
        pos = end
    return out


def read_committed_view(res: FetchResult) -> list[int]:
    """Offsets of the data records a read_committed consumer delivers from a
    fetch answer, filtering by its aborted_transactions as Kafka's consumer
    does: a producer's batches are skipped from an aborted transaction's
    first offset up to that producer's next control batch."""
    aborted = sorted(res.aborted or [], key=lambda a: a[1])
    skipping: set[int] = set()
    out = []
    for b in batches(res.records):
        while aborted and aborted[0][1] <= b.base_offset:
            skipping.add(aborted.pop(0)[0])
        if b.control:
            skipping.discard(b.producer_id)
        elif not (b.transactional and b.producer_id in skipping):
            out.extend(range(b.base_offset, b.last_offset + 1))
    return out


def write_txn_markers_request(correlation_id: int,
                              markers: list[tuple[int, int, bool, list[tuple[str, list[int]]], int]]
                              ) -> bytes:
    """markers: (producer_id, producer_epoch, commit, [(topic, [partitions])],
    coordinator_epoch)."""
    items = []
    for pid, epoch, commit, topics, coord in markers:
        ts = [compact_string(t) + compact_array([i32(p) for p in ps]) + TAGS_NONE
              for t, ps in topics]
        items.append(i64(pid) + i16(epoch) + i8(1 if commit else 0) + compact_array(ts)
                     + i32(coord) + TAGS_NONE)
    body = compact_array(items) + TAGS_NONE
    return request_header(WRITE_TXN_MARKERS, 1, correlation_id, flexible=True) + body


def parse_write_txn_markers(resp: bytes) -> dict[tuple[int, str, int], int]:
    """{(producer_id, topic, partition): error_code}."""
    r = Reader(resp)
    r.i32()  # correlation id
    r.skip_tags()
    out = {}
    for _ in range(r.compact_array_len()):
        pid = r.i64()
        for _ in range(r.compact_array_len()):
            t = r.compact_string()
            for _ in range(r.compact_array_len()):
                p = r.i32()
                out[(pid, t, p)] = r.i16()
                r.skip_tags()
            r.skip_tags()
        r.skip_tags()
    r.skip_tags()
    return out


def write_txn_markers(addr: tuple[str, int], pid: int, epoch: int, commit: bool,
                      topic: str, partitions: list[int], coordinator_epoch: int = 0
                      ) -> dict[int, int]:
    """One marker; {partition: error_code}."""
    with connect(addr, timeout=40) as s:
        res = parse_write_txn_markers(roundtrip(s, write_txn_markers_request(
            31, [(pid, epoch, commit, [(topic, partitions)], coordinator_epoch)])))
    return {p: e for (_, _, p), e in res.items()}


@dataclass
class ProducerStateRow:
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int


def describe_producers(addr: tuple[str, int], topic: str, partition: int
                       ) -> tuple[int, list[ProducerStateRow]]:
    """(error_code, producers) of one partition, DescribeProducers v0."""
    body = compact_array([compact_string(topic) + compact_array([i32(partition)])
                          + TAGS_NONE]) + TAGS_NONE
    with connect(addr) as s:
        r = Reader(roundtrip(s, request_header(DESCRIBE_PRODUCERS, 0, 41, flexible=True)
                             + body))
    assert r.i32() == 41
    r.skip_tags()
    r.i32()  # throttle
    err, rows = -1, []
    for _ in range(r.compact_array_len()):
        r.compact_string()
        for _ in range(r.compact_array_len()):
            r.i32()
            err = r.i16()
            r.compact_string()  # error message
            for _ in range(r.compact_array_len()):
                rows.append(ProducerStateRow(r.i64(), r.i32(), r.i32(), r.i64(), r.i32(),
                                             r.i64()))
                r.skip_tags()
            r.skip_tags()
        r.skip_tags()
    r.skip_tags()
    return err, rows
