"""Client gaps the peer suites found (issue 27), each with a real client
(or the raw wire where a client cannot say it):

* exactly-once with a KIP-848 consumer: `send_offsets_to_transaction` with
  `group.protocol=consumer` (TxnOffsetCommit validated by member epoch, as
  OffsetCommit is), and the classic protocol alike;
* OffsetCommit / TxnOffsetCommit of a topic that does not exist, or of a
  partition beyond its count: UNKNOWN_TOPIC_OR_PARTITION per partition
  (librdkafka's test 0030 `do_nonexist_commit`), the known partitions of the
  same request committed;
* authorized operations (KIP-430) as Kafka reports them without an
  authorizer: kafka-python's `describe_consumer_groups` parses
  DescribeGroups v3, confluent's the KIP-848 ConsumerGroupDescribe, and
  DescribeCluster answers the cluster's operations only when asked;
* `--group-min-session-timeout-ms` / `--group-max-session-timeout-ms`
  (Kafka's group.min/max.session.timeout.ms) bound a classic member's
  session timeout (INVALID_SESSION_TIMEOUT outside).
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AclOperation, AdminClient

import kafka_wire as w
from conftest import client_conf, create_topic, producer_conf, wait_until
from test_transactions import add_offsets, init_retrying, txn_offset_commit

FAST_GROUPS = ["--group-shards", "8", "--group-initial-rebalance-delay-ms", "300",
               "--group-consumer-heartbeat-interval-ms", "500"]

UNKNOWN_TOPIC_OR_PARTITION = 3


def produce(bootstrap: str, topic: str, n: int) -> None:
    p = Producer(producer_conf(bootstrap))
    for i in range(n):
        p.produce(topic, value=b"%d" % i, partition=0)
    assert p.flush(30) == 0


# ---------------------------------------------------------------------------
# 1. exactly-once with either group protocol
# ---------------------------------------------------------------------------


def copy_in_a_transaction(bootstrap: str, src: str, dst: str, n: int, protocol: str) -> None:
    """Consume `n` records of `src` with a `protocol` group member, write
    them to `dst` and their offsets in one transaction; the group's
    committed offset is then `n`."""
    group = f"eos-{protocol}-{uuid.uuid4().hex[:8]}"
    conf = {
        "group.id": group,
        "group.protocol": protocol,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "fetch.wait.max.ms": 100,
    }
    c = Consumer(client_conf(bootstrap, **conf))
    p = Producer(producer_conf(bootstrap, **{
        "transactional.id": f"tx-{group}",
        "transaction.timeout.ms": 30_000,
    }))
    try:
        p.init_transactions(30)
        c.subscribe([src])
        got = []
        deadline = time.monotonic() + 60
        while len(got) < n:
            assert time.monotonic() < deadline, f"{protocol}: consumed {len(got)} of {n}"
            for m in c.consume(n, 0.5):
                assert m.error() is None, m.error()
                got.append(m)
        p.begin_transaction()
        for m in got:
            p.produce(dst, value=m.value(), partition=0)
        positions = c.position(c.assignment())
        assert [(tp.partition, tp.offset) for tp in positions] == [(0, n)], positions
        # librdkafka sends the member epoch as the generation for a
        # consumer-protocol member: kaas refused it with ILLEGAL_GENERATION.
        p.send_offsets_to_transaction(positions, c.consumer_group_metadata(), 30)
        p.commit_transaction(30)
        wait_until(lambda: c.committed([TopicPartition(src, 0)], 10)[0].offset == n,
                   timeout=20, what=f"{protocol}: the transaction's offset is committed")
    finally:
        c.close()


@pytest.mark.needs_txn_partition
@pytest.mark.broker_args(*FAST_GROUPS)
def test_send_offsets_to_transaction_with_either_group_protocol(broker, topic_name):
    src, dst = topic_name + "-in", topic_name + "-out"
    create_topic(broker.bootstrap, src, 1)
    create_topic(broker.bootstrap, dst, 1)
    produce(broker.bootstrap, src, 10)
    copy_in_a_transaction(broker.bootstrap, src, dst, 10, "classic")
    copy_in_a_transaction(broker.bootstrap, src, dst, 10, "consumer")


# ---------------------------------------------------------------------------
# 2. commits of unknown topics and partitions
# ---------------------------------------------------------------------------


@pytest.mark.broker_args("--group-shards", "8", "--auto-create-topics", "false")
def test_commit_of_an_unknown_topic_or_partition_is_refused(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 1)
    missing = f"nonexistent-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    c = Consumer(client_conf(broker.bootstrap, **{
        "group.id": group, "enable.auto.commit": False,
        "allow.auto.create.topics": False}))
    try:
        for tp in (TopicPartition(missing, 0, 5), TopicPartition(topic_name, 1, 5)):
            with pytest.raises(KafkaException) as ex:
                c.commit(offsets=[tp], asynchronous=False)
            err = ex.value.args[0]
            assert err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART, (tp, err)
        # In one request with a known partition: the request fails (as a
        # whole, for librdkafka), the known partition is committed.
        with pytest.raises(KafkaException) as ex:
            c.commit(offsets=[TopicPartition(topic_name, 0, 7),
                              TopicPartition(missing, 0, 5)], asynchronous=False)
        assert ex.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART, ex.value
        assert c.committed([TopicPartition(topic_name, 0)], 10)[0].offset == 7
    finally:
        c.close()
    # TxnOffsetCommit alike (the raw wire: a client only sends offsets of
    # partitions it consumed).
    txn = f"tx-{uuid.uuid4().hex[:8]}"
    pid, epoch = init_retrying(broker.addr, txn)
    assert add_offsets(broker.addr, txn, pid, epoch, group) == 0
    got = txn_offset_commit(broker.addr, txn, group, pid, epoch,
                            {(missing, 0): 5, (topic_name, 3): 5, (topic_name, 0): 9})
    assert got == {(missing, 0): UNKNOWN_TOPIC_OR_PARTITION,
                   (topic_name, 3): UNKNOWN_TOPIC_OR_PARTITION,
                   (topic_name, 0): 0}, got


# ---------------------------------------------------------------------------
# 3. authorized operations without an authorizer
# ---------------------------------------------------------------------------

# AclOperation codes: READ 3, WRITE 4, CREATE 5, DELETE 6, ALTER 7, DESCRIBE 8,
# CLUSTER_ACTION 9, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11, IDEMPOTENT_WRITE 12
# (Kafka's AclEntry.supportedOperations).
GROUP_OPS = {"READ", "DESCRIBE", "DELETE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"}
CLUSTER_OPS = {5, 7, 8, 9, 10, 11, 12}
DESCRIBE_CLUSTER = 60


def describe_cluster_ops(addr, include: bool) -> int:
    """DescribeCluster v0: (error, cluster_authorized_operations)."""
    body = w.i8(1 if include else 0) + b"\x00"
    with w.connect(addr) as s:
        r = w.Reader(w.roundtrip(s, w.request_header(DESCRIBE_CLUSTER, 0, 7, flexible=True)
                                 + body))
    assert r.i32() == 7
    r.skip_tags()
    r.i32()  # throttle
    assert r.i16() == 0
    r.compact_string()  # error message
    r.compact_string()  # cluster id
    r.i32()  # controller
    for _ in range(r.compact_array_len()):
        r.i32()
        r.compact_string()
        r.i32()
        r.compact_string()
        r.skip_tags()
    return r.i32()


@pytest.mark.broker_args(*FAST_GROUPS)
def test_authorized_operations_are_every_supported_operation(broker, topic_name):
    from kafka import KafkaAdminClient, KafkaConsumer
    create_topic(broker.bootstrap, topic_name, 1)
    # A classic group with a kafka-python member (whose subscription
    # kafka-python's describe decodes).
    classic = f"classic-{uuid.uuid4().hex[:8]}"
    member = KafkaConsumer(topic_name, bootstrap_servers=broker.bootstrap, group_id=classic,
                           enable_auto_commit=False, consumer_timeout_ms=200)
    kp_admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    kip848 = None
    try:
        deadline = time.monotonic() + 30
        while not member.assignment():
            assert time.monotonic() < deadline, "the kafka-python member never got an assignment"
            member.poll(timeout_ms=200)
        # kafka-python asks DescribeGroups v3 with include_authorized_operations
        # and decodes the bit field: kaas answered i32::MIN (bit 31), which it
        # could not parse ("31 is not a valid ACLOperation").
        [desc] = kp_admin.describe_consumer_groups([classic], include_authorized_operations=True)
        assert desc.group == classic and desc.state == "Stable", desc
        assert set(desc.authorized_operations) == GROUP_OPS, desc.authorized_operations

        # A KIP-848 group through ConsumerGroupDescribe (confluent).
        group = f"kip848-{uuid.uuid4().hex[:8]}"
        kip848 = Consumer(client_conf(broker.bootstrap, **{
            "group.id": group, "group.protocol": "consumer", "enable.auto.commit": False}))
        kip848.subscribe([topic_name])
        wait_until(lambda: kip848.poll(0.2) is None and kip848.assignment(), timeout=30,
                   what="the KIP-848 member's assignment")
        admin = AdminClient(client_conf(broker.bootstrap))
        d = admin.describe_consumer_groups(
            [group], include_authorized_operations=True)[group].result(timeout=15)
        assert {op.name for op in d.authorized_operations} == GROUP_OPS, d.authorized_operations
        assert AclOperation.READ in d.authorized_operations

        # DescribeCluster: the cluster's operations only when asked.
        ops = describe_cluster_ops(broker.addr, True)
        assert {b for b in range(32) if ops & (1 << b)} == CLUSTER_OPS, hex(ops)
        assert describe_cluster_ops(broker.addr, False) == -(2 ** 31)
    finally:
        if kip848 is not None:
            kip848.close()
        member.close()
        kp_admin.close()


# ---------------------------------------------------------------------------
# 4. group.min/max.session.timeout.ms
# ---------------------------------------------------------------------------


def classic_join(bootstrap: str, topic: str, session_ms: int) -> int | None:
    """A classic librdkafka member with `session_ms`: None once assigned, or
    the error code its join was refused with."""
    c = Consumer(client_conf(bootstrap, **{
        "group.id": f"s-{uuid.uuid4().hex[:8]}",
        "session.timeout.ms": session_ms,
        "heartbeat.interval.ms": 300,
        "enable.auto.commit": False,
    }))
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is not None:
                return m.error().code()
            if c.assignment():
                return None
        raise AssertionError(f"session {session_ms} ms: neither assigned nor refused")
    finally:
        c.close()


def test_group_session_timeout_bounds_are_flags(broker_factory, topic_name):
    tuned = broker_factory(["--group-initial-rebalance-delay-ms", "300",
                            "--group-min-session-timeout-ms", "1000",
                            "--group-max-session-timeout-ms", "10000"])
    default = broker_factory(["--group-initial-rebalance-delay-ms", "300"])
    for b in (tuned, default):
        create_topic(b.bootstrap, topic_name, 1)
    assert classic_join(tuned.bootstrap, topic_name, 1500) is None
    assert classic_join(tuned.bootstrap, topic_name, 15_000) == KafkaError.INVALID_SESSION_TIMEOUT
    # Kafka's defaults: 6 s .. 30 min.
    assert classic_join(default.bootstrap, topic_name, 1500) == KafkaError.INVALID_SESSION_TIMEOUT
    assert classic_join(default.bootstrap, topic_name, 6000) is None
