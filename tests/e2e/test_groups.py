"""Consumer groups end to end (classic protocol), with real clients.

* confluent-kafka: three consumers in one group over six partitions consume
  every record exactly once (each commits synchronously after every record);
  a member closes, the others take over its partitions and carry on; after a
  kill -9 and restart of the broker, a new member of the group resumes at the
  committed offsets.
* three brokers: kill -9 the broker coordinating a group's shard; another
  broker takes the shard over and a new member resumes right after the last
  acknowledged commit.
* kafka-python: KafkaConsumer with group_id commits and resumes; kcat
  (librdkafka 2.0.2) `-G` likewise.
* raw wire: FindCoordinator, JoinGroup, SyncGroup, OffsetCommit, OffsetFetch
  with the error codes Kafka gives (ILLEGAL_GENERATION 22, UNKNOWN_MEMBER_ID
  25).
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer

import kafka_wire as w
from conftest import client_conf, create_topic, producer_conf, wait_until

# Run on a local dir and on a weakfs (NFS-like) mount: see conftest.py.
pytestmark = [
    pytest.mark.substrates("local", "weakfs"),
    # Fewer shards than the default 50 keep the start quick on weakfs; the
    # group's first rebalance waits 300 ms for more members, not 3 s.
    pytest.mark.broker_args("--group-shards", "8",
                            "--group-initial-rebalance-delay-ms", "300"),
]

PARTITIONS = 6


def produce(bootstrap: str, topic: str, lo: int, hi: int) -> None:
    p = Producer(producer_conf(bootstrap))
    for i in range(lo, hi):
        p.produce(topic, value=b"%d" % i, partition=i % PARTITIONS)
        p.poll(0)
    assert p.flush(30) == 0


def consumer(bootstrap: str, group: str) -> Consumer:
    return Consumer(client_conf(bootstrap, **{
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        "fetch.wait.max.ms": 100,
    }))


def poll_into(cs: dict[int, Consumer], seen: dict[int, list[int]], until, timeout: float,
              what: str) -> None:
    """Poll every consumer round robin; each record is committed (sync)
    before the next poll, so a rebalance never hands it out again."""
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, f"timeout waiting for {what}: seen {len(seen)}"
        for idx, c in cs.items():
            m = c.poll(0.1)
            if m is None:
                continue
            assert m.error() is None, m.error()
            seen.setdefault(int(m.value()), []).append(idx)
            c.commit(message=m, asynchronous=False)


def drain(cs: dict[int, Consumer], seen: dict[int, list[int]], secs: float) -> None:
    """Keep polling for `secs`: anything handed out again would show up."""
    end = time.monotonic() + secs
    poll_into(cs, seen, lambda: time.monotonic() > end, secs + 5, "drain")


def test_three_consumers_share_six_partitions_and_survive_restart(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, PARTITIONS)
    group = f"g-{uuid.uuid4().hex[:8]}"
    cs = {i: consumer(broker.bootstrap, group) for i in range(3)}
    for c in cs.values():
        c.subscribe([topic_name])
    seen: dict[int, list[int]] = {}

    # Everyone joins and gets two partitions before anything is produced.
    def balanced():
        return all(len(c.assignment()) == 2 for c in cs.values())
    poll_into(cs, seen, balanced, 60, "a balanced group")
    owned = [tp.partition for c in cs.values() for tp in c.assignment()]
    assert sorted(owned) == list(range(PARTITIONS))

    n1 = 600
    produce(broker.bootstrap, topic_name, 0, n1)
    poll_into(cs, seen, lambda: len(seen) >= n1, 90, "phase 1")
    assert sorted(seen) == list(range(n1))
    dups = {v: who for v, who in seen.items() if len(who) > 1}
    assert not dups, f"consumed more than once: {dict(list(dups.items())[:10])}"
    assert len({who[0] for who in seen.values()}) == 3, "every member consumed"

    # A member leaves (LeaveGroup): the other two take its partitions.
    cs.pop(1).close()
    poll_into(cs, seen, lambda: sum(len(c.assignment()) for c in cs.values()) == PARTITIONS,
              60, "the survivors to own every partition")
    n2 = 1200
    produce(broker.bootstrap, topic_name, n1, n2)
    poll_into(cs, seen, lambda: len(seen) >= n2, 90, "phase 2")
    assert sorted(seen) == list(range(n2))
    dups = {v: who for v, who in seen.items() if len(who) > 1}
    assert not dups, f"consumed more than once: {dict(list(dups.items())[:10])}"
    assert {who[0] for v, who in seen.items() if v >= n1} <= {0, 2}
    for c in cs.values():
        c.close()

    # Committed offsets are durable: kill -9, restart, and a new member of
    # the group resumes where the group left off.
    n3 = 1500
    produce(broker.bootstrap, topic_name, n2, n3)
    broker.restart("kill9")
    fresh = {9: consumer(broker.bootstrap, group)}
    fresh[9].subscribe([topic_name])
    later: dict[int, list[int]] = {}
    poll_into(fresh, later, lambda: len(later) >= n3 - n2, 120, "resume after restart")
    # Nothing already committed comes back.
    drain(fresh, later, 2.0)
    assert all(len(v) == 1 for v in later.values()), "consumed twice"
    assert sorted(later) == list(range(n2, n3)), (
        f"resumed at the wrong place: min={min(later)} n={len(later)}")
    fresh[9].close()
    broker.assert_no_panic()


def test_kafka_python_group_consumer_commits_and_resumes(broker, topic_name):
    from kafka import KafkaConsumer, TopicPartition

    create_topic(broker.bootstrap, topic_name, 2)
    produce_n = 100
    p = Producer(producer_conf(broker.bootstrap))
    for i in range(produce_n):
        p.produce(topic_name, value=b"%d" % i, partition=i % 2)
    assert p.flush(30) == 0
    group = f"kp-{uuid.uuid4().hex[:8]}"

    def make():
        return KafkaConsumer(topic_name, bootstrap_servers=broker.bootstrap, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             consumer_timeout_ms=3000, request_timeout_ms=30000)

    c = make()
    got = []
    deadline = time.monotonic() + 60
    while len(got) < 60 and time.monotonic() < deadline:
        for m in c:
            got.append(int(m.value))
            if len(got) == 60:
                break
    assert len(got) == 60
    c.commit()
    committed = {tp: c.committed(TopicPartition(topic_name, tp)) for tp in (0, 1)}
    assert sum(committed.values()) == 60, committed
    c.close()

    c = make()
    rest = []
    deadline = time.monotonic() + 60
    while len(rest) < produce_n - 60 and time.monotonic() < deadline:
        for m in c:
            rest.append(int(m.value))
    c.close()
    assert sorted(got + rest) == list(range(produce_n)), "resumed at the committed offsets"


# ---------------------------------------------------------------------------
# raw wire: error codes
# ---------------------------------------------------------------------------
FIND_COORDINATOR, JOIN_GROUP, SYNC_GROUP, OFFSET_COMMIT, OFFSET_FETCH = 10, 11, 14, 8, 9
ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID = 22, 25


def call(sock, key, version, body, cid=[0]):
    cid[0] += 1
    resp = w.roundtrip(sock, w.request_header(key, version, cid[0]) + body)
    r = w.Reader(resp)
    assert r.i32() == cid[0]
    return r


def array(items):
    return w.i32(len(items)) + b"".join(items)


def test_wire_join_sync_commit_fetch_and_error_codes(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 1)
    group = f"wire-{uuid.uuid4().hex[:8]}"

    def find():
        with w.connect(broker.addr) as s:
            r = call(s, FIND_COORDINATOR, 0, w.string(group))
            return r.i16(), r.i32(), r.string(), r.i32()
    err, node, host, port = wait_until(lambda: (lambda x: x if x[0] == 0 else None)(find()),
                                       30, what="a coordinator")
    assert (host, port) == broker.addr and node == 0

    with w.connect(broker.addr, timeout=30) as s:
        # JoinGroup v0: no member id required; the join completes after the
        # initial rebalance delay.
        r = call(s, JOIN_GROUP, 0, w.string(group) + w.i32(10000) + w.string("")
                 + w.string("consumer") + array([w.string("range") + w.kbytes(b"sub")]))
        assert r.i16() == 0
        generation = r.i32()
        assert r.string() == "range"
        leader = r.string()
        member = r.string()
        assert leader == member and generation >= 1
        r = call(s, SYNC_GROUP, 0, w.string(group) + w.i32(generation) + w.string(member)
                 + array([w.string(member) + w.kbytes(b"assigned")]))
        assert r.i16() == 0
        n = r.i32()
        assert r.take(n) == b"assigned"

        def commit(gen, mem, offset):
            body = (w.string(group) + w.i32(gen) + w.string(mem) + w.i64(-1)
                    + array([w.string(topic_name)
                             + array([w.i32(0) + w.i64(offset) + w.string("meta")])]))
            r = call(s, OFFSET_COMMIT, 2, body)
            assert r.i32() == 1 and r.string() == topic_name and r.i32() == 1
            assert r.i32() == 0
            return r.i16()

        assert commit(generation, member, 17) == 0
        assert commit(generation + 1, member, 18) == ILLEGAL_GENERATION
        assert commit(generation, "someone-else", 19) == UNKNOWN_MEMBER_ID

        r = call(s, OFFSET_FETCH, 1, w.string(group)
                 + array([w.string(topic_name) + array([w.i32(0)])]))
        assert r.i32() == 1 and r.string() == topic_name and r.i32() == 1
        assert r.i32() == 0
        assert r.i64() == 17, "only the accepted commit is stored"
        assert r.string() == "meta"
        assert r.i16() == 0


def fsyncs_total(broker) -> float:
    for line in broker.metrics().splitlines():
        if line.startswith("kaas_fsyncs_total"):
            return float(line.split()[-1])
    raise AssertionError("kaas_fsyncs_total missing from /metrics")


def test_pipelined_commits_of_one_connection_share_fsyncs(broker, topic_name):
    """64 OffsetCommits pipelined on one connection reach the coordinator
    together and share a few fsyncs; each is still answered only after the
    fsync covering it. Before OffsetCommit posted to the coordinator while
    the request was parsed, each waited for the previous answer: 64 fsyncs."""
    create_topic(broker.bootstrap, topic_name, 1)
    group = f"pipe-{uuid.uuid4().hex[:8]}"
    wait_until(lambda: find_coordinator(broker.addr, group)[0] == 0, 30, what="a coordinator")

    def commit(cid: int, offset: int) -> bytes:
        body = (w.string(group) + w.i32(-1) + w.string("") + w.i64(-1)
                + array([w.string(topic_name) + array([w.i32(0) + w.i64(offset) + w.string("")])]))
        return w.frame(w.request_header(OFFSET_COMMIT, 2, cid) + body)

    n = 64
    with w.connect(broker.addr, timeout=30) as s:
        s.sendall(commit(1, 0))  # opens the shard's files; not measured
        w.recv_frame(s)
        before = fsyncs_total(broker)
        s.sendall(b"".join(commit(100 + i, i + 1) for i in range(n)))
        for i in range(n):
            r = w.Reader(w.recv_frame(s))
            assert r.i32() == 100 + i, "answers in request order"
            assert r.i32() == 1 and r.string() == topic_name and r.i32() == 1
            assert r.i32() == 0 and r.i16() == 0
        spent = fsyncs_total(broker) - before
    assert 1 <= spent <= n // 2, f"{spent} fsyncs for {n} pipelined commits"
    with w.connect(broker.addr) as s:
        r = call(s, OFFSET_FETCH, 1, w.string(group)
                 + array([w.string(topic_name) + array([w.i32(0)])]))
        assert r.i32() == 1 and r.string() == topic_name and r.i32() == 1
        assert r.i32() == 0 and r.i64() == n, "the last commit is the stored one"


def find_coordinator(addr, group: str):
    """FindCoordinator v0 of `group` asked at `addr`: (error, node, host, port)."""
    with w.connect(addr) as s:
        r = call(s, FIND_COORDINATOR, 0, w.string(group))
        return r.i16(), r.i32(), r.string(), r.i32()


@pytest.mark.substrates("glusterfs")
def test_coordinator_takeover_after_kill9_keeps_every_acknowledged_commit(broker_factory,
                                                                            topic_name):
    """Three brokers; a group commits after every record; kill -9 the
    broker coordinating the group's shard: another broker takes the shard
    over (a new epoch, reading what the dead one made durable), and a new
    member resumes exactly after the last acknowledged commit."""
    from cluster import FAST, bootstrap, create_everywhere

    bs = broker_factory.cluster(3, FAST + ["--group-shards", "8",
                                           "--group-initial-rebalance-delay-ms", "300"])
    create_everywhere(bs, topic_name, PARTITIONS)
    group = f"tk-{uuid.uuid4().hex[:8]}"
    n1 = 600
    produce(bootstrap(bs), topic_name, 0, n1)
    cs = {i: consumer(bootstrap(bs), group) for i in range(2)}
    for c in cs.values():
        c.subscribe([topic_name])
    seen: dict[int, list[int]] = {}
    poll_into(cs, seen, lambda: len(seen) >= n1, 120, "phase 1")
    assert sorted(seen) == list(range(n1))
    for c in cs.values():
        c.close()

    err, node, _, _ = find_coordinator(bs[0].addr, group)
    assert err == 0
    victim = next(b for b in bs if b.broker_id == node)
    victim.kill9()
    live = [b for b in bs if b.alive()]

    def moved():
        e, n, _, _ = find_coordinator(live[0].addr, group)
        return e == 0 and n != node
    wait_until(moved, 30, what="the shard to move")

    n2 = 800
    produce(bootstrap(live), topic_name, n1, n2)
    fresh = {9: consumer(bootstrap(live), group)}
    fresh[9].subscribe([topic_name])
    later: dict[int, list[int]] = {}
    poll_into(fresh, later, lambda: len(later) >= n2 - n1, 120, "resume after takeover")
    drain(fresh, later, 2.0)
    fresh[9].close()
    assert all(len(v) == 1 for v in later.values()), "consumed twice"
    assert sorted(later) == list(range(n1, n2)), (
        f"resumed at the wrong place: min={min(later)} n={len(later)}")


def test_kcat_balanced_consumer_commits_and_resumes(broker, topic_name):
    """Debian kcat (librdkafka 2.0.2) `-G`: a balanced consumer reads
    everything, auto-commits, and a second run of the group starts at the
    end."""
    import shutil
    import subprocess

    if shutil.which("kcat") is None:
        pytest.skip("kcat not installed")
    create_topic(broker.bootstrap, topic_name, 2)
    p = Producer(producer_conf(broker.bootstrap))
    for i in range(40):
        p.produce(topic_name, value=b"%d" % i, partition=i % 2)
    assert p.flush(30) == 0
    group = f"kc-{uuid.uuid4().hex[:8]}"
    first = subprocess.run(["kcat", "-b", broker.bootstrap, "-G", group, "-o", "beginning",
                            "-c", "40", "-e", topic_name],
                           capture_output=True, timeout=60)
    assert first.returncode == 0, first.stderr[-500:]
    assert sorted(int(x) for x in first.stdout.split()) == list(range(40))
    again = subprocess.run(["kcat", "-b", broker.bootstrap, "-G", group, "-e", topic_name],
                           capture_output=True, timeout=60)
    assert again.returncode == 0, again.stderr[-500:]
    assert again.stdout.split() == [], "resumed at the committed end"


OFFSET_DELETE = 47
GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP, GROUP_SUBSCRIBED_TO_TOPIC = 69, 68, 86


def offset_delete(addr, group: str, parts: dict[str, list[int]]):
    """OffsetDelete v0: (group error, {(topic, partition): error})."""
    with w.connect(addr) as s:
        body = w.string(group) + array([w.string(t) + array([w.i32(p) for p in ps])
                                        for t, ps in parts.items()])
        r = call(s, OFFSET_DELETE, 0, body)
        err = r.i16()
        r.i32()  # throttle
        out = {}
        for _ in range(r.i32()):
            t = r.string()
            for _ in range(r.i32()):
                p = r.i32()
                out[(t, p)] = r.i16()
        return err, out


def committed(bootstrap: str, group: str, topic: str, partition: int = 0) -> int:
    from confluent_kafka import TopicPartition
    c = Consumer(client_conf(bootstrap, **{"group.id": group, "enable.auto.commit": False}))
    try:
        return c.committed([TopicPartition(topic, partition)], timeout=20)[0].offset
    finally:
        c.close()


def test_delete_groups_and_offset_delete(broker, topic_name):
    """DeleteGroups (confluent-kafka and kafka-python AdminClients) and
    OffsetDelete (raw v0): a group with a live member is NON_EMPTY_GROUP and
    keeps the offsets of topics it subscribes to (GROUP_SUBSCRIBED_TO_TOPIC);
    other offsets go; an empty group is deleted with all its offsets, then
    unknown (GROUP_ID_NOT_FOUND)."""
    from confluent_kafka import KafkaError, TopicPartition
    from confluent_kafka.admin import AdminClient
    other = topic_name + "-other"
    create_topic(broker.bootstrap, topic_name, 1)
    create_topic(broker.bootstrap, other, 1)
    produce(broker.bootstrap, topic_name, 0, 10)
    group = f"del-{uuid.uuid4().hex[:8]}"
    c = consumer(broker.bootstrap, group)
    c.subscribe([topic_name])
    deadline = time.monotonic() + 30
    while not c.assignment() and time.monotonic() < deadline:
        c.poll(0.2)
    assert c.assignment(), "never joined"
    c.commit(offsets=[TopicPartition(topic_name, 0, 5), TopicPartition(other, 0, 7)],
             asynchronous=False)
    a = AdminClient(client_conf(broker.bootstrap))
    with pytest.raises(Exception) as e:
        a.delete_consumer_groups([group], request_timeout=20)[group].result(timeout=30)
    assert e.value.args[0].code() == KafkaError.NON_EMPTY_GROUP, e.value
    err, res = offset_delete(broker.addr, group, {topic_name: [0], other: [0]})
    assert err == 0
    assert res == {(topic_name, 0): GROUP_SUBSCRIBED_TO_TOPIC, (other, 0): 0}, res
    assert committed(broker.bootstrap, group, other) < 0, "deleted offset still committed"
    assert committed(broker.bootstrap, group, topic_name) == 5
    c.close()
    # Empty now: deleted with every offset.
    wait_until(lambda: a.delete_consumer_groups([group], request_timeout=20)[group]
               .exception(timeout=30) is None, 30, what="the group deleted once empty")
    assert committed(broker.bootstrap, group, topic_name) < 0
    listed = [g.group_id for g in a.list_consumer_groups().result(timeout=20).valid]
    assert group not in listed
    with pytest.raises(Exception) as e:
        a.delete_consumer_groups([group], request_timeout=20)[group].result(timeout=30)
    assert e.value.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND, e.value
    err, _ = offset_delete(broker.addr, group, {topic_name: [0]})
    assert err == GROUP_ID_NOT_FOUND
    # kafka-python: a group that only stores offsets (a standalone
    # consumer's) is deletable too.
    from kafka import KafkaAdminClient
    solo = f"solo-{uuid.uuid4().hex[:8]}"
    c2 = Consumer(client_conf(broker.bootstrap, **{"group.id": solo, "enable.auto.commit": False}))
    c2.commit(offsets=[TopicPartition(topic_name, 0, 3)], asynchronous=False)
    c2.close()
    ka = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        from kafka.errors import NoError
        assert ka.delete_consumer_groups([solo]) == [(solo, NoError)]
    finally:
        ka.close()
    assert committed(broker.bootstrap, solo, topic_name) < 0
