"""Transactions, the partition side (KIP-98): transactional batches are
accepted, the test plays the transaction coordinator and sends the
COMMIT/ABORT markers itself (WriteTxnMarkers), the last stable offset is
held by open transactions, read_committed Fetch stops at it and lists the
aborted transactions — which real clients (confluent-kafka, kafka-python)
use to drop the aborted records — and an open transaction survives kill -9
of its leader and a takeover. DescribeProducers shows the state.

These tests play the coordinator themselves with idempotent producer ids,
so the brokers run with KIP-890 verification off
(`--transaction-partition-verification-enable false`, Kafka's
`transaction.partition.verification.enable`): no coordinator knows these
transactions. The verification is tested in test_transactions.py.
"""

from __future__ import annotations

import time

import pytest

import kafka_wire as kw
from cluster import FAST, create_everywhere, leaders, wait_leaders
from conftest import client_conf, create_topic, wait_until

FETCH_V = 10

NO_VERIFY = ["--transaction-partition-verification-enable", "false"]
pytestmark = pytest.mark.broker_args(*NO_VERIFY)


def lso(addr, topic: str, level: int = kw.READ_COMMITTED) -> int:
    r = kw.list_offsets_v7(addr, topic, 0, kw.LATEST_TIMESTAMP, isolation_level=level)
    assert r.error_code == 0, r
    return r.offset


def produce_txn(addr, topic: str, values: list[bytes], pid: int, seq: int,
                epoch: int = 0) -> int:
    r = kw.produce_raw(addr, topic, 0, kw.txn_batch(values, pid, epoch, seq),
                       transactional_id=f"tx-{pid}")
    assert r.error_code == 0, r
    return r.base_offset


def produce_plain(addr, topic: str, value: bytes) -> int:
    r = kw.produce_raw(addr, topic, 0, kw.record_batch_v2([kw.Rec(value)]))
    assert r.error_code == 0, r
    return r.base_offset


def test_marker_from_an_older_coordinator_epoch_is_fenced(broker, topic_name):
    """The partition remembers the coordinator epoch of the last marker it
    accepted for a producer; a marker from an older one (a zombie
    coordinator whose shard moved) is refused with
    TRANSACTION_COORDINATOR_FENCED (52) and writes nothing, as Kafka."""
    create_topic(broker.bootstrap, topic_name, 1)
    pid = kw.init_producer_id(broker.addr)[1]
    assert produce_txn(broker.addr, topic_name, [b"a"], pid, 0) == 0
    assert kw.write_txn_markers(broker.addr, pid, 0, True, topic_name, [0], 7) == {0: 0}
    assert produce_txn(broker.addr, topic_name, [b"b"], pid, 1) == 2
    hw = lso(broker.addr, topic_name, level=0)
    codes = kw.write_txn_markers(broker.addr, pid, 0, False, topic_name, [0], 6)
    assert codes == {0: kw.TRANSACTION_COORDINATOR_FENCED}, codes
    assert lso(broker.addr, topic_name, level=0) == hw, "the fenced marker wrote nothing"
    assert lso(broker.addr, topic_name) == 2, "the transaction is still open"
    # The current (or a newer) coordinator epoch closes it.
    assert kw.write_txn_markers(broker.addr, pid, 0, True, topic_name, [0], 8) == {0: 0}
    assert lso(broker.addr, topic_name) == hw + 1
    err, rows = kw.describe_producers(broker.addr, topic_name, 0)
    assert err == 0 and rows[0].coordinator_epoch == 8, rows


def values_confluent(bs: str, topic: str, level: str, expect: int) -> list[bytes]:
    """Every value a confluent-kafka consumer at `level` delivers (until
    `expect` values or a quiet second after the end)."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer(client_conf(bs, **{"group.id": f"g-{time.monotonic_ns()}",
                                    "enable.auto.commit": False,
                                    "isolation.level": level,
                                    "auto.offset.reset": "earliest"}))
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        out: list[bytes] = []
        deadline = time.monotonic() + 30
        quiet_since = None
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                if len(out) >= expect:
                    quiet_since = quiet_since or time.monotonic()
                    if time.monotonic() - quiet_since > 1.0:
                        break
                continue
            assert not m.error(), m.error()
            out.append(m.value())
            quiet_since = None
        return out
    finally:
        c.close()


def values_kafka_python(bs: str, topic: str, level: str) -> list[bytes]:
    from kafka import KafkaConsumer, TopicPartition
    c = KafkaConsumer(bootstrap_servers=bs, isolation_level=level,
                      enable_auto_commit=False, consumer_timeout_ms=3000,
                      auto_offset_reset="earliest", api_version_auto_timeout_ms=10000)
    try:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        c.seek(tp, 0)
        return [m.value for m in c]
    finally:
        c.close()


def test_markers_last_stable_offset_and_read_committed(broker, topic_name):
    """Two transactions and plain records interleaved; the LSO stays at the
    first open transaction's first offset until its marker is durable;
    COMMIT, then ABORT (sent twice: idempotent); read_committed sees exactly
    the committed and plain records — by the raw answer's
    aborted_transactions and by two real clients — read_uncommitted sees
    everything. A marker of an older producer epoch is refused with 47."""
    create_topic(broker.bootstrap, topic_name, 1)
    a, b, c = (kw.init_producer_id(broker.addr)[1] for _ in range(3))
    assert produce_plain(broker.addr, topic_name, b"p0") == 0
    assert produce_txn(broker.addr, topic_name, [b"a1", b"a2"], a, 0) == 1
    assert produce_txn(broker.addr, topic_name, [b"b1"], b, 0) == 3
    assert produce_plain(broker.addr, topic_name, b"p1") == 4
    # The LSO is held by A's transaction (first offset 1).
    assert lso(broker.addr, topic_name) == 1
    assert lso(broker.addr, topic_name, level=0) == 5
    res = kw.fetch_raw(broker.addr, FETCH_V, topic_name, 0, 0, isolation_level=1)
    assert (res.error_code, res.high_watermark, res.last_stable_offset) == (0, 5, 1), res
    assert kw.read_committed_view(res) == [0]
    res = kw.fetch_raw(broker.addr, FETCH_V, topic_name, 0, 0)
    assert res.last_stable_offset == 1, "the LSO is answered at read_uncommitted too"
    assert [x.base_offset for x in kw.batches(res.records)] == [0, 1, 3, 4]
    # A plain batch from a producer mid-transaction: INVALID_TXN_STATE.
    r = kw.produce_raw(broker.addr, topic_name, 0,
                       kw.record_batch_v2([kw.Rec(b"x")], producer_id=a, producer_epoch=0,
                                          base_sequence=2))
    assert r.error_code == kw.INVALID_TXN_STATE, r
    # DescribeProducers: both transactions open.
    err, rows = kw.describe_producers(broker.addr, topic_name, 0)
    assert err == 0
    by = {r.producer_id: r for r in rows}
    assert by[a].current_txn_start_offset == 1 and by[b].current_txn_start_offset == 3, rows
    assert (by[a].producer_epoch, by[a].last_sequence) == (0, 1), rows

    # COMMIT A: answered only once durable, and the LSO moved to B's start.
    assert kw.write_txn_markers(broker.addr, a, 0, True, topic_name, [0], 5) == {0: 0}
    assert lso(broker.addr, topic_name) == 3
    # ABORT B, then the coordinator's re-send of the same marker.
    for _ in range(2):
        assert kw.write_txn_markers(broker.addr, b, 0, False, topic_name, [0], 5) == {0: 0}
    hw = lso(broker.addr, topic_name, level=0)
    assert lso(broker.addr, topic_name) == hw == 8
    res = kw.fetch_raw(broker.addr, FETCH_V, topic_name, 0, 0, isolation_level=1)
    assert res.aborted == [(b, 3)], res.aborted
    assert kw.read_committed_view(res) == [0, 1, 2, 4]
    markers = [(x.producer_id, x.marker, x.coordinator_epoch)
               for x in kw.batches(res.records) if x.control]
    assert markers == [(a, "COMMIT", 5), (b, "ABORT", 5), (b, "ABORT", 5)], markers
    # Fetching from past the abort marker: no aborted transaction overlaps.
    assert kw.fetch_raw(broker.addr, FETCH_V, topic_name, 0, 7, isolation_level=1).aborted == []
    err, rows = kw.describe_producers(broker.addr, topic_name, 0)
    by = {r.producer_id: r for r in rows}
    assert by[a].current_txn_start_offset == -1 and by[b].current_txn_start_offset == -1
    assert by[b].coordinator_epoch == 5

    # Producer C at epoch 1: a marker of epoch 0 is fenced, epoch 1 commits.
    assert produce_txn(broker.addr, topic_name, [b"c1"], c, 0, epoch=1) == 8
    codes = kw.write_txn_markers(broker.addr, c, 0, True, topic_name, [0])
    assert codes == {0: kw.INVALID_PRODUCER_EPOCH}, codes
    assert lso(broker.addr, topic_name) == 8
    assert kw.write_txn_markers(broker.addr, c, 1, True, topic_name, [0]) == {0: 0}
    # Unknown partitions are named as such.
    codes = kw.write_txn_markers(broker.addr, c, 1, True, topic_name, [7])
    assert codes == {7: kw.UNKNOWN_TOPIC_OR_PARTITION}, codes

    # Real clients: read_committed drops the aborted b1, read_uncommitted not.
    committed = [b"p0", b"a1", b"a2", b"p1", b"c1"]
    everything = [b"p0", b"a1", b"a2", b"b1", b"p1", b"c1"]
    assert values_confluent(broker.bootstrap, topic_name, "read_committed", 5) == committed
    assert values_confluent(broker.bootstrap, topic_name, "read_uncommitted", 6) == everything
    assert values_kafka_python(broker.bootstrap, topic_name, "read_committed") == committed
    assert values_kafka_python(broker.bootstrap, topic_name, "read_uncommitted") == everything


def test_a_consumer_waits_at_the_lso_until_the_commit(broker, topic_name):
    """A read_committed confluent-kafka consumer does not see a transaction's
    records before its COMMIT, and sees them after it."""
    create_topic(broker.bootstrap, topic_name, 1)
    pid = kw.init_producer_id(broker.addr)[1]
    produce_plain(broker.addr, topic_name, b"before")
    produce_txn(broker.addr, topic_name, [b"t1", b"t2"], pid, 0)
    produce_plain(broker.addr, topic_name, b"after")
    assert values_confluent(broker.bootstrap, topic_name, "read_committed", 1) == [b"before"]
    assert kw.write_txn_markers(broker.addr, pid, 0, True, topic_name, [0]) == {0: 0}
    assert values_confluent(broker.bootstrap, topic_name, "read_committed", 4) == \
        [b"before", b"t1", b"t2", b"after"]


@pytest.mark.broker_args("--segment-bytes", "1024")
def test_aborted_index_across_rolls_and_a_restart(broker, topic_name):
    """Aborted transactions spread over many segments (each roll writes the
    sealed segment's .txnindex) are all listed after a kill -9 and restart
    (segment files read back, the old active segment rebuilt from its
    bytes), and a real read_committed consumer drops exactly them."""
    create_topic(broker.bootstrap, topic_name, 1)
    pids = [kw.init_producer_id(broker.addr)[1] for _ in range(6)]
    want = []
    for i, pid in enumerate(pids):
        vals = [f"{i}-{j}".encode() * 20 for j in range(3)]
        produce_txn(broker.addr, topic_name, vals, pid, 0)
        commit = i % 2 == 0
        assert kw.write_txn_markers(broker.addr, pid, 0, commit, topic_name, [0]) == {0: 0}
        if commit:
            want += vals
    pdir = broker.partition_dir(topic_name, 0)
    assert any(p.name.endswith(".txnindex") for p in pdir.iterdir()), list(pdir.iterdir())
    broker.kill9()
    broker.start()
    wait_until(lambda: kw.produce_raw(broker.addr, topic_name, 0,
                                      kw.record_batch_v2([kw.Rec(b"end")])).error_code == 0,
               timeout=20, what="the partition serves again")
    want.append(b"end")
    assert values_confluent(broker.bootstrap, topic_name, "read_committed", len(want)) == want


@pytest.mark.substrates("local", "weakfs")
@pytest.mark.timeout(120)
def test_kill9_of_the_leader_mid_transaction(broker_factory, topic_name):
    """Two brokers on one volume. A transaction is open on partition 0 when
    its leader is killed with -9: the broker that takes the partition over
    rebuilds the open transaction (snapshot + log tail), so the LSO is still
    held and DescribeProducers shows it; the ABORT marker sent to the new
    leader closes it, and read_committed drops it."""
    bs = broker_factory.cluster(2, FAST + NO_VERIFY)
    create_everywhere(bs, topic_name, 1)
    by_id = {b.broker_id: b for b in bs}
    leader = by_id[leaders(bs, topic_name)[0]]
    pid = kw.init_producer_id(leader.addr)[1]
    assert produce_plain(leader.addr, topic_name, b"p0") == 0
    assert produce_txn(leader.addr, topic_name, [b"t1", b"t2"], pid, 0) == 1
    assert produce_plain(leader.addr, topic_name, b"p1") == 3
    assert lso(leader.addr, topic_name) == 1
    leader.kill9()
    other = next(b for b in bs if b is not leader)
    wait_leaders([other], topic_name, 1, {other.broker_id})

    def takeover_lso():
        r = kw.list_offsets_v7(other.addr, topic_name, 0, kw.LATEST_TIMESTAMP,
                               isolation_level=kw.READ_COMMITTED)
        return r if r.error_code == 0 else None

    r = wait_until(takeover_lso, timeout=30, what="the new leader serves")
    assert r.offset == 1, "the open transaction still holds the LSO after the takeover"
    assert lso(other.addr, topic_name, level=0) == 4
    err, rows = kw.describe_producers(other.addr, topic_name, 0)
    assert err == 0 and [(x.producer_id, x.current_txn_start_offset) for x in rows] == \
        [(pid, 1)], rows
    # The old leader is gone: the marker goes to the new one.
    assert kw.write_txn_markers(other.addr, pid, 0, False, topic_name, [0], 2) == {0: 0}
    assert lso(other.addr, topic_name) == 5
    res = kw.fetch_raw(other.addr, FETCH_V, topic_name, 0, 0, isolation_level=1)
    assert res.aborted == [(pid, 1)]
    assert kw.read_committed_view(res) == [0, 3]
    leader.start()
    wait_leaders(bs, topic_name, 1, {0, 1})
    now = by_id[leaders(bs, topic_name)[0]]
    # A marker sent to a broker that does not lead the partition is refused.
    not_leader = next(b for b in bs if b is not now)
    codes = kw.write_txn_markers(not_leader.addr, pid, 0, False, topic_name, [0])
    assert codes == {0: kw.NOT_LEADER_OR_FOLLOWER}, codes
    assert values_confluent(",".join(b.bootstrap for b in bs), topic_name,
                            "read_committed", 2) == [b"p0", b"p1"]
