"""Topic-level compression.type (librdkafka 0081): a topic whose
compression.type is not `producer` stores every batch in its codec, as
Kafka's log validator does. A batch sent with another codec (a real
producer's, or an uncompressed one on a raw socket) is decompressed and
rebuilt with the topic's before it is appended: the stored batch carries
the topic's codec bits, and records, keys, headers, timestamps and the
producer's id, epoch and sequence numbers are unchanged (confluent-kafka
and kcat read them back; idempotent and transactional producers keep
working). Values Kafka refuses answer INVALID_CONFIG (40); a batch that
inflates past the broker's bound answers MESSAGE_TOO_LARGE (10) and the
broker carries on."""

import struct
import subprocess
import time
import zlib

import pytest

import kafka_wire as kw
from conftest import admin, assert_healthy, consume_all, create_topic, producer_conf

CODEC_ID = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
# For each topic codec, a producer codec that differs from it.
PRODUCER_CODEC = {"uncompressed": "zstd", "gzip": "lz4", "snappy": "gzip",
                  "lz4": "snappy", "zstd": "none"}
MESSAGE_TOO_LARGE = 10
TS0 = 1_700_000_000_000


def raw_batches(records: bytes) -> list[dict]:
    """Header fields of every complete batch of a fetch answer."""
    out, pos = [], 0
    while pos + 61 <= len(records):
        (length,) = struct.unpack(">i", records[pos + 8:pos + 12])
        end = pos + 12 + length
        if end > len(records):
            break
        (attrs, delta, base_ts, max_ts, pid, epoch, seq, count) = struct.unpack(
            ">hiqqqhii", records[pos + 21:pos + 61])
        crc = struct.unpack(">I", records[pos + 17:pos + 21])[0]
        assert crc == kw.crc32c(records[pos + 21:end]), "stored batch CRC"
        out.append(dict(base=struct.unpack(">q", records[pos:pos + 8])[0],
                        codec=attrs & 7, attrs=attrs, count=count, base_ts=base_ts,
                        max_ts=max_ts, pid=pid, epoch=epoch, seq=seq,
                        payload=records[pos + 61:end]))
        pos = end
    return out


def decode_records(raw: bytes, count: int) -> list[tuple]:
    """(offset delta, timestamp delta, key, value, headers) of `count`
    uncompressed records."""
    r = kw.Reader(raw)

    def zz():
        v = r.uvarint()
        return (v >> 1) ^ -(v & 1)

    def nbytes():
        n = zz()
        return None if n < 0 else r.take(n)

    out = []
    for _ in range(count):
        zz()  # length
        r.i8()
        ts, off = zz(), zz()
        key, value = nbytes(), nbytes()
        headers = [(r.take(zz()).decode(), nbytes()) for _ in range(zz())]
        out.append((off, ts, key, value, headers))
    assert r.remaining() == 0
    return out


def fetch_all(broker, topic: str, version: int = 10) -> kw.FetchResult:
    f = kw.fetch_raw(broker.addr, version, topic, 0, 0)
    assert f.error_code == kw.NONE, f
    return f


def kcat_read(broker, topic: str, n: int) -> list[str]:
    out = subprocess.run(
        ["kcat", "-C", "-b", broker.bootstrap, "-t", topic, "-p", "0", "-o", "beginning",
         "-c", str(n), "-e", "-q", "-f", "%k|%s|%T|%h\n"],
        capture_output=True, timeout=60, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


@pytest.mark.parametrize("codec", list(CODEC_ID))
def test_batches_are_stored_in_the_topic_codec(broker, topic_name, codec):
    from confluent_kafka import Producer
    create_topic(broker.bootstrap, topic_name, 1, config={"compression.type": codec})
    # A real producer with another codec: one batch of 50 records.
    p = Producer(producer_conf(broker.bootstrap, **{
        "compression.type": PRODUCER_CODEC[codec], "linger.ms": 50}))
    sent = [(b"k%d" % i if i % 4 else None, b"value-%d " % i * (i % 7 + 1),
             [("h", b"x%d" % i), ("n", None)], TS0 + (i * 37) % 101) for i in range(50)]
    for k, v, h, ts in sent:
        p.produce(topic_name, key=k, value=v, headers=h, timestamp=ts, partition=0)
    assert p.flush(30) == 0
    # And an uncompressed batch on a raw socket, Produce v3 (before
    # KIP-110: the topic's zstd is the broker's choice, not the client's).
    raw = [kw.Rec(b"raw-%d" % i, key=b"rk", headers=[("r", b"%d" % i)], timestamp=TS0 + 5 - i)
           for i in range(3)]
    r = kw.produce_raw(broker.addr, topic_name, 0, kw.record_batch_v2(raw), version=3)
    assert (r.error_code, r.base_offset) == (kw.NONE, 50), r

    f = fetch_all(broker, topic_name)
    stored = raw_batches(f.records)
    assert [b["codec"] for b in stored] == [CODEC_ID[codec]] * len(stored), stored
    assert sum(b["count"] for b in stored) == 53
    last = stored[-1]
    assert (last["base"], last["count"], last["base_ts"], last["max_ts"]) == (50, 3, TS0 + 3, TS0 + 5)
    # Where Python can read the codec, the rebuilt records are the sent ones.
    if codec in ("uncompressed", "gzip"):
        body = last["payload"] if codec == "uncompressed" else zlib.decompress(last["payload"], 47)
        got = decode_records(body, 3)
        assert got == [(i, 2 - i, b"rk", b"raw-%d" % i, [("r", b"%d" % i)]) for i in range(3)], got

    # confluent-kafka reads every record back as sent.
    msgs = consume_all(broker.bootstrap, topic_name, [0])[0]
    assert [(m.key, m.value, list(m.headers), m.timestamp) for m in msgs[:50]] == \
        [(k, v, h, ts) for k, v, h, ts in sent]
    assert [(m.key, m.value, m.timestamp) for m in msgs[50:]] == \
        [(b"rk", b"raw-%d" % i, TS0 + 5 - i) for i in range(3)]
    # kcat (librdkafka 2.0) too.
    lines = kcat_read(broker, topic_name, 53)
    assert lines[1] == f"k1|{(b'value-1 ' * 2).decode()}|{TS0 + 37}|h=x1,n=NULL", lines[1]
    assert lines[52] == f"rk|raw-2|{TS0 + 3}|r=2", lines[52]
    assert len(lines) == 53
    assert_healthy(broker)


def test_zstd_topic_and_fetch_below_v10(broker, topic_name):
    """A batch the broker rebuilt as zstd is zstd to the fetch path too: a
    Fetch below v10 gets UNSUPPORTED_COMPRESSION_TYPE, never the bytes."""
    create_topic(broker.bootstrap, topic_name, 1, config={"compression.type": "zstd"})
    r = kw.produce_raw(broker.addr, topic_name, 0, kw.record_batch_v2([kw.Rec(b"plain")]))
    assert r.error_code == kw.NONE, r
    f = kw.fetch_raw(broker.addr, 9, topic_name, 0, 0)
    assert (f.error_code, f.records) == (kw.UNSUPPORTED_COMPRESSION_TYPE, b""), f
    assert kw.batch_codecs(fetch_all(broker, topic_name).records) == [kw.CODEC_ZSTD]


def test_idempotent_and_transactional_producers_keep_their_sequences(broker, topic_name):
    from confluent_kafka import Producer
    create_topic(broker.bootstrap, topic_name, 1, config={"compression.type": "lz4"})
    p = Producer(producer_conf(broker.bootstrap, **{
        "enable.idempotence": True, "compression.type": "none", "linger.ms": 0}))
    sizes = [5, 1, 7]
    for n in sizes:
        for i in range(n):
            p.produce(topic_name, value=b"i%d" % i, partition=0)
        assert p.flush(30) == 0
    stored = raw_batches(fetch_all(broker, topic_name).records)
    assert all(b["codec"] == CODEC_ID["lz4"] for b in stored), stored
    pid = stored[0]["pid"]
    assert pid >= 0 and all(b["pid"] == pid and b["epoch"] == stored[0]["epoch"] for b in stored)
    # Base sequences follow the records: each batch starts where the last ended.
    seqs = [(b["seq"], b["count"]) for b in stored]
    assert all(s == prev_s + prev_n for (prev_s, prev_n), (s, _) in zip(seqs, seqs[1:])), seqs
    assert seqs[0][0] == 0 and sum(n for _, n in seqs) == sum(sizes)

    t = Producer(producer_conf(broker.bootstrap, **{
        "transactional.id": f"txn-{topic_name}", "compression.type": "gzip"}))
    t.init_transactions(30)
    t.begin_transaction()
    for i in range(4):
        t.produce(topic_name, value=b"t%d" % i, partition=0)
    t.commit_transaction(30)
    # The coordinator writes the marker after it answers EndTxn.
    deadline = time.monotonic() + 30
    while True:
        stored = raw_batches(fetch_all(broker, topic_name).records)
        if any(b["attrs"] & kw.ATTR_CONTROL for b in stored) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    data = [b for b in stored if b["attrs"] & kw.ATTR_TRANSACTIONAL and not b["attrs"] & kw.ATTR_CONTROL]
    control = [b for b in stored if b["attrs"] & kw.ATTR_CONTROL]
    assert data and all(b["codec"] == CODEC_ID["lz4"] and b["seq"] == 0 for b in data), data
    assert len(control) == 1 and control[0]["codec"] == 0, control
    values = [m.value for m in consume_all(broker.bootstrap, topic_name, [0])[0]]
    assert values[-4:] == [b"t0", b"t1", b"t2", b"t3"], values


def test_refused_values_and_alter_describe(broker, topic_name):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (AlterConfigOpType, ConfigEntry, ConfigResource,
                                       NewTopic)
    a = admin(broker.bootstrap)
    bad = [{"compression.type": "none"}, {"compression.type": "brotli"},
           {"compression.type": "GZIP"}, {"compression.gzip.level": "10"},
           {"compression.gzip.level": "0"}, {"compression.lz4.level": "18"},
           {"compression.zstd.level": "23"}]
    for i, config in enumerate(bad):
        fs = a.create_topics([NewTopic(f"{topic_name}-bad{i}", 1, 1, config=config)],
                             request_timeout=15)
        with pytest.raises(KafkaException) as e:
            list(fs.values())[0].result(15)
        assert e.value.args[0].code() == kw.INVALID_CONFIG, (config, e.value)

    create_topic(broker.bootstrap, topic_name, 1,
                 config={"compression.type": "gzip", "compression.gzip.level": "1"})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic_name)

    def described():
        got = list(a.describe_configs([res]).values())[0].result(15)
        return {k: got[k].value for k in ("compression.type", "compression.gzip.level",
                                          "compression.zstd.level")}

    assert described() == {"compression.type": "gzip", "compression.gzip.level": "1",
                           "compression.zstd.level": "3"}
    ops = [ConfigEntry("compression.type", "zstd",
                       incremental_operation=AlterConfigOpType.SET),
           ConfigEntry("compression.zstd.level", "19",
                       incremental_operation=AlterConfigOpType.SET)]
    list(a.incremental_alter_configs([ConfigResource(
        ConfigResource.Type.TOPIC, topic_name, incremental_configs=ops)]).values())[0].result(15)
    assert described() == {"compression.type": "zstd", "compression.gzip.level": "1",
                           "compression.zstd.level": "19"}
    bad_op = [ConfigEntry("compression.type", "deflate",
                          incremental_operation=AlterConfigOpType.SET)]
    with pytest.raises(KafkaException) as e:
        list(a.incremental_alter_configs([ConfigResource(
            ConfigResource.Type.TOPIC, topic_name, incremental_configs=bad_op)]).values())[0].result(15)
    assert e.value.args[0].code() == kw.INVALID_CONFIG, e.value
    # The altered codec reaches the append path.
    r = kw.produce_raw(broker.addr, topic_name, 0, kw.record_batch_v2([kw.Rec(b"after")]))
    assert r.error_code == kw.NONE, r
    assert kw.batch_codecs(fetch_all(broker, topic_name).records) == [kw.CODEC_ZSTD]


def gzip_bomb(inflated: int) -> bytes:
    """Gzip members of zeros laid end to end (one member is cheap to make;
    a gzip reader reads on across members)."""
    member_size = 16 << 20
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    member = c.compress(bytes(member_size)) + c.flush()
    return member * (inflated // member_size)


def test_a_decompression_bomb_is_refused_and_the_broker_carries_on(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 1, config={"compression.type": "lz4"})
    good = kw.record_batch_v2([kw.Rec(b"x")])
    payload = gzip_bomb(1 << 30)  # 1 GiB of zeros in ~1 MiB
    assert len(payload) < 2 << 20
    after_crc = good[21:57] + struct.pack(">i", 1) + payload
    after_crc = struct.pack(">h", 1) + after_crc[2:]  # codec gzip
    rest = good[12:17] + struct.pack(">I", kw.crc32c(after_crc)) + after_crc
    bomb = good[:8] + struct.pack(">i", len(rest)) + rest
    before = int(broker.proc_status("VmHWM").split()[0])
    r = kw.produce_raw(broker.addr, topic_name, 0, bomb)
    assert r.error_code == MESSAGE_TOO_LARGE, r
    grew_mib = (int(broker.proc_status("VmHWM").split()[0]) - before) >> 10
    # Bounded by --max-request-bytes (100 MiB), not by the 1 GiB inflated.
    print(f"peak RSS grew {grew_mib} MiB for the bomb")
    assert grew_mib < 256, grew_mib
    r = kw.produce_raw(broker.addr, topic_name, 0, good)
    assert (r.error_code, r.base_offset) == (kw.NONE, 0), r
    assert_healthy(broker)
