"""DescribeTopicPartitions (key 75, KIP-966; issue 27, item 10): how Kafka
3.8+ admin clients (the Java AdminClient's `describeTopics`) describe
topics, with cursor paging. Neither Python client here sends it (librdkafka
2.16's `describe_topics` uses Metadata; kafka-python 2.3 lists it as not
supported), so the requests go over the raw wire, and confluent-kafka's
`describe_topics` checks the answer against what Metadata says.

Checked, against Kafka's `DescribeTopicPartitionsRequestHandler` /
`KRaftMetadataCache.describeTopicResponse`:
* advertised (v0) in ApiVersions;
* topics sorted by name, each partition's leader, epoch, replicas and ISR
  (this broker), empty ELR lists, topic ids, every topic operation (no
  authorizer);
* `response_partition_limit` counts partitions across topics; `next_cursor`
  points inside a topic cut short, at the next topic's partition 0 when the
  limit ends with a topic, and is null at the end; following it visits
  every partition exactly once, also for an empty list (every topic);
* an unknown topic → UNKNOWN_TOPIC_OR_PARTITION (3), an illegal name →
  INVALID_TOPIC_EXCEPTION (17), a cursor naming a topic the request does
  not list → INVALID_REQUEST (42) for every listed topic.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from confluent_kafka import TopicCollection

import kafka_wire as w
from conftest import admin, create_topic

DESCRIBE_TOPIC_PARTITIONS = 75
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_TOPIC_EXCEPTION = 17
INVALID_REQUEST = 42
# READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, DESCRIBE_CONFIGS,
# ALTER_CONFIGS: what Kafka reports for a topic without an authorizer.
TOPIC_OPERATIONS = sum(1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))


@dataclass
class Partition:
    error_code: int
    index: int
    leader: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    elr: list[int] | None
    last_known_elr: list[int] | None
    offline: list[int]


@dataclass
class Topic:
    error_code: int
    name: str | None
    topic_id: uuid.UUID
    is_internal: bool
    partitions: list[Partition] = field(default_factory=list)
    authorized_operations: int = 0


def _int32s(r: w.Reader) -> list[int] | None:
    n = r.compact_array_len()
    return None if n < 0 else [r.i32() for _ in range(n)]


def describe(addr, topics: list[str], limit: int = 2000,
             cursor: tuple[str, int] | None = None
             ) -> tuple[list[Topic], tuple[str, int] | None]:
    """One DescribeTopicPartitions v0 request: the topics answered and the
    next cursor."""
    body = w.compact_array([w.compact_string(t) + w.TAGS_NONE for t in topics])
    body += w.i32(limit)
    if cursor is None:
        body += w.i8(-1)
    else:
        body += w.i8(1) + w.compact_string(cursor[0]) + w.i32(cursor[1]) + w.TAGS_NONE
    body += w.TAGS_NONE
    with w.connect(addr) as s:
        r = w.Reader(w.roundtrip(
            s, w.request_header(DESCRIBE_TOPIC_PARTITIONS, 0, 7, flexible=True) + body))
    assert r.i32() == 7  # correlation id
    r.skip_tags()  # response header v1
    r.i32()  # throttle
    out = []
    for _ in range(r.compact_array_len()):
        t = Topic(error_code=r.i16(), name=r.compact_string(),
                  topic_id=uuid.UUID(bytes=r.take(16)), is_internal=bool(r.i8()))
        for _ in range(r.compact_array_len()):
            t.partitions.append(Partition(
                error_code=r.i16(), index=r.i32(), leader=r.i32(), leader_epoch=r.i32(),
                replicas=_int32s(r), isr=_int32s(r), elr=_int32s(r),
                last_known_elr=_int32s(r), offline=_int32s(r)))
            r.skip_tags()
        t.authorized_operations = r.i32()
        r.skip_tags()
        out.append(t)
    nxt = None
    if r.i8() >= 0:
        nxt = (r.compact_string(), r.i32())
        r.skip_tags()
    r.skip_tags()
    assert r.remaining() == 0
    return out, nxt


def pages(t: list[Topic]) -> list[tuple[str, list[int]]]:
    return [(x.name, [p.index for p in x.partitions]) for x in t]


def test_advertised(broker):
    assert w.api_versions(broker.addr).api_keys.get(DESCRIBE_TOPIC_PARTITIONS) == (0, 0)


def test_topics_match_what_clients_see_in_metadata(broker, topic_name):
    """Each partition as confluent-kafka's `describe_topics` (Metadata)
    shows it: leader, replicas, ISR, topic id."""
    create_topic(broker.bootstrap, topic_name, partitions=3)
    a = admin(broker.bootstrap)
    want = a.describe_topics(TopicCollection([topic_name]))[topic_name].result(timeout=30)
    tid = want.topic_id
    want_id = uuid.UUID(int=((tid.get_most_significant_bits() & (2**64 - 1)) << 64)
                        | (tid.get_least_significant_bits() & (2**64 - 1)))

    topics, nxt = describe(broker.addr, [topic_name])
    assert nxt is None
    (t,) = topics
    assert (t.error_code, t.name, t.topic_id, t.is_internal) == \
        (0, topic_name, want_id, False)
    assert t.authorized_operations == TOPIC_OPERATIONS
    assert [p.index for p in t.partitions] == [0, 1, 2]
    me = broker.broker_id
    for p, q in zip(t.partitions, want.partitions):
        assert (p.error_code, p.leader, p.replicas, p.isr) == (0, me, [me], [me])
        assert (q.leader.id, [n.id for n in q.replicas], [n.id for n in q.isr]) == \
            (p.leader, p.replicas, p.isr)
        assert p.leader_epoch >= 0
        assert (p.elr, p.last_known_elr, p.offline) == ([], [], [])


def test_cursor_paging_across_topics(broker, topic_name):
    a, b, c = (f"{topic_name}-a", f"{topic_name}-b", f"{topic_name}-c")
    for name, n in ((a, 3), (b, 1), (c, 2)):
        create_topic(broker.bootstrap, name, partitions=n)

    # Listed out of order: answered sorted; two partitions a page.
    listed = [c, a, b]
    topics, nxt = describe(broker.addr, listed, limit=2)
    assert (pages(topics), nxt) == ([(a, [0, 1])], (a, 2))
    topics, nxt = describe(broker.addr, listed, limit=2, cursor=nxt)
    # The limit ends with b: the cursor is c's partition 0.
    assert (pages(topics), nxt) == ([(a, [2]), (b, [0])], (c, 0))
    topics, nxt = describe(broker.addr, listed, limit=2, cursor=nxt)
    assert (pages(topics), nxt) == ([(c, [0, 1])], None)

    # Everything fits: one page, no cursor.
    topics, nxt = describe(broker.addr, listed)
    assert (pages(topics), nxt) == ([(a, [0, 1, 2]), (b, [0]), (c, [0, 1])], None)


def test_empty_list_pages_through_every_topic(broker, topic_name):
    """Following the cursor from the start visits every partition of every
    topic exactly once, in order (a topic of many partitions, small pages)."""
    big, small = f"{topic_name}-big", f"{topic_name}-small"
    create_topic(broker.bootstrap, big, partitions=40)
    create_topic(broker.bootstrap, small, partitions=2)
    seen: list[tuple[str, int]] = []
    cursor = None
    for _ in range(100):
        topics, cursor = describe(broker.addr, [], limit=7, cursor=cursor)
        assert sum(len(t.partitions) for t in topics) <= 7
        assert all(t.error_code == 0 for t in topics)
        seen += [(t.name, p.index) for t in topics for p in t.partitions]
        if cursor is None:
            break
    assert cursor is None
    assert seen == [(big, i) for i in range(40)] + [(small, 0), (small, 1)]


def test_errors(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, partitions=1)
    missing = f"{topic_name}-missing"
    topics, nxt = describe(broker.addr, [topic_name, missing, "bad name!"])
    assert nxt is None
    got = {t.name: (t.error_code, len(t.partitions), t.topic_id) for t in topics}
    assert got["bad name!"] == (INVALID_TOPIC_EXCEPTION, 0, uuid.UUID(int=0))
    assert got[missing] == (UNKNOWN_TOPIC_OR_PARTITION, 0, uuid.UUID(int=0))
    assert got[topic_name][:2] == (0, 1)

    # A cursor on a topic the request does not list: INVALID_REQUEST for
    # every listed topic, as Kafka's InvalidRequestException answer.
    topics, nxt = describe(broker.addr, [topic_name], cursor=(missing, 0))
    assert nxt is None
    assert [(t.name, t.error_code, t.partitions) for t in topics] == \
        [(topic_name, INVALID_REQUEST, [])]
