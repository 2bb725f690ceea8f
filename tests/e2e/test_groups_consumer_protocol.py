"""KIP-848 consumer groups (`group.protocol=consumer`) end to end, with
confluent-kafka (librdkafka 2.16): ConsumerGroupHeartbeat, server-side
assignors, OffsetCommit/OffsetFetch v9 member epochs, ConsumerGroupDescribe.

* three consumers over six partitions consume every record exactly once
  (each commits synchronously after every record); a member leaves and
  another joins, consumption carries on; AdminClient
  `describe_consumer_groups` (ConsumerGroupDescribe) and
  `list_consumer_groups` (ListGroups v5 with a type filter) see the group
  as a consumer-protocol group;
* three brokers: kill -9 the broker coordinating the group's shard while
  the consumers commit; another broker takes the shard over, the members
  carry on (their epochs and assignments read back from the shard log) and
  no acknowledged commit is lost;
* raw wire: error codes Kafka gives (UNSUPPORTED_ASSIGNOR,
  FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID, GROUP_ID_NOT_FOUND for a classic
  group, INCONSISTENT_GROUP_PROTOCOL for a classic join of a consumer
  group).
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from conftest import client_conf, create_topic, producer_conf, wait_until

pytestmark = [
    pytest.mark.substrates("local", "weakfs"),
    pytest.mark.broker_args("--group-shards", "8",
                            "--group-initial-rebalance-delay-ms", "300",
                            "--group-consumer-heartbeat-interval-ms", "500",
                            "--group-consumer-session-timeout-ms", "6000"),
]

PARTITIONS = 6
FAST_GROUPS = ["--group-shards", "8", "--group-initial-rebalance-delay-ms", "300",
               "--group-consumer-heartbeat-interval-ms", "500",
               "--group-consumer-session-timeout-ms", "6000"]


def produce(bootstrap: str, topic: str, lo: int, hi: int) -> None:
    p = Producer(producer_conf(bootstrap))
    for i in range(lo, hi):
        p.produce(topic, value=b"%d" % i, partition=i % PARTITIONS)
        p.poll(0)
    assert p.flush(30) == 0


def consumer(bootstrap: str, group: str, assignor: str = "uniform") -> Consumer:
    return Consumer(client_conf(bootstrap, **{
        "group.id": group,
        "group.protocol": "consumer",
        "group.remote.assignor": assignor,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
    }))


# Commit errors a consumer-protocol member may see while its epoch moves
# (librdkafka surfaces them for manual commits and refreshes its epoch by
# heartbeat); the commit is retried, as an application would.
RETRIABLE = {KafkaError.STALE_MEMBER_EPOCH, KafkaError.NOT_COORDINATOR,
             KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
             KafkaError._TRANSPORT, KafkaError._WAIT_COORD, KafkaError.REQUEST_TIMED_OUT,
             KafkaError._TIMED_OUT}


def commit(c: Consumer, m, acked: dict | None = None) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            c.commit(message=m, asynchronous=False)
            if acked is not None:
                acked[(m.topic(), m.partition())] = max(
                    acked.get((m.topic(), m.partition()), -1), m.offset() + 1)
            return
        except KafkaException as e:
            code = e.args[0].code()
            assert code in RETRIABLE and time.monotonic() < deadline, e
            c.poll(0.05)


def poll_into(cs: dict[int, Consumer], seen: dict[int, list[int]], until, timeout: float,
              what: str, acked: dict | None = None) -> None:
    """Poll every consumer round robin; each record is committed (sync)
    before the next poll, so a reassignment never hands it out again."""
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, f"timeout waiting for {what}: seen {len(seen)}"
        for idx, c in cs.items():
            m = c.poll(0.1)
            if m is None:
                continue
            assert m.error() is None, m.error()
            seen.setdefault(int(m.value()), []).append(idx)
            commit(c, m, acked)


def no_dups(seen: dict[int, list[int]]) -> None:
    dups = {v: who for v, who in seen.items() if len(who) > 1}
    assert not dups, f"consumed more than once: {dict(list(dups.items())[:10])}"


def owns_all(cs: dict[int, Consumer], each: int | None = None):
    def ok():
        parts = [tp.partition for c in cs.values() for tp in c.assignment()]
        if sorted(parts) != list(range(PARTITIONS)):
            return False
        return each is None or all(len(c.assignment()) == each for c in cs.values())
    return ok


def test_three_consumers_share_six_partitions_leave_join_and_describe(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, PARTITIONS)
    group = f"kip848-{uuid.uuid4().hex[:8]}"
    cs = {i: consumer(broker.bootstrap, group) for i in range(3)}
    for c in cs.values():
        c.subscribe([topic_name])
    seen: dict[int, list[int]] = {}

    # Server-side uniform assignment: two partitions each, exclusive.
    poll_into(cs, seen, owns_all(cs, 2), 60, "a balanced group")

    n1 = 600
    produce(broker.bootstrap, topic_name, 0, n1)
    poll_into(cs, seen, lambda: len(seen) >= n1, 90, "phase 1")
    assert sorted(seen) == list(range(n1))
    no_dups(seen)
    assert len({who[0] for who in seen.values()}) == 3, "every member consumed"

    # The group as AdminClient sees it: a consumer-protocol group (API 69).
    admin = AdminClient(client_conf(broker.bootstrap))
    desc = admin.describe_consumer_groups([group])[group].result(timeout=15)
    assert desc.group_id == group
    assert str(desc.state).endswith("STABLE"), desc.state
    assert desc.partition_assignor == "uniform"
    assert len(desc.members) == 3
    assigned = sorted(tp.partition for mm in desc.members
                      for tp in mm.assignment.topic_partitions)
    assert assigned == list(range(PARTITIONS))
    if hasattr(desc, "type"):
        assert str(desc.type).endswith("CONSUMER"), desc.type
    # ListGroups v5 with a type filter.
    from confluent_kafka import ConsumerGroupType
    listed = admin.list_consumer_groups(types={ConsumerGroupType.CONSUMER}).result(timeout=15)
    ids = {g.group_id: g for g in listed.valid}
    assert group in ids
    classic_only = admin.list_consumer_groups(types={ConsumerGroupType.CLASSIC}).result(timeout=15)
    assert group not in {g.group_id for g in classic_only.valid}

    # A member leaves: the others take its partitions and carry on.
    cs.pop(1).close()
    poll_into(cs, seen, owns_all(cs, 3), 60, "the survivors to own every partition")
    n2 = 1200
    produce(broker.bootstrap, topic_name, n1, n2)
    poll_into(cs, seen, lambda: len(seen) >= n2, 90, "phase 2")
    assert sorted(seen) == list(range(n2))
    no_dups(seen)
    assert {who[0] for v, who in seen.items() if v >= n1} <= {0, 2}

    # Another joins: partitions move to it only once released.
    cs[3] = consumer(broker.bootstrap, group)
    cs[3].subscribe([topic_name])
    poll_into(cs, seen, owns_all(cs, 2), 60, "the newcomer to get its share")
    n3 = 1800
    produce(broker.bootstrap, topic_name, n2, n3)
    poll_into(cs, seen, lambda: len(seen) >= n3, 90, "phase 3")
    assert sorted(seen) == list(range(n3))
    no_dups(seen)
    assert any(who[0] == 3 for v, who in seen.items() if v >= n2), "the newcomer consumed"
    for c in cs.values():
        c.close()

    # Committed offsets are where the group left off.
    probe = Consumer(client_conf(broker.bootstrap, **{"group.id": group}))
    got = probe.committed([TopicPartition(topic_name, p) for p in range(PARTITIONS)],
                          timeout=15)
    assert sum(tp.offset for tp in got) == n3
    probe.close()
    broker.assert_no_panic()


def test_range_assignor_and_restart_keeps_the_group(broker, topic_name):
    """`group.remote.assignor=range`; after a kill -9 and restart of the
    only broker the group is read back from the shard log and a member
    resumes at the committed offsets."""
    create_topic(broker.bootstrap, topic_name, PARTITIONS)
    group = f"kip848r-{uuid.uuid4().hex[:8]}"
    cs = {i: consumer(broker.bootstrap, group, "range") for i in range(2)}
    for c in cs.values():
        c.subscribe([topic_name])
    seen: dict[int, list[int]] = {}
    poll_into(cs, seen, owns_all(cs, 3), 60, "a range assignment")
    # Range: each member a contiguous block.
    for c in cs.values():
        ps = sorted(tp.partition for tp in c.assignment())
        assert ps in ([0, 1, 2], [3, 4, 5]), ps
    produce(broker.bootstrap, topic_name, 0, 300)
    poll_into(cs, seen, lambda: len(seen) >= 300, 90, "phase 1")
    no_dups(seen)
    for c in cs.values():
        c.close()
    produce(broker.bootstrap, topic_name, 300, 400)
    broker.restart("kill9")
    fresh = {9: consumer(broker.bootstrap, group, "range")}
    fresh[9].subscribe([topic_name])
    later: dict[int, list[int]] = {}
    poll_into(fresh, later, lambda: len(later) >= 100, 120, "resume after restart")
    fresh[9].close()
    assert sorted(later) == list(range(300, 400))
    no_dups(later)
    broker.assert_no_panic()


def test_coordinator_kill9_in_a_cluster_keeps_the_group_and_every_commit(broker_factory,
                                                                         topic_name):
    """Three brokers; three consumer-protocol members commit after every
    record; kill -9 the broker coordinating the group's shard mid-stream.
    Another broker takes the shard over; the members carry on (they
    heartbeat the new coordinator with their epochs), every record is
    consumed, and no acknowledged commit is lost."""
    from cluster import FAST, bootstrap, create_everywhere
    from test_groups import find_coordinator

    bs = broker_factory.cluster(3, FAST + FAST_GROUPS)
    create_everywhere(bs, topic_name, PARTITIONS)
    group = f"kip848k-{uuid.uuid4().hex[:8]}"
    n1 = 600
    produce(bootstrap(bs), topic_name, 0, n1)
    # The shard may not be granted yet right after the cluster starts
    # (COORDINATOR_NOT_AVAILABLE): ask until it is.
    err, node, _, _ = wait_until(
        lambda: (lambda x: x if x[0] == 0 else None)(find_coordinator(bs[0].addr, group)),
        30, what="the group's coordinator")
    # The consumers bootstrap from the brokers that survive.
    live = [b for b in bs if b.broker_id != node]
    cs = {i: consumer(bootstrap(live), group) for i in range(3)}
    for c in cs.values():
        c.subscribe([topic_name])
    seen: dict[int, list[int]] = {}
    acked: dict = {}
    poll_into(cs, seen, lambda: len(seen) >= n1 // 2, 120, "phase 1", acked)

    victim = next(b for b in bs if b.broker_id == node)
    victim.kill9()

    def moved():
        e, n, _, _ = find_coordinator(live[0].addr, group)
        return e == 0 and n != node
    wait_until(moved, 60, what="the shard to move")

    n2 = 1000
    produce(bootstrap(live), topic_name, n1, n2)
    # Records of partitions led by the dead broker come back once their
    # leadership moves too; every record is consumed.
    poll_into(cs, seen, lambda: len(seen) >= n2, 180, "phase 2 after takeover", acked)
    assert sorted(seen) == list(range(n2))
    for c in cs.values():
        c.close()

    # Every acknowledged commit is there (the new coordinator read the
    # shard log the dead one made durable).
    probe = Consumer(client_conf(bootstrap(live), **{"group.id": group}))
    got = probe.committed([TopicPartition(topic_name, p) for p in range(PARTITIONS)],
                          timeout=30)
    probe.close()
    for tp in got:
        assert tp.offset >= acked.get((topic_name, tp.partition), -1), (
            f"partition {tp.partition}: committed {tp.offset} < acked "
            f"{acked.get((topic_name, tp.partition))}")
    assert sum(tp.offset for tp in got) == n2


def test_static_member_restart_keeps_its_partitions_without_a_rebalance(broker, topic_name):
    """`group.instance.id`: a member that closes (a temporary leave, epoch
    -2) and comes back within the session timeout under a new member id
    gets the same partitions, and the other member's never move."""
    create_topic(broker.bootstrap, topic_name, PARTITIONS)
    group = f"kip848s-{uuid.uuid4().hex[:8]}"

    def static(iid: str) -> Consumer:
        return Consumer(client_conf(broker.bootstrap, **{
            "group.id": group, "group.protocol": "consumer",
            "group.instance.id": iid, "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100}))
    cs = {0: static("s0"), 1: static("s1")}
    for c in cs.values():
        c.subscribe([topic_name])
    seen: dict[int, list[int]] = {}
    poll_into(cs, seen, owns_all(cs, 3), 60, "a balanced static group")
    mine = sorted(tp.partition for tp in cs[1].assignment())
    other = sorted(tp.partition for tp in cs[0].assignment())
    cs.pop(1).close()
    cs[1] = static("s1")
    cs[1].subscribe([topic_name])
    poll_into(cs, seen, owns_all(cs, 3), 60, "the static member back")
    assert sorted(tp.partition for tp in cs[1].assignment()) == mine
    assert sorted(tp.partition for tp in cs[0].assignment()) == other
    admin = AdminClient(client_conf(broker.bootstrap))
    desc = admin.describe_consumer_groups([group])[group].result(timeout=15)
    assert sorted(m.group_instance_id for m in desc.members) == ["s0", "s1"]
    for c in cs.values():
        c.close()
    broker.assert_no_panic()


# ---------------------------------------------------------------- raw wire

CGH, JOIN_GROUP = 68, 11


def heartbeat_v1(addr, group: str, member: str, epoch: int, topics=None,
                 assignor: str | None = None, rebalance_ms: int = 30000) -> int:
    """ConsumerGroupHeartbeat v1 (flexible); returns the error code."""
    import kafka_wire as w
    body = (w.compact_string(group) + w.compact_string(member) + w.i32(epoch)
            + w.compact_string(None) + w.compact_string(None) + w.i32(rebalance_ms)
            + (w.compact_array([w.compact_string(t) for t in topics]) if topics is not None
               else w.uvarint(0))
            + w.compact_string(None) + w.compact_string(assignor)
            + (w.compact_array([]) if epoch == 0 else w.uvarint(0))
            + w.TAGS_NONE)
    with w.connect(addr) as s:
        resp = w.roundtrip(s, w.request_header(CGH, 1, 7, flexible=True) + body)
        r = w.Reader(resp)
        assert r.i32() == 7
        r.skip_tags()
        r.i32()  # throttle
        return r.i16()


def test_wire_error_codes(broker, topic_name):
    import kafka_wire as w
    from test_groups import array, call
    create_topic(broker.bootstrap, topic_name, 2)
    g = f"w-{uuid.uuid4().hex[:8]}"
    m = uuid.uuid4().hex

    # The shard may still be granted or loading (15, 16, 14): ask until the
    # coordinator itself answers.
    code = wait_until(
        lambda: (lambda c: c if c not in (14, 15, 16) else None)(
            heartbeat_v1(broker.addr, g, m, 0, [topic_name], assignor="sticky")),
        30, what="a coordinator")
    assert code == 112  # UNSUPPORTED_ASSIGNOR
    assert heartbeat_v1(broker.addr, g, m, 0, [topic_name]) == 0
    assert heartbeat_v1(broker.addr, g, m, 7, None, rebalance_ms=-1) == 110  # FENCED_MEMBER_EPOCH
    assert heartbeat_v1(broker.addr, g, "nobody", 1, None, rebalance_ms=-1) == 25
    assert heartbeat_v1(broker.addr, g, "", 0, [topic_name]) == 42  # INVALID_REQUEST (v1)
    # A classic JoinGroup of a consumer group with members.
    with w.connect(broker.addr, timeout=30) as s:
        r = call(s, JOIN_GROUP, 0, w.string(g) + w.i32(10000) + w.string("")
                 + w.string("consumer") + array([w.string("range") + w.kbytes(b"sub")]))
        assert r.i16() == 23  # INCONSISTENT_GROUP_PROTOCOL
    # A consumer heartbeat of a classic group with members.
    classic = f"c-{uuid.uuid4().hex[:8]}"
    c = Consumer(client_conf(broker.bootstrap, **{"group.id": classic,
                                                  "session.timeout.ms": 6000}))
    c.subscribe([topic_name])
    wait_until(lambda: c.poll(0.2) is None and len(c.assignment()) == 2, 30,
               what="a classic member")
    assert heartbeat_v1(broker.addr, classic, m, 0, [topic_name]) == 69  # GROUP_ID_NOT_FOUND
    c.close()
    # Leaving (-1) empties the group; the empty group converts to classic.
    assert heartbeat_v1(broker.addr, g, m, -1, None, rebalance_ms=-1) == 0
    with w.connect(broker.addr, timeout=30) as s:
        r = call(s, JOIN_GROUP, 0, w.string(g) + w.i32(10000) + w.string("")
                 + w.string("consumer") + array([w.string("range") + w.kbytes(b"sub")]))
        assert r.i16() == 0
