"""zstd and clients older than KIP-110, on raw sockets with hand-encoded
frames: a Produce below v7 carrying a zstd batch is refused with
UNSUPPORTED_COMPRESSION_TYPE (76) for that partition, and a Fetch below v10
is never served a zstd batch (76 when the next batch to serve is zstd; the
batches before it otherwise). Newer versions and a real client see
everything."""

import kafka_wire as kw
from conftest import assert_healthy, consume_all, create_topic


def test_zstd_produce_needs_v7(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 1)
    zstd = kw.record_batch_v2_zstd([kw.Rec(b"z1", b"k"), kw.Rec(b"z2")])
    for v in (3, 6):
        r = kw.produce_raw(broker.addr, topic_name, 0, zstd, version=v)
        assert r.error_code == kw.UNSUPPORTED_COMPRESSION_TYPE, (v, r)
    # Nothing of the refused batches was stored.
    r = kw.produce_raw(broker.addr, topic_name, 0, kw.record_batch_v2([kw.Rec(b"plain")]))
    assert (r.error_code, r.base_offset) == (kw.NONE, 0), r
    r = kw.produce_raw(broker.addr, topic_name, 0, zstd, version=7)
    assert (r.error_code, r.base_offset) == (kw.NONE, 1), r
    assert_healthy(broker)


def test_fetch_below_v10_never_serves_zstd(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 1)
    plain = kw.record_batch_v2([kw.Rec(b"plain")])
    zstd = kw.record_batch_v2_zstd([kw.Rec(b"z1", b"k"), kw.Rec(b"z2")])
    assert kw.produce_raw(broker.addr, topic_name, 0, plain).error_code == kw.NONE
    assert kw.produce_raw(broker.addr, topic_name, 0, zstd, version=7).error_code == kw.NONE
    assert kw.produce_raw(broker.addr, topic_name, 0, plain).error_code == kw.NONE

    for v in (4, 9):
        # From offset 0: the plain batch before the zstd one, nothing after.
        f = kw.fetch_raw(broker.addr, v, topic_name, 0, 0)
        assert f.error_code == kw.NONE, (v, f)
        assert kw.batch_codecs(f.records) == [0], (v, f)
        assert f.high_watermark == 4, (v, f)
        # From the zstd batch: the specific error, no bytes.
        f = kw.fetch_raw(broker.addr, v, topic_name, 0, 1)
        assert f.error_code == kw.UNSUPPORTED_COMPRESSION_TYPE, (v, f)
        assert f.records == b"", (v, f)
        # Past it: served again.
        f = kw.fetch_raw(broker.addr, v, topic_name, 0, 3)
        assert f.error_code == kw.NONE, (v, f)
        assert kw.batch_codecs(f.records) == [0], (v, f)

    f = kw.fetch_raw(broker.addr, 10, topic_name, 0, 0)
    assert f.error_code == kw.NONE, f
    assert kw.batch_codecs(f.records) == [0, kw.CODEC_ZSTD, 0], f

    # A real client decodes the zstd batch: the frame and records are intact.
    values = [m.value for m in consume_all(broker.bootstrap, topic_name, [0], timeout=30)[0]]
    assert values == [b"plain", b"z1", b"z2", b"plain"], values
    assert_healthy(broker)
