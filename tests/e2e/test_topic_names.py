"""Topic names (issue 13): every name Kafka accepts works, and names that
Kafka refuses as colliding are refused with its error code."""

import time

from confluent_kafka.admin import NewTopic

from conftest import admin, create_topic, produce_and_check

INVALID_TOPIC_EXCEPTION = 17


def create_code(bootstrap, name, partitions=1, timeout=30.0):
    a = admin(bootstrap)  # kept alive until the future resolves
    f = a.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)],
                        operation_timeout=timeout, request_timeout=timeout)[name]
    e = f.exception(timeout=timeout)
    return 0 if e is None else e.args[0].code()


def test_249_character_name_is_created_used_deleted_and_recreated(broker):
    name = "n" * 240 + "-" + "x" * 8
    assert len(name) == 249
    create_topic(broker.bootstrap, name, 2)
    produce_and_check(broker.bootstrap, name)
    a = admin(broker.bootstrap)
    a.delete_topics([name], operation_timeout=30)[name].result(timeout=30)
    deadline = time.monotonic() + 30
    while broker.topic_dir(name).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not broker.topic_dir(name).exists()
    create_topic(broker.bootstrap, name, 1)
    produce_and_check(broker.bootstrap, name)
    assert "File name too long" not in broker.log_text()
    broker.assert_no_panic()


def test_dot_and_underscore_names_collide(broker, topic_name):
    base = topic_name.replace(".", "-").replace("_", "-")
    dotted = base + "-a.b"
    create_topic(broker.bootstrap, dotted)
    assert create_code(broker.bootstrap, base + "-a_b") == INVALID_TOPIC_EXCEPTION
    assert not broker.topic_dir(base + "-a_b").exists()
    # Not a collision: another name entirely.
    assert create_code(broker.bootstrap, base + "-a-b") == 0
    produce_and_check(broker.bootstrap, dotted)
