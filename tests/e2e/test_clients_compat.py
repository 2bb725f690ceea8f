"""Unmodified clients: kcat (Debian, librdkafka 2.0.2), kafka-python, and the
confluent-kafka AdminClient."""

import json
import shutil
import subprocess
import time
import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ConfigResource, NewTopic

from conftest import admin, consume_all, create_topic, wait_until

pytestmark = pytest.mark.substrates("local", "weakfs")

KCAT = shutil.which("kcat") or shutil.which("kafkacat")


def kcat(broker, *args, input=None, timeout=30):
    assert KCAT, "kcat not installed (apt-get install kcat)"
    cmd = [KCAT, "-b", broker.bootstrap, "-X", "broker.address.family=v4", *args]
    r = subprocess.run(cmd, input=input, capture_output=True, timeout=timeout)
    assert r.returncode == 0, f"{cmd} -> {r.returncode}\nstdout={r.stdout[-2000:]!r}\nstderr={r.stderr[-2000:]!r}"
    return r.stdout


# --------------------------------------------------------------------------- kcat

def test_kcat_metadata_produce_consume(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 2)
    md = json.loads(kcat(broker, "-L", "-J", "-t", topic_name))
    assert [b["id"] for b in md["brokers"]] == [0], md["brokers"]
    assert md["brokers"][0]["name"] == broker.bootstrap
    [t] = [t for t in md["topics"] if t["topic"] == topic_name]
    assert "error" not in t, t
    assert sorted(p["partition"] for p in t["partitions"]) == [0, 1]
    assert all(p["leader"] == 0 for p in t["partitions"])

    lines = [f"k{i}:value-{i}" for i in range(200)]
    kcat(broker, "-P", "-t", topic_name, "-p", "1", "-K", ":",
         "-X", "acks=all", input=("\n".join(lines) + "\n").encode())
    out = kcat(broker, "-C", "-t", topic_name, "-p", "1", "-o", "beginning", "-e",
               "-f", "%o|%k|%s\n").decode().splitlines()
    assert out == [f"{i}|k{i}|value-{i}" for i in range(200)]
    # partition 0 is empty: -e exits at once with nothing
    assert kcat(broker, "-C", "-t", topic_name, "-p", "0", "-o", "beginning", "-e") == b""


# --------------------------------------------------------------------------- kafka-python

def test_kafka_python_admin_produce_consume_delete(broker, topic_name):
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic as KPNewTopic

    adm = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="e2e-kp",
                           request_timeout_ms=20000)
    try:
        adm.create_topics([KPNewTopic(topic_name, num_partitions=2, replication_factor=1)],
                          timeout_ms=20000)
        wait_until(lambda: topic_name in adm.list_topics(), timeout=20, what="topic listed")

        prod = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5)
        futs = [prod.send(topic_name, key=b"k%d" % i, value=b"v%d" % i,
                          partition=i % 2, headers=[("h", b"%d" % i)]) for i in range(100)]
        prod.flush(timeout=30)
        metas = [f.get(timeout=30) for f in futs]
        prod.close(timeout=10)
        for part in (0, 1):
            assert [m.offset for m in metas if m.partition == part] == list(range(50))

        cons = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                             consumer_timeout_ms=1000)
        try:
            cons.assign([TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)])
            cons.seek_to_beginning()
            got = []
            deadline = time.monotonic() + 30
            while len(got) < 100 and time.monotonic() < deadline:
                for recs in cons.poll(timeout_ms=500).values():
                    got.extend(recs)
        finally:
            cons.close()
        assert len(got) == 100
        assert sorted((r.key, r.value, tuple(r.headers)) for r in got) == \
            sorted((b"k%d" % i, b"v%d" % i, (("h", b"%d" % i),)) for i in range(100))

        adm.delete_topics([topic_name], timeout_ms=20000)
        wait_until(lambda: topic_name not in adm.list_topics(), timeout=20, what="topic deleted")
    finally:
        adm.close()


# --------------------------------------------------------------------------- confluent admin

def test_confluent_admin_configs_cluster_delete(broker, topic_name):
    a = admin(broker.bootstrap)

    cfg = {"retention.ms": "3600000", "segment.bytes": "1048576", "cleanup.policy": "delete",
           "retention.bytes": "10485760", "message.timestamp.type": "CreateTime"}
    fs = a.create_topics([NewTopic(topic_name, num_partitions=3, replication_factor=1, config=cfg)],
                         operation_timeout=20, request_timeout=20)
    fs[topic_name].result(timeout=30)
    wait_until(lambda: len(a.list_topics(topic=topic_name, timeout=10).topics[topic_name].partitions) == 3,
               timeout=20, what="3 partitions")

    # duplicate create -> TOPIC_ALREADY_EXISTS (36)
    fs = a.create_topics([NewTopic(topic_name, num_partitions=1, replication_factor=1)],
                         request_timeout=20)
    with pytest.raises(KafkaException) as ei:
        fs[topic_name].result(timeout=30)
    assert ei.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS

    # compaction is refused -> INVALID_CONFIG (40)
    bad = f"compact-{uuid.uuid4().hex[:8]}"
    fs = a.create_topics([NewTopic(bad, num_partitions=1, replication_factor=1,
                                   config={"cleanup.policy": "compact"})], request_timeout=20)
    with pytest.raises(KafkaException) as ei:
        fs[bad].result(timeout=30)
    assert ei.value.args[0].code() == KafkaError.INVALID_CONFIG

    # describe_configs returns what we set
    res = ConfigResource(ConfigResource.Type.TOPIC, topic_name)
    entries = a.describe_configs([res], request_timeout=20)[res].result(timeout=30)
    for k, v in cfg.items():
        assert k in entries, f"{k} missing from describe_configs: {sorted(entries)}"
        assert entries[k].value == v, (k, entries[k].value)

    # describe_cluster: one node, broker 0 on our port, a controller, a cluster id
    desc = a.describe_cluster(request_timeout=20).result(timeout=30)
    assert desc.cluster_id
    assert [(n.id, n.host, n.port) for n in desc.nodes] == [(0, "127.0.0.1", broker.port)]
    assert desc.controller is not None and desc.controller.id == 0

    # data round trip before delete
    from confluent_kafka import Producer
    from conftest import producer_conf
    p = Producer(producer_conf(broker.bootstrap))
    for i in range(30):
        p.produce(topic_name, value=b"%d" % i, partition=i % 3)
    assert p.flush(30) == 0
    got = consume_all(broker.bootstrap, topic_name, 3, timeout=30)
    assert sorted(int(m.value) for ms in got.values() for m in ms) == list(range(30))

    a.delete_topics([topic_name], operation_timeout=20, request_timeout=20)[topic_name].result(timeout=30)
    wait_until(lambda: topic_name not in a.list_topics(timeout=10).topics, timeout=20,
               what="topic gone from metadata")
    # deleting again -> UNKNOWN_TOPIC_OR_PARTITION (3)
    with pytest.raises(KafkaException) as ei:
        a.delete_topics([topic_name], request_timeout=20)[topic_name].result(timeout=30)
    assert ei.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
