"""The operator's reconcile branches end to end, each against the real
`kaas-operator` binary, the in-memory Kubernetes API server
(kmock_server.py) and a real broker:

* Reclaim: a resource owned incarnation X, the directory holds Y (a client
  deleted and re-created the topic): Y is deleted by id through the
  brokers, and a new incarnation, recorded in the status, takes its place;
* Grow and Alter succeeding: more partitions through CreatePartitions,
  configs set and removed through IncrementalAlterConfigs, as the brokers
  report them (Metadata, DescribeConfigs);
* InvalidSpec: a bad config and a bad topic name (refused by the operator)
  and zero partitions (refused by the brokers' CreateTopics) are
  Ready=False reason InvalidSpec, with no directory, no error loop, and a
  corrected spec converges.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from conftest import admin, create_topic, wait_until
from test_operator import (BASE, Operator, create_kafkatopic, kube_api,  # noqa: F401
                           partitions_on_volume, ready)

MERGE = "application/merge-patch+json"
FAST = {"KAAS_OPERATOR_RESYNC_SECONDS": "2"}


def stamp_id(broker, topic: str) -> str | None:
    try:
        return json.loads((broker.data_dir / topic / ".topic-id.json").read_text())["topic_id"]
    except FileNotFoundError:
        return None


def topic_configs(bootstrap: str, topic: str) -> dict[str, tuple[str, bool]]:
    """DescribeConfigs: {name: (value, is_default)}."""
    from confluent_kafka.admin import ConfigResource
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    a = admin(bootstrap)  # held until the result is in (else it is destroyed)
    entries = a.describe_configs([res])[res].result(timeout=15)
    return {k: (e.value, e.is_default) for k, e in entries.items()}


def partitions_in_metadata(bootstrap: str, topic: str) -> int:
    a = admin(bootstrap)
    t = a.list_topics(topic=topic, timeout=10).topics.get(topic)
    return len(t.partitions) if t is not None and t.error is None else -1


@pytest.mark.timeout(120)
def test_operator_reclaims_a_previous_incarnations_directory(broker, kube_api, tmp_path):
    api = kube_api
    # The resource owned incarnation `old`; a client then deleted the topic
    # and created it again: the directory holds `theirs`.
    create_topic(broker.bootstrap, "orders", partitions=2)
    theirs = stamp_id(broker, "orders")
    old = str(uuid.uuid4())
    create_kafkatopic(api, "orders", {"partitions": 3}, status={
        "topicName": "orders", "topicId": old, "partitions": 3, "observedGeneration": 1})
    api.call("PATCH", f"{BASE}/orders", {"metadata": {"finalizers": ["kaas.io/topic-deletion"]}}, MERGE)
    assert api.get("orders")["status"]["topicId"] == old
    op = Operator(api, broker, tmp_path, **FAST)
    try:
        obj = wait_until(lambda: ready(api.get("orders")) == ("True", "Ready") and api.get("orders"),
                         60, what="orders Ready after the reclaim")
        new = obj["status"]["topicId"]
        assert new not in (old, theirs)
        assert stamp_id(broker, "orders") == new
        assert obj["status"]["partitions"] == 3
        assert partitions_on_volume(broker.data_dir / "orders") == 3
        wait_until(lambda: partitions_in_metadata(broker.bootstrap, "orders") == 3, 30,
                   what="the new incarnation served")
        assert "reclaimed a previous incarnation" in op.log_path.read_text(), op.log()
    except BaseException:
        print(op.log())
        raise
    finally:
        op.stop()


@pytest.mark.timeout(150)
def test_operator_grows_and_alters_configs(broker, kube_api, tmp_path):
    api = kube_api
    create_kafkatopic(api, "orders", {"partitions": 2, "config": {"retention.ms": "600000"}})
    op = Operator(api, broker, tmp_path, **FAST)

    def settled(partitions):
        o = api.get("orders") or {}
        return ready(o) == ("True", "Ready") and \
            o.get("status", {}).get("observedGeneration") == o["metadata"].get("generation") and \
            o.get("status", {}).get("partitions") == partitions

    try:
        wait_until(lambda: settled(2), 30, what="orders Ready")
        assert topic_configs(broker.bootstrap, "orders")["retention.ms"] == ("600000", False)
        # Grow and alter in one spec change: CreatePartitions, then
        # IncrementalAlterConfigs (a config set, one added).
        api.call("PATCH", f"{BASE}/orders", {"spec": {"partitions": 4, "config": {
            "retention.ms": "120000", "max.message.bytes": "65536"}}}, MERGE)
        wait_until(lambda: settled(4) and topic_configs(broker.bootstrap, "orders").get(
            "max.message.bytes") == ("65536", False), 40, what="grown to 4 and altered")
        cfg = topic_configs(broker.bootstrap, "orders")
        assert cfg["retention.ms"] == ("120000", False), cfg
        assert partitions_on_volume(broker.data_dir / "orders") == 4
        wait_until(lambda: partitions_in_metadata(broker.bootstrap, "orders") == 4, 30,
                   what="4 partitions served")
        # A config removed from the spec is deleted (back to the default).
        api.call("PATCH", f"{BASE}/orders", {"spec": {"config": {"retention.ms": None}}}, MERGE)
        wait_until(lambda: settled(4) and topic_configs(broker.bootstrap, "orders")[
            "retention.ms"][1], 40, what="retention.ms back to its default")
        assert topic_configs(broker.bootstrap, "orders")["max.message.bytes"] == ("65536", False)
        # Settled: nothing more is sent, nothing fails.
        writes = op.metric("kaas_operator_status_writes_total")
        errors = op.metric("kaas_operator_reconcile_errors_total")
        time.sleep(3)
        assert op.metric("kaas_operator_status_writes_total") == writes
        assert op.metric("kaas_operator_reconcile_errors_total") == errors, op.log()
        assert ready(api.get("orders")) == ("True", "Ready")
    except BaseException:
        print(op.log())
        raise
    finally:
        op.stop()


@pytest.mark.timeout(120)
def test_operator_invalid_spec_is_a_condition(broker, kube_api, tmp_path):
    api = kube_api
    create_kafkatopic(api, "bad-config", {"partitions": 1, "config": {"retention.ms": "soon"}})
    create_kafkatopic(api, "bad-name", {"partitions": 1, "topicName": "a/b"})
    # Zero partitions passes the operator's checks; the brokers refuse it
    # (INVALID_PARTITIONS) at CreateTopics.
    create_kafkatopic(api, "zero", {"partitions": 0})
    op = Operator(api, broker, tmp_path, **FAST)
    names = ("bad-config", "bad-name", "zero")
    try:
        for n in names:
            wait_until(lambda n=n: ready(api.get(n)) == ("False", "InvalidSpec"), 30,
                       what=f"{n} InvalidSpec")
        msgs = {n: api.get(n)["status"]["conditions"][0]["message"] for n in names}
        assert "retention.ms" in msgs["bad-config"], msgs
        assert "kafka error 37" in msgs["zero"], msgs
        for topic in ("bad-config", "a", "a/b", "zero"):
            assert not (broker.data_dir / topic).exists(), topic
        # Not an error loop: once the condition is written, no failed
        # reconcile and no status rewrite while resyncs keep looking (a 409
        # on a stale cache before that is the API's optimistic concurrency).
        errors = op.metric("kaas_operator_reconcile_errors_total")
        writes = op.metric("kaas_operator_status_writes_total")
        looked = op.reconciles()
        time.sleep(4)
        assert op.reconciles() > looked, "resyncs stopped"
        assert op.metric("kaas_operator_reconcile_errors_total") == errors, op.log()
        assert op.metric("kaas_operator_status_writes_total") == writes
        # A corrected spec (a new generation) converges.
        api.call("PATCH", f"{BASE}/bad-config", {"spec": {"config": {"retention.ms": "60000"}}}, MERGE)
        api.call("PATCH", f"{BASE}/zero", {"spec": {"partitions": 2}}, MERGE)
        for n, parts in (("bad-config", 1), ("zero", 2)):
            wait_until(lambda n=n: ready(api.get(n)) == ("True", "Ready"), 30, what=f"{n} Ready")
            assert api.get(n)["status"]["topicId"] == stamp_id(broker, n)
            assert partitions_on_volume(broker.data_dir / n) == parts
        assert topic_configs(broker.bootstrap, "bad-config")["retention.ms"] == ("60000", False)
    except BaseException:
        print(op.log())
        raise
    finally:
        op.stop()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("killed_before", [1, 2], ids=["forget-id-patch", "ready-patch"])
# serde_json writes compact JSON: the patch bodies as the operator sends them.
def test_reclaim_converges_when_the_operator_is_killed_between_its_writes(
        broker, kube_api, tmp_path, killed_before):
    """kill -9 between the writes of a reclaim: the operator is held at a
    status patch of the resource (1: the reclaim's "forget the old id"
    patch, its DeleteTopics already done; 2: the Ready patch recording the
    new incarnation, its CreateTopics already done),
    killed there, and a restarted operator (same pod name: a container
    restart) converges — without reclaiming the incarnation it created."""
    api = kube_api
    create_topic(broker.bootstrap, "orders", partitions=2)
    theirs = stamp_id(broker, "orders")
    old = str(uuid.uuid4())
    create_kafkatopic(api, "orders", {"partitions": 3}, status={
        "topicName": "orders", "topicId": old, "partitions": 3, "observedGeneration": 1})
    api.call("PATCH", f"{BASE}/orders", {"metadata": {"finalizers": ["kaas.io/topic-deletion"]}}, MERGE)
    api.call("POST", "/_shim/hold", {"suffix": "/kafkatopics/orders/status", "contains": {
        1: '"topicId":null', 2: '"reason":"Ready"'}[killed_before]})
    first = Operator(api, broker, tmp_path, "first", POD_NAME="op", **FAST)
    second = None
    try:
        wait_until(lambda: api.call("GET", "/_shim/held")["held"] == 1, 60,
                   what=f"the operator at status patch {killed_before}")
        assert stamp_id(broker, "orders") != theirs, "reclaim's DeleteTopics not yet done"
        first.proc.kill()
        first.proc.wait(10)
        api.call("POST", "/_shim/release")
        created = stamp_id(broker, "orders")
        assert (created is None) == (killed_before == 1)
        second = Operator(api, broker, tmp_path, "second", POD_NAME="op", **FAST)
        obj = wait_until(lambda: ready(api.get("orders")) == ("True", "Ready") and api.get("orders"),
                         60, what="orders Ready after the restart")
        new = obj["status"]["topicId"]
        assert new not in (old, theirs)
        assert stamp_id(broker, "orders") == new
        if created is not None:
            assert new == created, "the incarnation created before the kill was replaced"
        # Settled: the new incarnation stays (resyncs every 2 s).
        time.sleep(5)
        assert stamp_id(broker, "orders") == new
        assert "reclaimed a previous incarnation" not in second.log_path.read_text(), second.log()
    except BaseException:
        print(first.log())
        if second is not None:
            print(second.log())
        raise
    finally:
        api.call("POST", "/_shim/release")
        first.stop()
        if second is not None:
            second.stop()
