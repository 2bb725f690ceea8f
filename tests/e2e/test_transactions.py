"""Transactions end to end (KIP-98, KIP-447): the coordinator side.

Runs on both substrates (local dir and weakfs) with real processes.

Without the partition half (transactional produce, control batches,
read_committed — WriteTxnMarkers) the tests marked `needs_txn_partition` are
skipped (conftest checks ApiVersions for WriteTxnMarkers). The others use
transactions whose only "partition" is a consumer group's offsets, whose
markers the coordinator applies itself, so they run on the coordinator half
alone. In those, the group id equals the transactional id: the same hash,
so the same shard and the same broker.

* raw wire: InitProducerId with a transactional id, AddOffsetsToTxn,
  TxnOffsetCommit (pending, invisible to OffsetFetch, UNSTABLE_OFFSET_COMMIT
  for require_stable), EndTxn commit / abort, DescribeTransactions,
  ListTransactions, fencing codes per version (PRODUCER_FENCED 90 /
  INVALID_PRODUCER_EPOCH 47), INVALID_PRODUCER_ID_MAPPING,
  INVALID_TRANSACTION_TIMEOUT, TRANSACTIONAL_ID_NOT_FOUND,
  UNKNOWN_TOPIC_OR_PARTITION; a transaction timeout aborts with an epoch
  bump; an idle transactional id expires;
* confluent-kafka: two producers with one transactional.id, the older is
  fenced; an offsets-only transaction commits the group's offsets;
* three brokers: kill -9 the coordinator's broker after a commit decision:
  the new owner of the shard serves the completed state and the offsets;
* with the partition half: init/begin/produce/commit/abort with a
  read_committed consumer, consume-transform-produce with
  send_offsets_to_transaction while the coordinator's broker is killed.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

import kafka_wire as w
from conftest import client_conf, create_topic, producer_conf, wait_until

pytestmark = [
    pytest.mark.substrates("local", "weakfs"),
    pytest.mark.broker_args("--group-shards", "8",
                            "--group-initial-rebalance-delay-ms", "300"),
]

INIT_PRODUCER_ID, ADD_PARTITIONS, ADD_OFFSETS, END_TXN, TXN_OFFSET_COMMIT = 22, 24, 25, 26, 28
OFFSET_FETCH, FIND_COORDINATOR, DESCRIBE_TXNS, LIST_TXNS = 9, 10, 65, 66

NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
NOT_COORDINATOR = 16
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
INVALID_TRANSACTION_TIMEOUT = 50
CONCURRENT_TRANSACTIONS = 51
OPERATION_NOT_ATTEMPTED = 55
UNSTABLE_OFFSET_COMMIT = 88
PRODUCER_FENCED = 90
TRANSACTIONAL_ID_NOT_FOUND = 105

_cid = [100]


def call(addr, key: int, version: int, body: bytes, flexible: bool) -> w.Reader:
    """One request; the reader is positioned after the response header."""
    _cid[0] += 1
    cid = _cid[0]
    with w.connect(addr) as s:
        r = w.Reader(w.roundtrip(s, w.request_header(key, version, cid, flexible=flexible) + body))
    assert r.i32() == cid
    if flexible:
        r.skip_tags()
    return r


def init_pid(addr, txn: str, timeout_ms: int = 60_000, version: int = 4,
             pid: int = -1, epoch: int = -1) -> tuple[int, int, int]:
    """InitProducerId (v4 flexible, or v0): (error, producer id, epoch)."""
    if version >= 2:
        body = w.compact_string(txn) + w.i32(timeout_ms)
        if version >= 3:
            body += w.i64(pid) + w.i16(epoch)
        body += w.TAGS_NONE
    else:
        body = w.string(txn) + w.i32(timeout_ms)
    r = call(addr, INIT_PRODUCER_ID, version, body, version >= 2)
    r.i32()
    return r.i16(), r.i64(), r.i16()


def init_retrying(addr, txn: str, **kw) -> tuple[int, int]:
    """InitProducerId until it is not CONCURRENT_TRANSACTIONS /
    COORDINATOR_LOAD_IN_PROGRESS."""
    deadline = time.monotonic() + 30
    while True:
        err, pid, epoch = init_pid(addr, txn, **kw)
        if err not in (CONCURRENT_TRANSACTIONS, 14, 15, NOT_COORDINATOR):
            assert err == NONE, err
            return pid, epoch
        assert time.monotonic() < deadline, f"init_pid kept answering {err}"
        time.sleep(0.1)


def add_partitions(addr, txn, pid, epoch, parts: dict[str, list[int]],
                   version: int = 2) -> dict[tuple[str, int], int]:
    body = w.string(txn) + w.i64(pid) + w.i16(epoch) + w.i32(len(parts))
    for t, ps in parts.items():
        body += w.string(t) + w.i32(len(ps)) + b"".join(w.i32(p) for p in ps)
    r = call(addr, ADD_PARTITIONS, version, body, False)
    r.i32()
    out = {}
    for _ in range(r.i32()):
        t = r.string()
        for _ in range(r.i32()):
            p = r.i32()
            out[(t, p)] = r.i16()
    return out


def add_offsets(addr, txn, pid, epoch, group, version: int = 2) -> int:
    body = w.string(txn) + w.i64(pid) + w.i16(epoch) + w.string(group)
    r = call(addr, ADD_OFFSETS, version, body, False)
    r.i32()
    return r.i16()


def end_txn(addr, txn, pid, epoch, commit: bool, version: int = 2) -> int:
    body = w.string(txn) + w.i64(pid) + w.i16(epoch) + w.i8(1 if commit else 0)
    r = call(addr, END_TXN, version, body, False)
    r.i32()
    return r.i16()


def txn_offset_commit(addr, txn, group, pid, epoch, offsets: dict[tuple[str, int], int]
                      ) -> dict[tuple[str, int], int]:
    """TxnOffsetCommit v2: per-partition error codes."""
    by_topic: dict[str, list[tuple[int, int]]] = {}
    for (t, p), o in offsets.items():
        by_topic.setdefault(t, []).append((p, o))
    body = w.string(txn) + w.string(group) + w.i64(pid) + w.i16(epoch) + w.i32(len(by_topic))
    for t, ps in by_topic.items():
        body += w.string(t) + w.i32(len(ps))
        for p, o in ps:
            body += w.i32(p) + w.i64(o) + w.i32(-1) + w.string(None)
    r = call(addr, TXN_OFFSET_COMMIT, 2, body, False)
    r.i32()
    out = {}
    for _ in range(r.i32()):
        t = r.string()
        for _ in range(r.i32()):
            p = r.i32()
            out[(t, p)] = r.i16()
    return out


def offset_fetch(addr, group, topic, partitions, require_stable: bool
                 ) -> dict[int, tuple[int, int]]:
    """OffsetFetch v7: partition -> (offset, error)."""
    body = (w.compact_string(group)
            + w.compact_array([w.compact_string(topic)
                               + w.compact_array([w.i32(p) for p in partitions])
                               + w.TAGS_NONE])
            + w.i8(1 if require_stable else 0) + w.TAGS_NONE)
    r = call(addr, OFFSET_FETCH, 7, body, True)
    r.i32()
    out = {}
    for _ in range(r.compact_array_len()):
        r.compact_string()
        for _ in range(r.compact_array_len()):
            p = r.i32()
            off = r.i64()
            r.i32()
            r.compact_string()
            err = r.i16()
            r.skip_tags()
            out[p] = (off, err)
        r.skip_tags()
    top = r.i16()
    assert top == 0, top
    return out


def describe(addr, txn: str) -> dict:
    body = w.compact_array([w.compact_string(txn)]) + w.TAGS_NONE
    r = call(addr, DESCRIBE_TXNS, 0, body, True)
    r.i32()
    n = r.compact_array_len()
    assert n == 1, n
    d = {"error": r.i16(), "id": r.compact_string(), "state": r.compact_string(),
         "timeout_ms": r.i32(), "start_ms": r.i64(), "producer_id": r.i64(),
         "epoch": r.i16(), "topics": {}}
    for _ in range(r.compact_array_len()):
        t = r.compact_string()
        d["topics"][t] = [r.i32() for _ in range(r.compact_array_len())]
        r.skip_tags()
    r.skip_tags()
    return d


def list_txns(addr, states: list[str] = (), pids: list[int] = ()) -> tuple[list, list]:
    body = (w.compact_array([w.compact_string(s) for s in states])
            + w.compact_array([w.i64(p) for p in pids]) + w.TAGS_NONE)
    r = call(addr, LIST_TXNS, 0, body, True)
    r.i32()
    assert r.i16() == 0
    unknown = [r.compact_string() for _ in range(r.compact_array_len())]
    out = []
    for _ in range(r.compact_array_len()):
        out.append((r.compact_string(), r.i64(), r.compact_string()))
        r.skip_tags()
    return out, unknown


def find_coordinator(addr, key: str, key_type: int) -> int:
    r = call(addr, FIND_COORDINATOR, 1, w.string(key) + w.i8(key_type), False)
    r.i32()
    err = r.i16()
    r.string()
    node = r.i32()
    return node if err == 0 else -1


def wait_state(addr, txn, state, timeout=20) -> dict:
    box = {}

    def ok():
        box["d"] = describe(addr, txn)
        return box["d"]["state"] == state
    wait_until(ok, timeout=timeout, what=f"{txn} in {state}")
    return box["d"]


def test_offsets_in_a_transaction_fencing_and_admin_answers(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 2)
    a = broker.addr
    txn = f"tx-{uuid.uuid4().hex[:8]}"
    group = txn
    assert init_pid(a, txn, timeout_ms=0)[0] == INVALID_TRANSACTION_TIMEOUT
    assert init_pid(a, txn, timeout_ms=900_001)[0] == INVALID_TRANSACTION_TIMEOUT
    assert describe(a, txn)["error"] == TRANSACTIONAL_ID_NOT_FOUND
    pid, epoch = init_retrying(a, txn)
    assert epoch == 0 and pid >= 0
    d = describe(a, txn)
    assert (d["error"], d["state"], d["producer_id"], d["epoch"]) == (0, "Empty", pid, 0)
    assert find_coordinator(a, txn, 1) == find_coordinator(a, group, 0) == 0

    # A transaction whose only partition is the group's offsets.
    assert add_offsets(a, txn, pid, epoch, group) == NONE
    errs = txn_offset_commit(a, txn, group, pid, epoch, {(topic_name, 0): 5, (topic_name, 1): 7})
    assert set(errs.values()) == {NONE}, errs
    d = describe(a, txn)
    assert d["state"] == "Ongoing" and d["start_ms"] > 0, d
    assert list(d["topics"]) == ["__consumer_offsets"], d
    # Pending offsets are invisible, and unstable for require_stable.
    assert offset_fetch(a, group, topic_name, [0, 1], False) == {0: (-1, 0), 1: (-1, 0)}
    assert offset_fetch(a, group, topic_name, [0, 1], True) == {
        0: (-1, UNSTABLE_OFFSET_COMMIT), 1: (-1, UNSTABLE_OFFSET_COMMIT)}
    got, unknown = list_txns(a, states=["Ongoing", "Bogus"])
    assert (txn, pid, "Ongoing") in got and unknown == ["Bogus"], (got, unknown)
    assert list_txns(a, states=["CompleteCommit"], pids=[pid])[0] == []

    assert end_txn(a, txn, pid, epoch, commit=True) == NONE
    wait_state(a, txn, "CompleteCommit")
    assert offset_fetch(a, group, topic_name, [0, 1], True) == {0: (5, 0), 1: (7, 0)}
    assert end_txn(a, txn, pid, epoch, commit=True) == NONE, "a retried commit succeeds"
    assert end_txn(a, txn, pid, epoch, commit=False) == INVALID_TXN_STATE

    # An aborted transaction drops its offsets.
    assert add_offsets(a, txn, pid, epoch, group) == NONE
    assert set(txn_offset_commit(a, txn, group, pid, epoch, {(topic_name, 0): 9}).values()) == {0}
    assert end_txn(a, txn, pid, epoch, commit=False) == NONE
    wait_state(a, txn, "CompleteAbort")
    assert offset_fetch(a, group, topic_name, [0], True) == {0: (5, 0)}

    # Unknown partitions: UNKNOWN_TOPIC_OR_PARTITION, the rest not attempted.
    errs = add_partitions(a, txn, pid, epoch, {topic_name: [0], "no-such-topic": [0]})
    assert errs == {(topic_name, 0): OPERATION_NOT_ATTEMPTED,
                    ("no-such-topic", 0): UNKNOWN_TOPIC_OR_PARTITION}, errs
    assert describe(a, txn)["state"] == "CompleteAbort", "nothing added"

    # A second producer with the id bumps the epoch and fences the first.
    pid2, epoch2 = init_retrying(a, txn)
    assert (pid2, epoch2) == (pid, 1)
    assert add_offsets(a, txn, pid, 0, group, version=2) == PRODUCER_FENCED
    assert add_offsets(a, txn, pid, 0, group, version=1) == INVALID_PRODUCER_EPOCH
    assert end_txn(a, txn, pid, 0, True, version=2) == PRODUCER_FENCED
    assert end_txn(a, txn, pid, 0, True, version=0) == INVALID_PRODUCER_EPOCH
    assert add_partitions(a, txn, pid, 0, {topic_name: [0]}, version=2) == {
        (topic_name, 0): PRODUCER_FENCED}
    # KIP-360: only the current producer may re-init naming its id.
    assert init_pid(a, txn, version=4, pid=pid + 1, epoch=1)[0] == PRODUCER_FENCED
    assert init_pid(a, txn, version=3, pid=pid + 1, epoch=1)[0] == INVALID_PRODUCER_EPOCH
    err, p3, e3 = init_pid(a, txn, version=4, pid=pid, epoch=1)
    assert (err, p3, e3) == (0, pid, 2), (err, p3, e3)
    assert end_txn(a, "never-seen", pid, 0, True) == INVALID_PRODUCER_ID_MAPPING
    assert add_offsets(a, txn, pid + 1, 2, group) == INVALID_PRODUCER_ID_MAPPING
    # The state survives a kill -9.
    broker.kill9()
    broker.start()
    d = wait_state(broker.addr, txn, "Empty")
    assert (d["producer_id"], d["epoch"]) == (pid, 2)
    assert offset_fetch(broker.addr, group, topic_name, [0, 1], True) == {0: (5, 0), 1: (7, 0)}


DELETE_GROUPS = 42


def delete_groups(addr, groups: list[str]) -> dict[str, int]:
    """DeleteGroups v1: group -> error code."""
    body = w.i32(len(groups)) + b"".join(w.string(g) for g in groups)
    r = call(addr, DELETE_GROUPS, 1, body, False)
    r.i32()
    return {r.string(): r.i16() for _ in range(r.i32())}


def test_delete_groups_drops_offsets_a_transaction_still_holds(broker, topic_name):
    """A transaction sends offsets for a group (TxnOffsetCommit: pending);
    the group is deleted before the transaction commits; the COMMIT marker
    must not revive the deleted group's offsets — neither those it had
    committed before nor those only the transaction held (Kafka's
    `deleteAllOffsets` tombstones pending-only keys too)."""
    create_topic(broker.bootstrap, topic_name, 2)
    a = broker.addr
    txn = f"tx-{uuid.uuid4().hex[:8]}"
    group = txn
    pid, epoch = init_retrying(a, txn)
    # First transaction: partition 0's offset is committed.
    assert add_offsets(a, txn, pid, epoch, group) == NONE
    assert set(txn_offset_commit(a, txn, group, pid, epoch, {(topic_name, 0): 5}).values()) == {0}
    assert end_txn(a, txn, pid, epoch, commit=True) == NONE
    wait_state(a, txn, "CompleteCommit")
    assert offset_fetch(a, group, topic_name, [0, 1], True) == {0: (5, 0), 1: (-1, 0)}
    # Second transaction: offsets for both partitions, partition 1's held
    # only by the transaction.
    assert add_offsets(a, txn, pid, epoch, group) == NONE
    errs = txn_offset_commit(a, txn, group, pid, epoch, {(topic_name, 0): 6, (topic_name, 1): 7})
    assert set(errs.values()) == {NONE}, errs
    assert delete_groups(a, [group]) == {group: NONE}
    assert end_txn(a, txn, pid, epoch, commit=True) == NONE
    wait_state(a, txn, "CompleteCommit")
    assert offset_fetch(a, group, topic_name, [0, 1], False) == {0: (-1, 0), 1: (-1, 0)}, \
        "the commit marker revived a deleted group's offsets"
    # And after a restart (the state rebuilt from the shard's log).
    broker.restart()
    wait_until(lambda: offset_fetch_or_none(broker.addr, group, topic_name, [0, 1]) is not None,
               timeout=30, what="the group shard serving again")
    assert offset_fetch(broker.addr, group, topic_name, [0, 1], False) == {0: (-1, 0), 1: (-1, 0)}


def offset_fetch_or_none(addr, group, topic, partitions):
    try:
        got = offset_fetch(addr, group, topic, partitions, False)
    except (AssertionError, OSError):
        return None
    return got if all(err == 0 for _, err in got.values()) else None


@pytest.mark.broker_args("--transactional-id-expiration-ms", "1500")
def test_a_timed_out_transaction_is_aborted_and_an_idle_id_expires(broker, topic_name):
    # The topic exists: a TxnOffsetCommit of an unknown one is refused.
    create_topic(broker.bootstrap, topic_name, 1)
    a = broker.addr
    txn = f"tx-{uuid.uuid4().hex[:8]}"
    pid, epoch = init_retrying(a, txn, timeout_ms=800)
    assert add_offsets(a, txn, pid, epoch, txn) == NONE
    assert set(txn_offset_commit(a, txn, txn, pid, epoch, {(topic_name, 0): 3}).values()) == {0}
    d = wait_state(a, txn, "CompleteAbort", timeout=10)
    assert d["epoch"] == epoch + 1, "the abort bumps the epoch: the producer is fenced"
    assert end_txn(a, txn, pid, epoch, True) == PRODUCER_FENCED
    assert offset_fetch(a, txn, topic_name, [0], True) == {0: (-1, 0)}
    # Idle past transactional.id.expiration.ms: forgotten.
    wait_until(lambda: describe(a, txn)["error"] == TRANSACTIONAL_ID_NOT_FOUND,
               timeout=15, what="the idle id expires")
    assert end_txn(a, txn, pid, epoch + 1, False) == INVALID_PRODUCER_ID_MAPPING


def txn_producer(bootstrap: str, txn: str, **extra) -> Producer:
    return Producer(producer_conf(bootstrap, **{
        "transactional.id": txn,
        "transaction.timeout.ms": 30_000,
        **extra,
    }))


def group_consumer(bootstrap: str, group: str, **extra) -> Consumer:
    return Consumer(client_conf(bootstrap, **{
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
        **extra,
    }))


def test_two_producers_with_one_transactional_id_the_older_is_fenced(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 1)
    txn = f"tx-{uuid.uuid4().hex[:8]}"
    group = txn
    older = txn_producer(broker.bootstrap, txn)
    older.init_transactions(30)
    newer = txn_producer(broker.bootstrap, txn)
    newer.init_transactions(30)
    meta = group_consumer(broker.bootstrap, group).consumer_group_metadata()
    older.begin_transaction()
    with pytest.raises(KafkaException) as ex:
        older.send_offsets_to_transaction([TopicPartition(topic_name, 0, 11)], meta, 30)
    err = ex.value.args[0]
    assert err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED), err
    assert err.fatal(), err
    # The newer one commits an offsets-only transaction.
    newer.begin_transaction()
    newer.send_offsets_to_transaction([TopicPartition(topic_name, 0, 42)], meta, 30)
    newer.commit_transaction(30)
    c = group_consumer(broker.bootstrap, group)
    try:
        wait_until(lambda: c.committed([TopicPartition(topic_name, 0)], 10)[0].offset == 42,
                   timeout=20, what="the transaction's offset is committed")
    finally:
        c.close()


def test_coordinator_kill9_after_a_commit_decision(broker_factory, topic_name):
    """Three brokers: an offsets-only transaction commits; kill -9 of the
    coordinator's broker; the shard's new owner serves its state and the
    group's offsets, and the producer's id goes on with a bumped epoch."""
    brokers = broker_factory.cluster(3, ["--group-shards", "8"])
    create_topic(brokers[0].bootstrap, topic_name, 1)
    txn = f"tx-{uuid.uuid4().hex[:8]}"
    by_id = {b.broker_id: b for b in brokers}
    coord = {}

    def found():
        coord["id"] = find_coordinator(brokers[0].addr, txn, 1)
        return coord["id"] in by_id
    wait_until(found, timeout=30, what="a coordinator for the transactional id")
    owner = by_id[coord["id"]]
    pid, epoch = init_retrying(owner.addr, txn)
    others = [b for b in brokers if b is not owner]
    assert init_pid(others[0].addr, txn)[0] == NOT_COORDINATOR
    assert add_offsets(owner.addr, txn, pid, epoch, txn) == NONE
    assert set(txn_offset_commit(owner.addr, txn, txn, pid, epoch,
                                 {(topic_name, 0): 17}).values()) == {0}
    assert end_txn(owner.addr, txn, pid, epoch, True) == NONE
    owner.kill9()

    def moved():
        n = find_coordinator(others[0].addr, txn, 1)
        if n in by_id and by_id[n] is not owner:
            coord["new"] = by_id[n]
            return describe(coord["new"].addr, txn)["state"] == "CompleteCommit"
        return False
    wait_until(moved, timeout=60, what="the shard taken over with the commit completed")
    new = coord["new"]
    assert offset_fetch(new.addr, txn, topic_name, [0], True) == {0: (17, 0)}
    pid2, epoch2 = init_retrying(new.addr, txn)
    assert (pid2, epoch2) == (pid, epoch + 1)


# ---------------------------------------------------------------------------
# with the partition half (WriteTxnMarkers, control batches, read_committed)
# ---------------------------------------------------------------------------


def read_values(bootstrap: str, topic: str, isolation: str, expect: int | None,
                timeout: float = 30) -> list[bytes]:
    c = Consumer(client_conf(bootstrap, **{
        "group.id": f"reader-{uuid.uuid4().hex[:6]}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": isolation,
        "fetch.wait.max.ms": 100,
    }))
    out: list[bytes] = []
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + timeout
        quiet_until = None
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                if expect is not None and len(out) >= expect:
                    if quiet_until is None:
                        quiet_until = time.monotonic() + 1.0
                    elif time.monotonic() > quiet_until:
                        break
                continue
            if m.error():
                continue
            out.append(m.value())
    finally:
        c.close()
    return out


@pytest.mark.needs_txn_partition
def test_commit_and_abort_seen_by_read_committed(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 2)
    p = txn_producer(broker.bootstrap, f"tx-{uuid.uuid4().hex[:8]}")
    p.init_transactions(30)
    want = []
    for i in range(6):
        p.begin_transaction()
        vals = [b"t%d-%d" % (i, j) for j in range(5)]
        for j, v in enumerate(vals):
            p.produce(topic_name, value=v, partition=j % 2)
        if i % 2 == 0:
            p.commit_transaction(30)
            want += vals
        else:
            # Written first, so the log holds them: abort_transaction()
            # purges records librdkafka has not sent yet.
            assert p.flush(30) == 0
            p.abort_transaction(30)
    committed = read_values(broker.bootstrap, topic_name, "read_committed", len(want))
    assert sorted(committed) == sorted(want)
    everything = read_values(broker.bootstrap, topic_name, "read_uncommitted", 30)
    assert len(everything) == 30


@pytest.mark.needs_txn_partition
@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.substrates("cephfs")
def test_consume_transform_produce_exactly_once_through_coordinator_kill9(broker_factory,
                                                                          topic_name):
    """Three brokers: copy `in` to `out` in transactions (offsets committed
    in the transaction); kill -9 the transaction coordinator's broker in the
    middle; every input appears in the committed output exactly once."""
    brokers = broker_factory.cluster(3, ["--group-shards", "8"])
    src, dst = topic_name + "-in", topic_name + "-out"
    create_topic(brokers[0].bootstrap, src, 2)
    create_topic(brokers[0].bootstrap, dst, 2)
    boot = ",".join(b.bootstrap for b in brokers)
    n = 300
    prod = Producer(producer_conf(boot))
    for i in range(n):
        prod.produce(src, value=b"%d" % i, partition=i % 2)
    assert prod.flush(30) == 0
    txn = f"ctp-{uuid.uuid4().hex[:8]}"
    group = txn
    by_id = {b.broker_id: b for b in brokers}
    killed = False
    copied = 0
    deadline = time.monotonic() + 150

    def run_once() -> None:
        nonlocal killed, copied
        # The killed coordinator may take the old member's LeaveGroup with
        # it: the smallest session timeout lets the rejoin wait 6 s, not 45.
        c = group_consumer(boot, group, **{"isolation.level": "read_committed",
                                           "session.timeout.ms": 6000})
        p = txn_producer(boot, txn)
        try:
            p.init_transactions(60)
            c.subscribe([src])
            while time.monotonic() < deadline:
                batch = c.consume(20, 1.0)
                batch = [m for m in batch if m.error() is None]
                if not batch:
                    if caught_up(c):
                        return
                    continue
                p.begin_transaction()
                for m in batch:
                    p.produce(dst, value=m.value(), partition=m.partition())
                nxt: dict[int, int] = {}
                for m in batch:
                    nxt[m.partition()] = max(nxt.get(m.partition(), 0), m.offset() + 1)
                p.send_offsets_to_transaction(
                    [TopicPartition(src, part, off) for part, off in nxt.items()],
                    c.consumer_group_metadata(), 60)
                p.commit_transaction(60)
                copied += len(batch)
                if not killed and copied >= n // 3:
                    node = find_coordinator(brokers[0].addr, txn, 1)
                    victim = by_id[node]
                    victim.kill9()
                    killed = True
                    raise RuntimeError("coordinator killed")
        finally:
            c.close()

    def caught_up(c: Consumer) -> bool:
        """Every input partition consumed to its end, and (each batch being
        committed before the next consume) every copy committed."""
        assigned = c.assignment()
        if len(assigned) < 2:
            return False
        for tp in c.position(assigned):
            _, high = c.get_watermark_offsets(tp, timeout=5, cached=False)
            if tp.offset < high:
                return False
        return True

    while True:
        try:
            run_once()
            break
        except (KafkaException, RuntimeError):
            continue
        finally:
            assert time.monotonic() < deadline, "no progress"
    assert killed, "the coordinator was never killed"
    out = read_values(boot, dst, "read_committed", n, timeout=60)
    assert sorted(int(v) for v in out) == list(range(n)), "each input exactly once"


# ---------------------------------------------------------------------------
# KIP-890 part 1: the partition leader verifies with the coordinator
# ---------------------------------------------------------------------------


def end_offsets(addr, topic: str, partition: int) -> tuple[int, int]:
    """(high watermark, last stable offset) of one partition."""
    hw = w.list_offsets_v7(addr, topic, partition, w.LATEST_TIMESTAMP, isolation_level=0)
    lso = w.list_offsets_v7(addr, topic, partition, w.LATEST_TIMESTAMP,
                            isolation_level=w.READ_COMMITTED)
    assert hw.error_code == lso.error_code == 0, (hw, lso)
    return hw.offset, lso.offset


def produce_txn_raw(addr, topic: str, partition: int, txn: str | None, pid: int,
                    epoch: int, seq: int, values=(b"v",)) -> w.ProducePartitionResult:
    return w.produce_raw(addr, topic, partition, w.txn_batch(list(values), pid, epoch, seq),
                         transactional_id=txn)


def check_unverified_produce_refused(coord_addr, leader_addr, topic: str, txn: str) -> None:
    """The KIP-890 part 1 checks, with the coordinator at `coord_addr` and
    the leader of `topic`'s partitions 0 and 1 at `leader_addr`."""
    pid, epoch = init_retrying(coord_addr, txn)
    assert add_partitions(coord_addr, txn, pid, epoch, {topic: [0]}) == {(topic, 0): NONE}

    # Partition 1 was never added to the transaction: refused, nothing written.
    r = produce_txn_raw(leader_addr, topic, 1, txn, pid, epoch, 0)
    assert r.error_code == INVALID_TXN_STATE, r
    assert end_offsets(leader_addr, topic, 1) == (0, 0), "nothing appended"
    assert w.fetch_raw(leader_addr, 10, topic, 1, 0).records == b""
    # A transactional batch without a transactional id is refused (Kafka:
    # TRANSACTIONAL_ID_AUTHORIZATION_FAILED), also nothing written.
    r = produce_txn_raw(leader_addr, topic, 1, None, pid, epoch, 0)
    assert r.error_code == 53, r
    # A transactional id the coordinator does not know.
    r = produce_txn_raw(leader_addr, topic, 1, txn + "-other", pid, epoch, 0)
    assert r.error_code == INVALID_PRODUCER_ID_MAPPING, r
    assert end_offsets(leader_addr, topic, 1) == (0, 0)

    # Partition 0 was added: its first batch is verified and written, the
    # next one goes through on the open transaction.
    r = produce_txn_raw(leader_addr, topic, 0, txn, pid, epoch, 0, [b"a", b"b"])
    assert (r.error_code, r.base_offset) == (NONE, 0), r
    r = produce_txn_raw(leader_addr, topic, 0, txn, pid, epoch, 2)
    assert (r.error_code, r.base_offset) == (NONE, 2), r
    assert end_offsets(leader_addr, topic, 0) == (3, 0), "the transaction holds the LSO"
    assert end_txn(coord_addr, txn, pid, epoch, commit=True) == NONE
    wait_state(coord_addr, txn, "CompleteCommit")
    wait_until(lambda: end_offsets(leader_addr, topic, 0) == (4, 4), timeout=20,
               what="the commit marker written and the LSO past it")

    # A late batch after the commit (the hanging-transaction case KIP-890
    # closes): the coordinator has no ongoing transaction, so the leader
    # refuses it and the LSO is not held.
    r = produce_txn_raw(leader_addr, topic, 0, txn, pid, epoch, 3)
    assert r.error_code == INVALID_TXN_STATE, r
    assert end_offsets(leader_addr, topic, 0) == (4, 4), "no transaction left hanging"

    # The next transaction adds partition 1 and may write there.
    assert add_partitions(coord_addr, txn, pid, epoch, {topic: [1]}) == {(topic, 1): NONE}
    r = produce_txn_raw(leader_addr, topic, 1, txn, pid, epoch, 0)
    assert (r.error_code, r.base_offset) == (NONE, 0), r
    assert end_txn(coord_addr, txn, pid, epoch, commit=False) == NONE
    wait_state(coord_addr, txn, "CompleteAbort")


@pytest.mark.needs_txn_partition
def test_produce_to_a_partition_not_in_the_transaction_is_refused(broker, topic_name):
    """KIP-890 part 1: a transactional Produce for a partition the
    transaction never added is INVALID_TXN_STATE (48) and appends nothing;
    so is a late batch after the transaction's commit; the added partition
    is verified once and written."""
    create_topic(broker.bootstrap, topic_name, 2)
    check_unverified_produce_refused(broker.addr, broker.addr, topic_name,
                                     f"tx-{uuid.uuid4().hex[:8]}")


@pytest.mark.needs_txn_partition
def test_verification_asks_a_coordinator_on_another_broker(broker_factory, topic_name):
    """Three brokers, the transaction coordinator on one broker and the
    partitions' leader on another: the leader verifies over AddPartitionsToTxn
    v4 `verify_only` (broker to broker) with the same answers; a
    confluent-kafka transactional producer writing to every partition (so
    to leaders other than its coordinator) commits."""
    from cluster import create_everywhere, wait_leaders
    brokers = broker_factory.cluster(3, ["--group-shards", "8"])
    by_id = {b.broker_id: b for b in brokers}
    create_everywhere(brokers, topic_name, 6)
    # Spread: until all three brokers are in the assignment, the first
    # leads every partition and every coordinator shard.
    led = wait_leaders(brokers, topic_name, 6, set(by_id), spread=True)
    # Two partitions led by one broker, and a transactional id whose
    # coordinator is another broker — chosen together: every coordinator
    # shard may sit on one broker that also leads two partitions.
    with_two = {b for b in by_id if sum(1 for l in led.values() if l == b) >= 2}
    assert with_two, led
    txn, leader_id, node = None, None, -1
    for i in range(200):
        cand = f"tx-{i}-{uuid.uuid4().hex[:6]}"

        def found():
            nonlocal node
            node = find_coordinator(brokers[0].addr, cand, 1)
            return node in by_id
        wait_until(found, timeout=30, what="a coordinator")
        others = sorted(with_two - {node})
        if others:
            txn, leader_id = cand, others[0]
            break
    assert txn is not None, (led, node)
    coord = by_id[node]
    leader = by_id[leader_id]
    two = sorted(p for p, l in led.items() if l == leader_id)[:2]
    pid, epoch = init_retrying(coord.addr, txn)
    assert add_partitions(coord.addr, txn, pid, epoch,
                          {topic_name: [two[0]]}) == {(topic_name, two[0]): NONE}
    r = produce_txn_raw(leader.addr, topic_name, two[1], txn, pid, epoch, 0)
    assert r.error_code == INVALID_TXN_STATE, r
    assert end_offsets(leader.addr, topic_name, two[1]) == (0, 0), "nothing appended"
    r = produce_txn_raw(leader.addr, topic_name, two[0], txn, pid, epoch, 0)
    assert (r.error_code, r.base_offset) == (NONE, 0), r
    assert end_txn(coord.addr, txn, pid, epoch, commit=True) == NONE
    wait_state(coord.addr, txn, "CompleteCommit")

    # A real transactional producer over all six partitions.
    boot = ",".join(b.bootstrap for b in brokers)
    p = txn_producer(boot, f"ck-{uuid.uuid4().hex[:8]}")
    p.init_transactions(30)
    for round_ in range(3):
        p.begin_transaction()
        for i in range(60):
            p.produce(topic_name, value=b"%d-%d" % (round_, i), partition=i % 6)
        p.commit_transaction(30)
    got = read_values(boot, topic_name, "read_committed", 181, timeout=30)
    assert len(got) == 181, len(got)
