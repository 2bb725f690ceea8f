"""The operator's real controller loop end to end: `kaas-operator` (next to
$KAAS_BIN) against an in-memory Kubernetes API server on loopback
(kmock_server.py) and a real broker. A KafkaTopic is created, becomes Ready
with the stamp's topic id, a partition increase grows the topic, a
decrease is NotSupported (not an error loop), the status settles (no rewrite when nothing changed), and a
delete goes through the finalizer and DeleteTopics.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import free_port, kaas_bin, wait_until

HERE = Path(__file__).resolve().parent
NS = "ns"
BASE = "/apis/kaas.io/v1alpha1/namespaces/ns/kafkatopics"


def partitions_on_volume(topic_dir: Path) -> int:
    """The partition count in force: the newest version of the topic's
    state (`.topic-state/v-<n>.json`, a `kaas-versioned` header line then
    JSON) of the stamp's id, else the stamp's count at creation."""
    stamp = json.loads((topic_dir / ".topic-id.json").read_text())
    state = topic_dir / ".topic-state"
    for v in sorted(state.glob("v-*.json"), reverse=True) if state.is_dir() else []:
        body = v.read_bytes().split(b"\n", 1)[-1]
        try:
            doc = json.loads(body)
        except ValueError:
            continue  # torn: its writer never acknowledged it
        if doc["topic_id"] == stamp["topic_id"]:
            return doc["partitions"]
    return stamp["partitions"]


def operator_bin() -> Path:
    p = kaas_bin().parent / "kaas-operator"
    if not p.exists():
        pytest.skip(f"{p} not built (cargo build --release -p kaas-operator)")
    return p


class Api:
    def __init__(self, port: int):
        self.url = f"http://127.0.0.1:{port}"

    def call(self, method: str, path: str, body=None, ctype="application/json"):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": ctype})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def get(self, name: str):
        return self.call("GET", f"{BASE}/{name}")


def ready(obj) -> tuple[str, str] | None:
    for c in (obj or {}).get("status", {}).get("conditions", []):
        if c["type"] == "Ready":
            return c["status"], c["reason"]
    return None


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(name))


@pytest.fixture
def kube_api(tmp_path):
    pytest.importorskip("kmock")
    port = free_port()
    log = open(tmp_path / "kmock.log", "w")
    p = subprocess.Popen([sys.executable, str(HERE / "kmock_server.py"), str(port)],
                         stdout=subprocess.PIPE, stderr=log, text=True)
    assert p.stdout.readline().strip() == "ready"
    yield Api(port)
    p.terminate()
    p.wait(10)


LEASE = "/apis/coordination.k8s.io/v1/namespaces/ns/leases"


class Operator:
    """One `kaas-operator` process against `api` and `broker`: its own
    kubeconfig, metrics port and log (tmp_path/<name>.log)."""

    def __init__(self, api: Api, broker, tmp_path: Path, name: str = "operator", **env: str):
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": api.url}}],
            "users": [{"name": "u", "user": {}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "u",
                                                       "namespace": NS}}],
        }))
        self.name = name
        self.mport = free_port()
        self.log_path = tmp_path / f"{name}.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([str(operator_bin())], stdout=log, stderr=subprocess.STDOUT, env={
                "PATH": os.environ.get("PATH", ""), "KUBECONFIG": str(kubeconfig),
                "KAAS_WATCH_NAMESPACE": NS, "KAAS_BOOTSTRAP": broker.bootstrap,
                "KAAS_DATA_DIR": str(broker.data_dir),
                "KAAS_OPERATOR_METRICS_LISTEN": f"127.0.0.1:{self.mport}",
                "KAAS_LOG": "info,kaas_operator=debug", **env})

    def log(self) -> str:
        return self.log_path.read_text()[-4000:]

    def metric(self, name: str) -> float:
        return metric(self.mport, name)

    def reconciles(self) -> float:
        return self.metric("kaas_operator_reconcile_duration_seconds_count")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def create_kafkatopic(api: Api, name: str, spec: dict, **extra) -> None:
    # kmock knows a resource once it holds an object of it: create first.
    api.call("POST", BASE, {"apiVersion": "kaas.io/v1alpha1", "kind": "KafkaTopic",
                            "metadata": {"name": name, "namespace": NS}, "spec": spec, **extra})


@pytest.mark.timeout(120)
def test_operator_loop_against_in_memory_api_server(broker, kube_api, tmp_path):
    api = kube_api
    create_kafkatopic(api, "orders", {"partitions": 3})
    op = Operator(api, broker, tmp_path)
    proc, mport, oplog = op.proc, op.mport, op.log
    try:
        obj = wait_until(lambda: ready(api.get("orders")) == ("True", "Ready") and api.get("orders"),
                         30, what="orders Ready")
        stamp = json.loads((broker.data_dir / "orders" / ".topic-id.json").read_text())
        assert obj["status"]["topicId"] == stamp["topic_id"], oplog()
        assert obj["status"]["partitions"] == 3
        assert obj["metadata"]["finalizers"] == ["kaas.io/topic-deletion"]

        # Nothing changes: the status is not rewritten.
        writes = metric(mport, "kaas_operator_status_writes_total")
        time.sleep(2)
        assert metric(mport, "kaas_operator_status_writes_total") == writes, oplog()

        # More partitions: the brokers grow the topic (CreatePartitions).
        api.call("PATCH", f"{BASE}/orders", {"spec": {"partitions": 6}}, "application/merge-patch+json")
        wait_until(lambda: (api.get("orders") or {}).get("status", {}).get("partitions") == 6
                   and ready(api.get("orders")) == ("True", "Ready"), 30, what="grown to 6")
        assert partitions_on_volume(broker.data_dir / "orders") == 6
        # Fewer partitions: never decreased, NotSupported (not an error loop).
        api.call("PATCH", f"{BASE}/orders", {"spec": {"partitions": 4}}, "application/merge-patch+json")
        wait_until(lambda: ready(api.get("orders")) == ("False", "NotSupported"), 30,
                   what="NotSupported")
        errors = metric(mport, "kaas_operator_reconcile_errors_total")
        time.sleep(2)
        assert metric(mport, "kaas_operator_reconcile_errors_total") == errors, "error loop"

        # Delete: finalizer -> DeleteTopics -> released.
        api.call("DELETE", f"{BASE}/orders")
        wait_until(lambda: api.get("orders") is None, 30, what="resource released")
        assert not (broker.data_dir / "orders").exists()

        # What was done is on the resource as Events (kubectl describe).
        def events():
            items = (api.call("GET", "/apis/events.k8s.io/v1/namespaces/ns/events") or {}).get("items", [])
            return [(e.get("type"), e.get("reason"), e.get("action")) for e in items
                    if (e.get("regarding") or {}).get("name") == "orders"
                    and (e.get("regarding") or {}).get("kind") == "KafkaTopic"
                    and e.get("reportingController") == "kaas-operator"]
        want = [("Normal", "Created", "CreateTopics"), ("Normal", "Ready", "Reconcile"),
                ("Normal", "PartitionsIncreased", "CreatePartitions"),
                ("Warning", "NotSupported", "Reconcile"), ("Normal", "Deleted", "DeleteTopics")]
        wait_until(lambda: all(w in events() for w in want), 10, what=f"events {want}: {events()}")
        assert metric(mport, 'kaas_operator_reconciles_total{result="ok"}') >= 3
        assert proc.poll() is None, oplog()
    except BaseException:
        print(oplog())
        raise
    finally:
        op.stop()


def test_kmock_shims_conflict_and_no_op(kube_api):
    """The in-memory API server behaves as the real one where the operator
    depends on it: a write naming a stale resourceVersion is 409 Conflict,
    and a write that changes nothing gets no new resourceVersion."""
    api = kube_api
    api.call("POST", BASE, {"apiVersion": "kaas.io/v1alpha1", "kind": "KafkaTopic",
                            "metadata": {"name": "t", "namespace": NS}, "spec": {"partitions": 1}})
    rv = api.get("t")["metadata"]["resourceVersion"]
    merge = "application/merge-patch+json"
    same = api.call("PATCH", f"{BASE}/t", {"spec": {"partitions": 1}}, merge)
    assert same["metadata"]["resourceVersion"] == rv
    api.call("PATCH", f"{BASE}/t", {"metadata": {"resourceVersion": rv}, "spec": {"partitions": 2}}, merge)
    new = api.get("t")
    assert new["spec"]["partitions"] == 2 and new["metadata"]["resourceVersion"] != rv
    with pytest.raises(urllib.error.HTTPError) as e:
        api.call("PATCH", f"{BASE}/t", {"metadata": {"resourceVersion": rv}, "spec": {"partitions": 3}}, merge)
    assert e.value.code == 409
    assert api.get("t")["spec"]["partitions"] == 2


def test_kmock_serves_leases_with_optimistic_concurrency(kube_api):
    """Leader election's API: a Lease is created once (a second create is
    409), read, replaced (PUT) naming the resourceVersion read, and a PUT
    naming a stale one is 409 — exactly one of two racing writers wins."""
    api = kube_api
    assert api.call("GET", f"{LEASE}/l") is None
    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "l", "namespace": NS},
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}
    api.call("POST", LEASE, body)
    with pytest.raises(urllib.error.HTTPError) as e:
        api.call("POST", LEASE, body)
    assert e.value.code == 409
    got = api.call("GET", f"{LEASE}/l")
    rv = got["metadata"]["resourceVersion"]
    assert got["spec"]["holderIdentity"] == "a"
    # Replace: fields absent from the body are gone (not merged).
    new = {**got, "spec": {"holderIdentity": "b"}}
    put = api.call("PUT", f"{LEASE}/l", new)
    assert put["spec"] == {"holderIdentity": "b"}
    assert put["metadata"]["resourceVersion"] != rv
    assert put["metadata"]["uid"] == got["metadata"]["uid"]
    with pytest.raises(urllib.error.HTTPError) as e:
        api.call("PUT", f"{LEASE}/l", {**got, "spec": {"holderIdentity": "c"}})
    assert e.value.code == 409
    assert api.call("GET", f"{LEASE}/l")["spec"]["holderIdentity"] == "b"
    # A PUT of a missing object is 404 (the real server creates nothing).
    assert api.call("PUT", f"{LEASE}/missing", {**body, "metadata": {"name": "missing"}}) is None
    assert api.call("GET", f"{LEASE}/missing") is None
