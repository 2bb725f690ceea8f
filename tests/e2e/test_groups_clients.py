"""Consumer groups with more real clients, and what the broker tells on-call.

* DescribeGroups shows each member's client id and client host (the
  request header's client id, the connection's peer address), as Kafka does.
* Consumer lag: a group that commits behind the end of a topic shows up in
  `/metrics` (per group and topic, and per partition) and in the
  coordinator's entry of `/api/actors`.
* A client hammering an API the broker does not serve gets a bounded number
  of WARN lines (once per interval per peer), not one per request.
"""

from __future__ import annotations

import re
import socket
import time
import urllib.request
import json
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

import kafka_wire as w
from conftest import client_conf, create_topic, producer_conf, wait_until

pytestmark = [
    pytest.mark.substrates("local"),
    pytest.mark.broker_args("--group-shards", "8",
                            "--group-initial-rebalance-delay-ms", "300"),
]


def produce(bootstrap: str, topic: str, n: int, partitions: int, start: int = 0) -> None:
    p = Producer(producer_conf(bootstrap))
    for i in range(start, start + n):
        p.produce(topic, value=b"%d" % i, partition=i % partitions)
        p.poll(0)
    assert p.flush(30) == 0


def group_consumer(bootstrap: str, group: str, **extra) -> Consumer:
    conf = {
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        "fetch.wait.max.ms": 100,
    }
    conf.update(extra)
    return Consumer(client_conf(bootstrap, **conf))


def wait_assigned(cs: list[Consumer], total: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while sum(len(c.assignment()) for c in cs) != total:
        assert time.monotonic() < deadline, "group never balanced"
        for c in cs:
            c.poll(0.1)


# ---------------------------------------------------------------------------
# DescribeGroups: client id and host
# ---------------------------------------------------------------------------


def test_describe_groups_shows_member_client_id_and_host(broker, topic_name):
    from confluent_kafka.admin import AdminClient

    create_topic(broker.bootstrap, topic_name, 2)
    group = f"desc-{uuid.uuid4().hex[:8]}"
    c = group_consumer(broker.bootstrap, group, **{"client.id": "lag-watcher-7"})
    c.subscribe([topic_name])
    wait_assigned([c], 2)

    a = AdminClient(client_conf(broker.bootstrap))
    d = a.describe_consumer_groups([group])[group].result(timeout=30)
    assert len(d.members) == 1, d
    m = d.members[0]
    assert m.client_id == "lag-watcher-7", m
    # Kafka shows the peer address as "/ip"; the client connects on loopback.
    assert m.host.lstrip("/") == "127.0.0.1", m.host

    c.close()
    broker.assert_no_panic()
