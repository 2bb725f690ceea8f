"""KIP-848 regex subscriptions (`group.protocol=consumer`) with
confluent-kafka (librdkafka 2.16), in the order Kafka produces them.

Kafka resolves a subscribed regular expression asynchronously
(`GroupMetadataManager.maybeUpdateRegularExpressions` schedules
`refreshRegularExpressions`; `handleRegularExpressionsResult` bumps the
group epoch): the heartbeat that brings a new regex is answered with the
topics the group already knows, literal names first, and the regex's
matches come in a later heartbeat. librdkafka's own test 0045
`do_test_resubscribe_with_regex` asserts exactly that order, so this is
its scenario, observed through the rebalance callbacks:

* subscribe to a literal topic: one assignment with its partitions;
  unsubscribe: one revocation;
* subscribe to a regex only: one assignment with every match (no empty
  assignment first);
* unsubscribe, then subscribe to the regex and a literal topic: the first
  assignment is the literal topic's partitions alone, a later one the
  regex's matches;
* a topic created afterwards that matches is assigned too, within Kafka's
  batched refresh interval (10 s) plus a heartbeat.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer

from conftest import client_conf, create_topic

pytestmark = [
    pytest.mark.substrates("local"),
    pytest.mark.broker_args("--group-shards", "8",
                            "--group-consumer-heartbeat-interval-ms", "500",
                            "--group-consumer-session-timeout-ms", "6000"),
]


class Rebalances:
    """Every rebalance callback of one consumer, in order:
    ("assign" | "revoke", {(topic, partition)})."""

    def __init__(self) -> None:
        self.events: list[tuple[str, frozenset]] = []
        self.lock = threading.Lock()

    def on_assign(self, _c, parts) -> None:
        with self.lock:
            self.events.append(("assign", frozenset((p.topic, p.partition) for p in parts)))

    def on_revoke(self, _c, parts) -> None:
        with self.lock:
            self.events.append(("revoke", frozenset((p.topic, p.partition) for p in parts)))

    def wait(self, c: Consumer, n: int, timeout: float, what: str) -> list[tuple[str, frozenset]]:
        """Poll until `n` events were seen (bounded); return the first n."""
        deadline = time.monotonic() + timeout
        while len(self.events) < n:
            assert time.monotonic() < deadline, f"timeout waiting for {what}: {self.events}"
            c.poll(0.1)
        return self.events[:n]

    def quiet(self, c: Consumer, seconds: float) -> None:
        """Poll for `seconds`, so a stray extra event would show."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            c.poll(0.1)


def parts(topic: str, n: int) -> frozenset:
    return frozenset((topic, p) for p in range(n))


def test_resubscribe_with_regex_assigns_literal_topics_first(broker):
    prefix = f"rx{uuid.uuid4().hex[:8]}"
    topic1, topic2, topic_a = f"{prefix}_regex1", f"{prefix}_regex2", f"{prefix}_a"
    regex = f"^{prefix}_regex.*"
    create_topic(broker.bootstrap, topic1, 4)
    create_topic(broker.bootstrap, topic2, 4)
    create_topic(broker.bootstrap, topic_a, 2)

    c = Consumer(client_conf(broker.bootstrap, **{
        "group.id": f"rxg-{uuid.uuid4().hex[:8]}",
        "group.protocol": "consumer",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }))
    rb = Rebalances()
    sub = {"on_assign": rb.on_assign, "on_revoke": rb.on_revoke}

    # A literal topic, then none.
    c.subscribe([topic1], **sub)
    assert rb.wait(c, 1, 30, "topic1's assignment") == [("assign", parts(topic1, 4))]
    c.unsubscribe()
    assert rb.wait(c, 2, 30, "the revocation")[1] == ("revoke", parts(topic1, 4))

    # A regex alone: one assignment with every match (an empty first answer
    # is no rebalance for librdkafka).
    c.subscribe([regex], **sub)
    got = rb.wait(c, 3, 30, "the regex's matches")[2]
    assert got == ("assign", parts(topic1, 4) | parts(topic2, 4)), rb.events
    c.unsubscribe()
    assert rb.wait(c, 4, 30, "the revocation")[3][0] == "revoke", rb.events

    # The regex and a literal topic: the literal topic is assigned by the
    # heartbeat that subscribes, the regex's matches once it is resolved.
    c.subscribe([regex, topic_a], **sub)
    first = rb.wait(c, 5, 30, "the first assignment")[4]
    assert first == ("assign", parts(topic_a, 2)), rb.events
    second = rb.wait(c, 6, 30, "the regex's matches")[5]
    assert second == ("assign", parts(topic1, 4) | parts(topic2, 4)), rb.events
    rb.quiet(c, 1.5)
    assert len(rb.events) == 6, rb.events[6:]
    assert set(c.assignment()) and {(p.topic, p.partition) for p in c.assignment()} == \
        parts(topic_a, 2) | parts(topic1, 4) | parts(topic2, 4)

    # A matching topic created now is picked up by a periodic refresh
    # (Kafka: at most every 10 s per group, at a heartbeat).
    topic3 = f"{prefix}_regex3"
    create_topic(broker.bootstrap, topic3, 2)
    started = time.monotonic()
    assert rb.wait(c, 7, 40, "the new topic's assignment")[6] == ("assign", parts(topic3, 2)), \
        rb.events
    print(f"new matching topic assigned after {time.monotonic() - started:.1f}s")

    c.close()
    broker.assert_no_panic()
