"""Manual replica assignment (issue 27, item 7): CreateTopics and
CreatePartitions naming one live broker per partition are accepted, as a
single-broker Kafka accepts them (kafka-python's `test_create_partitions`,
librdkafka's test 0081); everything else gets the error Kafka's controller
(`ReplicationControlManager`) answers:

* replication factor or partition count set next to an assignment →
  INVALID_REQUEST (42);
* an unknown broker, a broker twice, an empty list, a partition twice,
  partitions not 0..n-1, a CreatePartitions assignment whose count is not
  the number of partitions added, or two replicas for an added partition of
  a replication-factor-1 topic → INVALID_REPLICA_ASSIGNMENT (39);
* two live brokers for one partition at CreateTopics (Kafka would keep two
  copies; kaas keeps one on the shared volume) → INVALID_REPLICATION_FACTOR
  (38), as a replication factor of 2.

The broker named is validated, not honoured: the controller places every
partition (with one broker it is that broker).
"""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import NewPartitions, NewTopic

from conftest import admin, create_topic, wait_topic_ready

INVALID_REPLICATION_FACTOR = 38
INVALID_REPLICA_ASSIGNMENT = 39
INVALID_REQUEST = 42


def confluent_create(bootstrap: str, topic: NewTopic) -> int:
    """Create `topic` with confluent's AdminClient: 0, or the error code."""
    a = admin(bootstrap)
    fs = a.create_topics([topic], operation_timeout=20, request_timeout=20)
    try:
        fs[topic.topic].result(timeout=30)
        return 0
    except KafkaException as e:
        return e.args[0].code()


def confluent_grow(bootstrap: str, topic: str, total: int, assignment) -> int:
    a = admin(bootstrap)
    fs = a.create_partitions([NewPartitions(topic, total, replica_assignment=assignment)],
                             operation_timeout=20, request_timeout=20)
    try:
        fs[topic].result(timeout=30)
        return 0
    except KafkaException as e:
        return e.args[0].code()


def partition_count(bootstrap: str, topic: str) -> int:
    return len(admin(bootstrap).list_topics(topic=topic, timeout=10).topics[topic].partitions)


def test_confluent_one_live_broker_per_partition(broker, topic_name):
    me = broker.broker_id
    assert confluent_create(broker.bootstrap,
                            NewTopic(topic_name, 2, replica_assignment=[[me], [me]])) == 0
    wait_topic_ready(broker.bootstrap, topic_name, 2)
    md = admin(broker.bootstrap).list_topics(topic=topic_name, timeout=10).topics[topic_name]
    assert sorted(md.partitions) == [0, 1]
    assert all(p.leader == me and p.replicas == [me] for p in md.partitions.values())

    assert confluent_grow(broker.bootstrap, topic_name, 3, [[me]]) == 0
    wait_topic_ready(broker.bootstrap, topic_name, 3)


def test_confluent_refusals(broker, topic_name):
    me = broker.broker_id
    b = broker.bootstrap
    # An unknown broker, with or without a known one beside it.
    assert confluent_create(b, NewTopic(topic_name, 2, replica_assignment=[[me], [7]])) == \
        INVALID_REPLICA_ASSIGNMENT
    assert confluent_create(b, NewTopic(topic_name, 1, replica_assignment=[[me, 7]])) == \
        INVALID_REPLICA_ASSIGNMENT
    assert topic_name not in admin(b).list_topics(timeout=10).topics

    create_topic(b, topic_name, partitions=1)
    # Fewer assignments than partitions added; an unknown broker; two
    # replicas where the topic has one.
    assert confluent_grow(b, topic_name, 3, [[me]]) == INVALID_REPLICA_ASSIGNMENT
    assert confluent_grow(b, topic_name, 2, [[7]]) == INVALID_REPLICA_ASSIGNMENT
    assert confluent_grow(b, topic_name, 2, [[me, 7]]) == INVALID_REPLICA_ASSIGNMENT
    assert partition_count(b, topic_name) == 1


def kafka_python_admin(bootstrap: str):
    from kafka.admin import KafkaAdminClient
    return KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)


def kp_code(call) -> int:
    """kafka-python raises the topic's error (2.3) or returns it in the
    response: the code either way, 0 for success."""
    from kafka.errors import BrokerResponseError
    try:
        r = call()
    except BrokerResponseError as e:
        return e.errno
    (err,) = {t[1] for t in r.topic_errors}
    return err


def kp_create(a, name: str, **kw) -> int:
    from kafka.admin import NewTopic as KNewTopic
    return kp_code(lambda: a.create_topics([KNewTopic(name, **kw)], timeout_ms=20000))


def kp_grow(a, name: str, total: int, assignments) -> int:
    from kafka.admin import NewPartitions as KNewPartitions
    return kp_code(lambda: a.create_partitions({name: KNewPartitions(total, assignments)},
                                               timeout_ms=20000))


def test_kafka_python_create_partitions_with_assignment(broker, topic_name):
    """kafka-python's own `test_create_partitions` shape: a topic made with
    an assignment, grown with one."""
    me = broker.broker_id
    a = kafka_python_admin(broker.bootstrap)
    try:
        assert kp_create(a, topic_name, num_partitions=-1, replication_factor=-1,
                         replica_assignments={0: [me], 1: [me]}) == 0
        wait_topic_ready(broker.bootstrap, topic_name, 2)
        assert kp_grow(a, topic_name, 4, [[me], [me]]) == 0
        wait_topic_ready(broker.bootstrap, topic_name, 4)
    finally:
        a.close()


def test_kafka_python_refusals(broker, topic_name):
    me = broker.broker_id
    a = kafka_python_admin(broker.bootstrap)
    try:
        cases = [
            # A replication factor or a partition count beside an assignment.
            (dict(num_partitions=-1, replication_factor=1, replica_assignments={0: [me]}),
             INVALID_REQUEST),
            (dict(num_partitions=1, replication_factor=-1, replica_assignments={0: [me]}),
             INVALID_REQUEST),
            # Partitions not 0..n-1.
            (dict(num_partitions=-1, replication_factor=-1,
                  replica_assignments={0: [me], 2: [me]}), INVALID_REPLICA_ASSIGNMENT),
            (dict(num_partitions=-1, replication_factor=-1, replica_assignments={1: [me]}),
             INVALID_REPLICA_ASSIGNMENT),
            # A broker twice, an empty list, an unknown broker.
            (dict(num_partitions=-1, replication_factor=-1, replica_assignments={0: [me, me]}),
             INVALID_REPLICA_ASSIGNMENT),
            (dict(num_partitions=-1, replication_factor=-1, replica_assignments={0: []}),
             INVALID_REPLICA_ASSIGNMENT),
            (dict(num_partitions=-1, replication_factor=-1, replica_assignments={0: [9]}),
             INVALID_REPLICA_ASSIGNMENT),
        ]
        for kw, want in cases:
            assert kp_create(a, topic_name, **kw) == want, kw
        assert topic_name not in admin(broker.bootstrap).list_topics(timeout=10).topics

        create_topic(broker.bootstrap, topic_name, partitions=1)
        assert kp_grow(a, topic_name, 2, [[me], [me]]) == INVALID_REPLICA_ASSIGNMENT
        assert kp_grow(a, topic_name, 2, []) == INVALID_REPLICA_ASSIGNMENT
        assert kp_grow(a, topic_name, 2, [[me, me]]) == INVALID_REPLICA_ASSIGNMENT
        assert kp_grow(a, topic_name, 2, [[]]) == INVALID_REPLICA_ASSIGNMENT
        assert partition_count(broker.bootstrap, topic_name) == 1
    finally:
        a.close()


def test_two_live_brokers_for_one_partition_is_a_replication_factor_of_two(
        broker_factory, topic_name):
    """Both brokers are live, so Kafka would accept [[0, 1]] and keep two
    copies; kaas keeps one and answers as for a replication factor of 2.
    One broker per partition, either one, is accepted."""
    b0, b1 = broker_factory.cluster(2)
    assert confluent_create(b0.bootstrap, NewTopic(topic_name, 1, replica_assignment=[[0, 1]])) == \
        INVALID_REPLICATION_FACTOR
    assert confluent_create(b0.bootstrap, NewTopic(topic_name, 1, replication_factor=2)) == \
        INVALID_REPLICATION_FACTOR
    assert confluent_create(b0.bootstrap,
                            NewTopic(topic_name, 2, replica_assignment=[[1], [0]])) == 0
    wait_topic_ready(b1.bootstrap, topic_name, 2)


def test_validate_only_with_assignment_creates_nothing(broker, topic_name):
    me = broker.broker_id
    a = admin(broker.bootstrap)
    fs = a.create_topics(
        [NewTopic(topic_name, 1, replica_assignment=[[me]])],
        validate_only=True, operation_timeout=20, request_timeout=20)
    fs[topic_name].result(timeout=30)
    assert topic_name not in admin(broker.bootstrap).list_topics(timeout=10).topics
