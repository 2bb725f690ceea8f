"""`helm upgrade` of the chart against an API server: a changed
storage.controlPlane (enabled, or the claim) is refused while brokers run,
with the explanation, and goes through only as the acknowledged last step
of an offline move.

Why an API server, and which. The refusal is a `lookup` of the live broker
StatefulSet (its kaas.io/cluster-dir annotation, or its pod spec when an
older chart installed it); `helm template` and client-side dry runs answer
every lookup with nothing, so only a server exercises it. There is no
Kubernetes here (no Docker, no kind), so helm 3 and helm 4 run their real
`install`, `upgrade` and `template --dry-run=server` against
kmock_helm.py: kmock's in-memory API server on 127.0.0.1, with what helm
needs added (built-in kinds in discovery, helm's protobuf release Secrets,
server-side apply for helm 4, strategic merge patches for helm 3, label
selectors; see its docstring). It is not a real API server (no defaulting,
validation, controllers), so after every upgrade that succeeds the live
objects are compared with the manifest helm recorded: what the next
upgrade's lookup reads is what a real server would hold. The test plays
the cluster's part where a move needs it: `kubectl scale` is a merge patch
of spec.replicas, a broker pod is an object created with the StatefulSet's
selector labels, a pre-created claim is a PersistentVolumeClaim object.

Loopback only; every helm call and server start is bounded in time.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from test_chart import CHART, HELMS, helm

HERE = Path(__file__).resolve().parent
REL = "rel"
STS = f"{REL}-kaas"
CP_CLAIM = f"{REL}-kaas-control-plane"
DATA_CLAIM = f"{REL}-kaas-data"
STS_PATH = "/apis/apps/v1/namespaces/{ns}/statefulsets/{name}"


class Api:
    """The in-memory API server (kmock_helm.py) and helm pointed at it."""

    def __init__(self, port: int, home: Path):
        self.url = f"http://127.0.0.1:{port}"
        self.kubeconfig = home / "kubeconfig"
        self.kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
            "users": [{"name": "u", "user": {}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "u"}}],
        }))
        self.env = {**os.environ, "KUBECONFIG": str(self.kubeconfig),
                    "HELM_CACHE_HOME": str(home / "helm-cache"),
                    "HELM_CONFIG_HOME": str(home / "helm-config"),
                    "HELM_DATA_HOME": str(home / "helm-data")}

    def call(self, method: str, path: str, body=None, ctype: str = "application/json"):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": ctype})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def sts(self, ns: str, name: str = STS) -> dict:
        return self.call("GET", STS_PATH.format(ns=ns, name=name))

    def helm(self, helm_name: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(helm(helm_name)), *args], capture_output=True, text=True,
                              timeout=60, env=self.env)


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    pytest.importorskip("kmock")
    home = tmp_path_factory.mktemp("kmock-helm")
    log = open(home / "kmock.log", "w")
    p = subprocess.Popen([sys.executable, str(HERE / "kmock_helm.py"), "0"],
                         stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        ready, _, _ = select.select([p.stdout], [], [], 30)
        line = p.stdout.readline().split() if ready else []
        assert line[:1] == ["ready"], f"kmock_helm.py did not start: {(home / 'kmock.log').read_text()[-2000:]}"
        yield Api(int(line[1]), home)
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
        log.close()


def upgrade(api: Api, helm_name: str, ns: str, *sets: str, install: bool = False):
    """install / upgrade with exactly these --set values over the chart's
    defaults (--reset-values: with no values given, helm would reuse the
    previous release's)."""
    args = ["install" if install else "upgrade", REL, str(CHART), "-n", ns,
            "--disable-openapi-validation"]  # the in-memory server has no /openapi
    if not install:
        args.append("--reset-values")
    for s in sets:
        args += ["--set", s]
    return api.helm(helm_name, *args)


def ok(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 0, r.stdout + r.stderr


def refused(r: subprocess.CompletedProcess, *phrases: str) -> str:
    assert r.returncode != 0, f"not refused:\n{r.stdout}"
    msg = " ".join(r.stderr.split())
    for p in phrases:
        assert p in msg, f"{p!r} not in:\n{r.stderr}"
    return msg


def revision(api: Api, helm_name: str, ns: str) -> int:
    r = api.helm(helm_name, "history", REL, "-n", ns, "-o", "json")
    ok(r)
    return max(h["revision"] for h in json.loads(r.stdout))


def assert_live_is_rendered(api: Api, helm_name: str, ns: str) -> dict:
    """Every object of the release's current manifest is held by the server
    as rendered (spec, rules, labels; annotations a superset: helm adds its
    own). Returns the live StatefulSet."""
    r = api.helm(helm_name, "get", "manifest", REL, "-n", ns)
    ok(r)
    plural = {"StatefulSet": "apps/v1/namespaces/{ns}/statefulsets",
              "Deployment": "apps/v1/namespaces/{ns}/deployments",
              "Service": "v1/namespaces/{ns}/services",
              "ServiceAccount": "v1/namespaces/{ns}/serviceaccounts",
              "PersistentVolumeClaim": "v1/namespaces/{ns}/persistentvolumeclaims",
              "PodDisruptionBudget": "policy/v1/namespaces/{ns}/poddisruptionbudgets",
              "Role": "rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
              "RoleBinding": "rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings"}
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    assert {d["kind"] for d in docs} <= set(plural), {d["kind"] for d in docs}
    for d in docs:
        base = "/api/" if plural[d["kind"]].startswith("v1/") else "/apis/"
        live = api.call("GET", base + plural[d["kind"]].format(ns=ns) + "/" + d["metadata"]["name"])
        assert live is not None, f"{d['kind']}/{d['metadata']['name']} missing"
        for k in set(d) - {"metadata", "apiVersion", "kind"}:
            assert live.get(k) == d[k], f"{d['kind']}/{d['metadata']['name']}: {k} differs"
        assert live["metadata"].get("labels") == d["metadata"].get("labels")
        assert d["metadata"].get("annotations", {}).items() <= live["metadata"]["annotations"].items()
    return api.sts(ns)


def pod_spec(sts: dict) -> tuple[dict, dict]:
    spec = sts["spec"]["template"]["spec"]
    broker = next(c for c in spec["containers"] if c["name"] == "broker")
    return spec, broker


def scale_to_zero(api: Api, ns: str) -> None:
    """`kubectl scale statefulset --replicas=0` once its pods are gone."""
    api.call("PATCH", STS_PATH.format(ns=ns, name=STS), {"spec": {"replicas": 0}, "status": {"replicas": 0}},
             "application/merge-patch+json")


def create_pvc(api: Api, ns: str, name: str) -> None:
    api.call("POST", f"/api/v1/namespaces/{ns}/persistentvolumeclaims", {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": ns},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "2Gi"}}}})


# ---------------------------------------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("helm_name", HELMS)
def test_changed_control_plane_is_refused_with_the_explanation(api, helm_name):
    ns = f"refuse-{helm_name}"
    ok(upgrade(api, helm_name, ns, install=True))
    sts = assert_live_is_rendered(api, helm_name, ns)
    assert sts["metadata"]["annotations"]["kaas.io/cluster-dir"] == f"claim:{CP_CLAIM}"

    # Turned off: the state would go to <data>/__cluster.
    msg = refused(upgrade(api, helm_name, ns, "storage.controlPlane.enabled=false"),
                  "refusing to move the brokers' cluster state",
                  f"StatefulSet {ns}/{STS} runs kaas brokers over the data claim {DATA_CLAIM}",
                  f"cluster state in the control-plane claim {CP_CLAIM}",
                  "these values put it in <data volume>/__cluster",
                  "two clusters", "loses acknowledged records", "offline operation",
                  f"kubectl -n {ns} scale statefulset/{STS} --replicas=0",
                  "kaas move-cluster-dir --from <mount of the current control-plane claim> "
                  "--to <data volume mount>/__cluster, in a pod that mounts both volumes",
                  f"--set storage.controlPlane.movedFrom=claim:{CP_CLAIM}")
    assert "statefulset.yaml" in msg
    # Another claim (existingClaim): refused the same way.
    refused(upgrade(api, helm_name, ns, "storage.controlPlane.existingClaim=cp-nfs"),
            "these values put it in the control-plane claim cp-nfs",
            "--to <mount of the new control-plane claim>",
            f"movedFrom=claim:{CP_CLAIM}")
    # Another default claim name (a new fullname) over the same data claim:
    # the installed StatefulSet is found by the data claim it mounts.
    refused(upgrade(api, helm_name, ns, "nameOverride=streams", f"storage.data.existingClaim={DATA_CLAIM}"),
            f"StatefulSet {ns}/{STS} runs kaas brokers over the data claim {DATA_CLAIM}",
            f"these values put it in the control-plane claim {REL}-streams-control-plane",
            "the chart creates", "storage.controlPlane.existingClaim")
    # A wrong acknowledgement is no acknowledgement.
    refused(upgrade(api, helm_name, ns, "storage.controlPlane.enabled=false",
                    "storage.controlPlane.movedFrom=claim:other"), "refusing to move")
    # Nothing was applied.
    assert revision(api, helm_name, ns) == 1
    assert api.sts(ns) == sts

    # Unchanged values (and unrelated changes) upgrade as ever.
    ok(upgrade(api, helm_name, ns))
    ok(upgrade(api, helm_name, ns, "broker.replicas=4", "storage.controlPlane.mountPath=/kaas/cluster"))
    assert revision(api, helm_name, ns) == 3
    sts = assert_live_is_rendered(api, helm_name, ns)
    assert sts["spec"]["replicas"] == 4
    assert sts["metadata"]["annotations"]["kaas.io/cluster-dir"] == f"claim:{CP_CLAIM}"

    # `helm template --dry-run=server` looks up too; plain `helm template`
    # (no cluster) renders the same change.
    r = api.helm(helm_name, "template", REL, str(CHART), "-n", ns, "--dry-run=server",
                 "--set", "storage.controlPlane.enabled=false")
    refused(r, "refusing to move", f"movedFrom=claim:{CP_CLAIM}")
    ok(api.helm(helm_name, "template", REL, str(CHART), "-n", ns, "--set", "storage.controlPlane.enabled=false"))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("helm_name", HELMS)
def test_acknowledged_offline_move(api, helm_name):
    ns = f"move-{helm_name}"
    ok(upgrade(api, helm_name, ns, install=True))
    off = ("storage.controlPlane.enabled=false", f"storage.controlPlane.movedFrom=claim:{CP_CLAIM}")

    # Acknowledged, but the brokers still run.
    refused(upgrade(api, helm_name, ns, *off), f"movedFrom=claim:{CP_CLAIM} acknowledges an offline move",
            "still has 3 replicas", f"scale statefulset/{STS} --replicas=0")
    # Scaled to 0, but a broker pod is still there (terminating).
    scale_to_zero(api, ns)
    sel = api.sts(ns)["spec"]["selector"]["matchLabels"]
    api.call("POST", f"/api/v1/namespaces/{ns}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{STS}-2", "namespace": ns, "labels": {**sel, "apps.kubernetes.io/pod-index": "2"}},
        "spec": {"containers": [{"name": "broker", "image": "kaas/kaas"}]}})
    refused(upgrade(api, helm_name, ns, *off), f"Pod {ns}/{STS}-2 of that StatefulSet still exists")
    api.call("DELETE", f"/api/v1/namespaces/{ns}/pods/{STS}-2")

    # Stopped, (moved,) acknowledged: applied, and the brokers start again.
    ok(upgrade(api, helm_name, ns, *off))
    sts = assert_live_is_rendered(api, helm_name, ns)
    spec, broker = pod_spec(sts)
    assert sts["metadata"]["annotations"]["kaas.io/cluster-dir"] == "data"
    assert sts["spec"]["replicas"] == 3
    assert "control-plane" not in {v["name"] for v in spec["volumes"]}
    assert "KAAS_CLUSTER_DIR" not in {e["name"] for e in broker["env"]}
    # The acknowledgement left in the values covers nothing more: same values
    # upgrade, a move back is refused again (its source is now "data").
    ok(upgrade(api, helm_name, ns, *off))
    refused(upgrade(api, helm_name, ns, f"storage.controlPlane.movedFrom=claim:{CP_CLAIM}"),
            "cluster state in <data volume>/__cluster", f"the control-plane claim {CP_CLAIM}",
            "--set storage.controlPlane.movedFrom=data")

    # Back onto a claim: it must exist before the move could fill it.
    scale_to_zero(api, ns)
    onto = ("storage.controlPlane.existingClaim=cp-nfs", "storage.controlPlane.movedFrom=data")
    refused(upgrade(api, helm_name, ns, *onto), "The claim cp-nfs does not exist")
    create_pvc(api, ns, "cp-nfs")
    ok(upgrade(api, helm_name, ns, *onto))
    sts = assert_live_is_rendered(api, helm_name, ns)
    spec, broker = pod_spec(sts)
    assert sts["metadata"]["annotations"]["kaas.io/cluster-dir"] == "claim:cp-nfs"
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["control-plane"]["persistentVolumeClaim"]["claimName"] == "cp-nfs"
    assert {e["name"]: e.get("value") for e in broker["env"]}["KAAS_CLUSTER_DIR"] == "/var/lib/kaas/cluster"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("helm_name", HELMS)
def test_statefulset_from_a_chart_without_the_record(api, helm_name):
    """A StatefulSet installed before the chart recorded kaas.io/cluster-dir
    is read from its pod spec: the control-plane volume's claim at
    KAAS_CLUSTER_DIR, or no KAAS_CLUSTER_DIR at all (data); a
    KAAS_CLUSTER_DIR the chart did not set is "unknown": refused whatever
    the values, until acknowledged."""
    ns = f"old-{helm_name}"
    ok(upgrade(api, helm_name, ns, install=True))
    path = STS_PATH.format(ns=ns, name=STS)

    def as_older_chart(edit=None):
        live = api.sts(ns)
        live["metadata"]["annotations"].pop("kaas.io/cluster-dir")
        if edit:
            edit(live)
        api.call("PUT", path, live)
        assert "kaas.io/cluster-dir" not in api.sts(ns)["metadata"]["annotations"]

    as_older_chart()
    refused(upgrade(api, helm_name, ns, "storage.controlPlane.enabled=false"),
            f"cluster state in the control-plane claim {CP_CLAIM}", f"movedFrom=claim:{CP_CLAIM}")
    ok(upgrade(api, helm_name, ns))
    assert api.sts(ns)["metadata"]["annotations"]["kaas.io/cluster-dir"] == f"claim:{CP_CLAIM}"

    # Cluster state on the data volume, as the older chart ran it.
    scale_to_zero(api, ns)
    ok(upgrade(api, helm_name, ns, "storage.controlPlane.enabled=false",
               f"storage.controlPlane.movedFrom=claim:{CP_CLAIM}"))
    as_older_chart()
    refused(upgrade(api, helm_name, ns), "cluster state in <data volume>/__cluster",
            f"these values put it in the control-plane claim {CP_CLAIM}", "movedFrom=data")
    ok(upgrade(api, helm_name, ns, "storage.controlPlane.enabled=false"))

    # KAAS_CLUSTER_DIR from somewhere the chart cannot tell (e.g. extraEnv).
    def own_cluster_dir(sts):
        _, broker = pod_spec(sts)
        broker["env"].append({"name": "KAAS_CLUSTER_DIR", "value": "/var/lib/kaas/data/elsewhere"})
    as_older_chart(own_cluster_dir)
    refused(upgrade(api, helm_name, ns, "storage.controlPlane.enabled=false"),
            "a place this chart cannot tell", "--set storage.controlPlane.movedFrom=unknown")
    scale_to_zero(api, ns)
    ok(upgrade(api, helm_name, ns, "storage.controlPlane.enabled=false", "storage.controlPlane.movedFrom=unknown"))
    assert api.sts(ns)["metadata"]["annotations"]["kaas.io/cluster-dir"] == "data"
