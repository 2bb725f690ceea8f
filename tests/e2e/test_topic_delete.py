"""Delete and re-create through the controller (Kafka Streams' reset
pattern): DeleteTopics asks the controller, which vacates every partition
two-phase and only then renames the directory aside; the answer waits for
that. Once answered, no leader of the old incarnation acknowledges anything,
and a re-create under the same name is a new, empty incarnation.

Runs on the local substrate and on weakfs (NFS-like mounts, one per broker).
"""

from __future__ import annotations

import threading
import time

import pytest

import kafka_wire as kw
from cluster import FAST, bootstrap, create_everywhere, leaders, wait_leaders
from conftest import client_conf, consume_all, producer_conf

pytestmark = pytest.mark.substrates("local", "weakfs")

PARTITIONS = 6


def topic_id(bs, topic: str) -> str:
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AdminClient
    a = AdminClient(client_conf(bootstrap(bs)))
    d = a.describe_topics(TopicCollection([topic]))[topic].result(timeout=20)
    return str(d.topic_id)


class Background:
    """One raw acks=all producer per partition, each on its own connection
    to the partition's leader and never re-routed (so a leader that should
    have let go is asked again and again), and an assigned consumer."""

    def __init__(self, bs, topic: str):
        from confluent_kafka import Consumer
        by_id = {b.broker_id: b for b in bs}
        self.leaders = {p: by_id[l].addr for p, l in leaders(bs, topic).items()}
        self.c = Consumer(client_conf(bootstrap(bs), **{
            "group.id": f"bg-{topic}", "auto.offset.reset": "earliest",
            "enable.auto.commit": False}))
        self.topic = topic
        # (sent, answered, partition, error code)
        self.answers: list[tuple[float, float, int, int]] = []
        self.consumed = 0
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._produce, args=(p,), daemon=True)
                        for p in range(PARTITIONS)]
        self.threads.append(threading.Thread(target=self._consume, daemon=True))

    def acks(self) -> int:
        return sum(1 for a in self.answers if a[3] == 0)

    def _produce(self, p: int):
        sock = kw.connect(self.leaders[p])
        cid = 0
        try:
            while not self.stop.is_set():
                cid += 1
                batch = kw.record_batch_v2([kw.Rec(value=b"old-%d" % cid)])
                sent = time.monotonic()
                try:
                    resp = kw.roundtrip(sock, kw.produce_request_v3(cid, self.topic, p, batch))
                except OSError:
                    return
                _, res = kw.parse_produce_response_v3(resp)
                self.answers.append((sent, time.monotonic(), p, res[0].error_code))
                time.sleep(0.005)
        finally:
            sock.close()

    def _consume(self):
        from confluent_kafka import TopicPartition
        self.c.assign([TopicPartition(self.topic, p, 0) for p in range(PARTITIONS)])
        while not self.stop.is_set():
            m = self.c.poll(0.1)
            if m is not None and m.error() is None:
                self.consumed += 1
        self.c.close()

    def start(self):
        for t in self.threads:
            t.start()

    def join(self):
        self.stop.set()
        for t in self.threads:
            t.join(30)


@pytest.mark.substrates("cephfs")
def test_delete_and_recreate_under_load_starts_a_new_incarnation(broker_factory, topic_name):
    """Delete a topic while a producer and a consumer are active on it in a
    3-broker cluster, re-create it under the same name at once, produce with
    a fresh idempotent producer: its first record lands at offset 0, nothing
    of the old incarnation is visible, and no old leader acknowledged
    anything after the delete was answered."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    # No auto-create: the old producer, still running while the delete is
    # answered, would otherwise re-create the topic itself (as in Kafka).
    # A slower assignment poll than FAST widens the window in which a
    # broker that did not handle the delete could go on acknowledging, had
    # the delete not waited for every leader to let go.
    flags = [f for f in FAST]
    flags[flags.index("--poll-ms") + 1] = "400"
    bs = broker_factory.cluster(3, flags + ["--auto-create-topics", "false"])
    create_everywhere(bs, topic_name, PARTITIONS)
    old_id = topic_id(bs, topic_name)
    bg = Background(bs, topic_name)
    bg.start()
    try:
        deadline = time.monotonic() + 30
        while (bg.acks() < 300 or bg.consumed < 100) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert bg.acks() >= 300 and bg.consumed >= 100, (bg.acks(), bg.consumed)
        a = AdminClient(client_conf(bootstrap(bs)))
        t0 = time.monotonic()
        a.delete_topics([topic_name], operation_timeout=30, request_timeout=40)[topic_name].result(timeout=45)
        answered = time.monotonic()
        # Keep asking the old leaders for a while after the answer.
        time.sleep(1.0)
    finally:
        bg.join()
    # A produce sent after the delete was answered and acknowledged would be
    # a record acked into a directory that belongs to no topic.
    late = [a for a in bg.answers if a[0] > answered and a[3] == 0]
    assert not late, f"old leaders acknowledged after the delete was answered: {late[:5]}"
    after = {a[3] for a in bg.answers if a[0] > answered}
    assert after and after <= {3, 6}, f"old leaders answered {after} (want UNKNOWN_TOPIC_OR_PARTITION / NOT_LEADER)"
    # Re-create at once under the same name: a new incarnation, empty.
    a.create_topics([NewTopic(topic_name, PARTITIONS, 1)], operation_timeout=30)[topic_name].result(timeout=40)
    for b in bs:
        wait_leaders([b], topic_name, PARTITIONS, {x.broker_id for x in bs})
    assert topic_id(bs, topic_name) != old_id
    p = Producer(producer_conf(bootstrap(bs), **{"enable.idempotence": True}))
    offs: list[tuple[int, int]] = []
    errs: list = []

    def cb(err, msg):
        if err is not None:
            errs.append(err)
        else:
            offs.append((msg.partition(), msg.offset()))

    for i in range(20):
        p.produce(topic_name, value=b"new-%d" % i, partition=i % PARTITIONS, on_delivery=cb)
    assert p.flush(30) == 0
    assert not errs, errs
    want = sorted((i % PARTITIONS, i // PARTITIONS) for i in range(20))
    assert sorted(offs) == want, f"first records of the new incarnation at {sorted(offs)}"
    got = consume_all(bootstrap(bs), topic_name, list(range(PARTITIONS)), timeout=30)
    for part, ms in got.items():
        assert [m.value for m in ms] == [b"new-%d" % i for i in range(20) if i % PARTITIONS == part], \
            f"p{part}: the old incarnation is visible"
    print(f"delete answered in {answered - t0:.2f}s")
