"""Fetch answers sent from the segment files (sendfile) serve exactly the
stored bytes: reading a partition of many sealed segments and its active one
from offset 0 with Fetch v10 (zero-copy) gives, byte for byte, the segment
files on disk concatenated; Fetch v4 (the copy path, which reads the records
into memory) and read_committed give the same bytes, at every offset and with
an answer cut inside a batch; a real client reads every record back."""

import re

import pytest

import kafka_wire as kw
from conftest import assert_healthy, consume_all, create_topic

pytestmark = pytest.mark.substrates("local", "weakfs")

SEGMENT = re.compile(r"^\d{20}-e\d+\.log$")


def payload(i: int) -> bytes:
    return bytes((i * 7 + j) % 251 for j in range(200 + i % 300))


def complete_batches(records: bytes) -> list[tuple[int, int, bytes]]:
    """(base offset, last offset, bytes) of each whole batch."""
    out, pos = [], 0
    while pos + 61 <= len(records):
        base = int.from_bytes(records[pos:pos + 8], "big", signed=True)
        length = int.from_bytes(records[pos + 8:pos + 12], "big", signed=True)
        delta = int.from_bytes(records[pos + 23:pos + 27], "big", signed=True)
        end = pos + 12 + length
        if end > len(records):
            break
        out.append((base, base + delta, records[pos:end]))
        pos = end
    return out


@pytest.mark.timeout(120)
def test_fetched_bytes_are_the_segment_files(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 1, config={"segment.bytes": "16384"})
    n_batches, per_batch = 120, 3
    for b in range(n_batches):
        recs = [kw.Rec(payload(b * per_batch + k), b"k%d" % b) for k in range(per_batch)]
        r = kw.produce_raw(broker.addr, topic_name, 0, kw.record_batch_v2(recs))
        assert r.error_code == kw.NONE, r
    end = n_batches * per_batch

    # Fetch everything from 0 with the zero-copy path: each answer holds the
    # rest of one segment (a fetch never spans two).
    served, offset, answers = b"", 0, 0
    while offset < end:
        f = kw.fetch_raw(broker.addr, 10, topic_name, 0, offset)
        assert f.error_code == kw.NONE, f
        assert f.high_watermark == end, f
        got = complete_batches(f.records)
        assert got and b"".join(x[2] for x in got) == f.records, "whole batches only"
        served += f.records
        offset = got[-1][1] + 1
        answers += 1
    assert answers > 5, f"{answers} answers: the records span many segments"

    pdir = broker.partition_dir(topic_name, 0)
    files = sorted(p for p in pdir.iterdir() if SEGMENT.match(p.name))
    assert len(files) > 5, files
    on_disk = b"".join(p.read_bytes() for p in files)
    assert served == on_disk, (len(served), len(on_disk))

    # The copy path (v4) and read_committed serve the same bytes, from every
    # batch's first offset and from inside batches.
    for offset in range(0, end, 7):
        zc = kw.fetch_raw(broker.addr, 10, topic_name, 0, offset)
        for version, isolation in ((4, 0), (10, 1), (4, 1)):
            other = kw.fetch_raw(broker.addr, version, topic_name, 0, offset, isolation)
            assert (other.error_code, other.records) == (zc.error_code, zc.records), \
                (offset, version, isolation)

    # An answer cut inside a batch (max_bytes below the first batch's size
    # serves the whole first batch, KIP-74; a larger one cuts the next).
    with kw.connect(broker.addr) as s:
        for max_bytes in (1, 700, 1500, 5000):
            answers = []
            for version in (10, 4):
                req = kw.fetch_request(21, version, topic_name, 0, 3, max_bytes=max_bytes)
                _, res = kw.parse_fetch_response(kw.roundtrip(s, req), version)
                answers.append(res[0].records)
            assert answers[0] == answers[1], max_bytes
            assert answers[0], max_bytes

    # A real client (librdkafka, Fetch v11+) decodes all of it.
    values = [m.value for m in consume_all(broker.bootstrap, topic_name, [0], timeout=30)[0]]
    assert values == [payload(i) for i in range(end)]
    assert_healthy(broker)
