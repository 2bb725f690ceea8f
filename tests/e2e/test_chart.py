"""The helm chart (deploy/helm/kaas) without a cluster.

* `helm lint --strict` and `helm template` over every values file in
  deploy/helm/kaas/ci/ with helm 3 and helm 4 (both from npm packages, see
  tests/k8s/setup-tools.sh); both must render the same objects;
* every rendered object validated with kubernetes-validate --strict for each
  Kubernetes minor the chart supports (KafkaTopic instances against the
  chart's own CRD schema; ServiceMonitor, a third-party CRD, is only shape-checked);
* invariants on the rendered YAML: one shared RWX data claim, the
  control-plane volume at KAAS_CLUSTER_DIR, env and flags that `kaas broker`
  really has (parsed from its --help), ports wired to the listeners, broker
  id from the pod ordinal, grace period above the shutdown timeout, the
  StatefulSet's record of where the cluster state lives
  (kaas.io/cluster-dir; the upgrade guard that reads it back needs an API
  server: test_chart_upgrade.py);
* values.schema.json refusals (a claim without ReadWriteMany, lease timings
  under which two operators could lead at once) and render-time ones (a
  cluster or data dir set through extraEnv / extraArgs);
* the brokers as the chart runs them: the rendered StatefulSet's command,
  args and env, with the pod's name and ordinal substituted and the mount
  paths and addresses mapped onto temp dirs and loopback, started as real
  processes on one shared directory; produce and consume through them.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import (REPO, consume_all, free_port, kaas_bin, producer_conf,
                      wait_topic_ready, wait_until)

CHART = REPO / "deploy" / "helm" / "kaas"
TOOLS = REPO / "tests" / "k8s" / ".tools"
VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
HELMS = ["helm3", "helm4"]
RELEASE, NAMESPACE = "rel", "kafka"
# Kubernetes minors the chart supports (Chart.yaml kubeVersion: >= 1.28,
# the pod-index label); validated against the oldest schema kubernetes-validate
# bundles that is at least that, through the newest.
K8S_VERSIONS = ["1.30.0", "1.31.0", "1.32.0", "1.33.0", "1.34.0", "1.35.0"]
# Env the container defines only for $(VAR) expansion inside other values.
AUX_ENV = {"KAAS_POD_NAME"}
POD_INDEX = "metadata.labels['apps.kubernetes.io/pod-index']"


def helm(name: str) -> Path:
    p = TOOLS / name
    if not p.exists():
        msg = f"{p} missing: run tests/k8s/setup-tools.sh"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return p


def run_helm(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(helm(name)), *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "HELM_CACHE_HOME": "/tmp/kaas-helm-cache",
                                           "HELM_CONFIG_HOME": "/tmp/kaas-helm-config"})


@functools.lru_cache(maxsize=None)
def _render(helm_name: str, values: Path | None, sets: tuple[str, ...] = ()) -> tuple:
    args = ["template", RELEASE, str(CHART), "-n", NAMESPACE, "--include-crds"]
    if values:
        args += ["-f", str(values)]
    for s in sets:
        args += ["--set", s]
    r = run_helm(helm_name, *args)
    assert r.returncode == 0, r.stderr
    return tuple(d for d in yaml.safe_load_all(r.stdout) if d)


def render(values: Path | None = None, helm_name: str = "helm4", sets: tuple[str, ...] = ()) -> list[dict]:
    return copy.deepcopy(list(_render(helm_name, values, sets)))


def objs(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def one(docs, kind):
    found = objs(docs, kind)
    assert len(found) == 1, f"{len(found)} {kind}s"
    return found[0]


def broker_container(sts):
    return next(c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "broker")


def env_map(container) -> dict:
    return {e["name"]: e for e in container.get("env", [])}


@functools.lru_cache(maxsize=None)
def broker_flags() -> tuple[frozenset, frozenset]:
    """(long flags, env names) of `kaas broker`, from its --help."""
    out = subprocess.run([str(kaas_bin()), "broker", "--help"], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    flags = frozenset(re.findall(r"^\s+(?:-\w, )?(--[a-z0-9-]+)", out, re.M))
    envs = frozenset(re.findall(r"\[env: (KAAS_[A-Z0-9_]+)=", out))
    assert "--data-dir" in flags and "KAAS_BROKER_ID" in envs, out
    return flags, envs


def values_id(p: Path) -> str:
    return p.name.removesuffix("-values.yaml")


# ---------------------------------------------------------------------------
# lint, render, validate
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("values", VALUES, ids=values_id)
@pytest.mark.parametrize("helm_name", HELMS)
def test_lint_strict(helm_name, values):
    r = run_helm(helm_name, "lint", "--strict", str(CHART), "-f", str(values))
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("values", VALUES, ids=values_id)
def test_helm3_and_helm4_render_the_same(values):
    assert render(values, "helm3") == render(values, "helm4")


@pytest.mark.parametrize("values", VALUES, ids=values_id)
def test_manifests_validate_strict(values):
    import jsonschema
    import kubernetes_validate

    docs = render(values)
    crd = one(docs, "CustomResourceDefinition")
    failures = []
    for version in K8S_VERSIONS:
        for d in docs:
            if d["apiVersion"].startswith("monitoring.coreos.com/"):
                # Third-party CRDs (prometheus-operator): no bundled schema.
                if d["kind"] == "PrometheusRule":
                    assert d["spec"]["groups"] and all(g["rules"] for g in d["spec"]["groups"])
                else:
                    assert d["spec"]["endpoints"] and d["spec"]["selector"]["matchLabels"]
                continue
            if d["kind"] == "KafkaTopic":
                schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
                jsonschema.validate(d, schema)
                continue
            try:
                kubernetes_validate.validate(d, version, strict=True)
            except Exception as e:  # noqa: BLE001 - collect every failure
                failures.append(f"{version} {d['kind']}/{d['metadata']['name']}: {e}")
    assert not failures, "\n".join(failures)


def test_every_values_file_is_exercised():
    assert {values_id(v) for v in VALUES} >= {"default", "full", "minimal",
                                              "existing-claims", "no-control-plane"}


# ---------------------------------------------------------------------------
# schema and render-time refusals
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("helm_name", HELMS)
@pytest.mark.parametrize("setting", [
    "storage.data.accessModes={ReadWriteOnce}",
    "storage.controlPlane.accessModes={ReadWriteOncePod}",
    "operator.replicas=-1",
    "operator.leaderElection.renewDeadlineMs=15000",  # == the 15 s lease duration
    "operator.leaderElection.retryMs=10000",  # == the renew deadline
    "broker.terminationGracePeriodSeconds=18",  # == the 15 s shutdown timeout + 3 s
    "storage.data.mountPath=relative/path",
    "storage.controlPlane.movedFrom=/var/lib/kaas/cluster",  # a cluster-dir value, not a path
])
def test_refused_values(helm_name, setting):
    r = run_helm(helm_name, "template", RELEASE, str(CHART), "--set", setting)
    assert r.returncode != 0, f"{setting} rendered"
    key = setting.split("=")[0].split(".")[-1]
    assert key in r.stderr or "must exceed" in r.stderr, r.stderr


@pytest.mark.parametrize("helm_name", HELMS)
@pytest.mark.parametrize("sets", [
    ("broker.extraEnv[0].name=KAAS_CLUSTER_DIR", "broker.extraEnv[0].value=/elsewhere"),
    ("broker.extraEnv[0].name=KAAS_DATA_DIR", "broker.extraEnv[0].value=/elsewhere"),
    ("broker.extraArgs[0]=--cluster-dir=/elsewhere",),
    ("broker.extraArgs={--data-dir,/elsewhere}",),
], ids=["env-cluster-dir", "env-data-dir", "arg-cluster-dir", "arg-data-dir"])
def test_dirs_only_through_storage_values(helm_name, sets):
    """The StatefulSet records where the cluster state lives
    (kaas.io/cluster-dir, checked on upgrade): extraEnv / extraArgs may not
    move it, or the data dir, behind that record."""
    args = ["template", RELEASE, str(CHART)]
    for s in sets:
        args += ["--set", s]
    r = run_helm(helm_name, *args)
    assert r.returncode != 0, f"{sets} rendered"
    assert "set storage.controlPlane / storage.data instead" in r.stderr, r.stderr


def test_rwx_with_more_modes_is_accepted():
    docs = render(sets=("storage.data.accessModes={ReadWriteOnce,ReadWriteMany}",))
    pvc = next(p for p in objs(docs, "PersistentVolumeClaim") if p["metadata"]["name"].endswith("-data"))
    assert "ReadWriteMany" in pvc["spec"]["accessModes"]


# ---------------------------------------------------------------------------
# invariants
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("values", VALUES, ids=values_id)
def test_one_shared_rwx_data_claim(values):
    docs = render(values)
    cfg = yaml.safe_load(values.read_text()) or {}
    sts = one(docs, "StatefulSet")
    assert "volumeClaimTemplates" not in sts["spec"], "per-pod claims: brokers must share one volume"
    vols = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    claim = vols["data"]["persistentVolumeClaim"]["claimName"]
    existing = cfg.get("storage", {}).get("data", {}).get("existingClaim")
    pvcs = {p["metadata"]["name"]: p for p in objs(docs, "PersistentVolumeClaim")}
    if existing:
        assert claim == existing and claim not in pvcs
    else:
        assert "ReadWriteMany" in pvcs[claim]["spec"]["accessModes"]
    # Every consumer of the data volume names that same claim.
    for d in objs(docs, "StatefulSet") + objs(docs, "Deployment"):
        for v in d["spec"]["template"]["spec"]["volumes"]:
            if v["name"] == "data":
                assert v["persistentVolumeClaim"]["claimName"] == claim
    for p in pvcs.values():
        assert "ReadWriteMany" in p["spec"]["accessModes"], p["metadata"]["name"]


@pytest.mark.parametrize("values", VALUES, ids=values_id)
def test_statefulset_records_where_cluster_state_lives(values):
    """kaas.io/cluster-dir on the StatefulSet (not the pod template: it
    restarts nothing) names the claim mounted at KAAS_CLUSTER_DIR, or
    "data" without one. The upgrade guard compares it with the next values
    (test_chart_upgrade.py); without a cluster `lookup` finds nothing and
    any values render, movedFrom included."""
    sts = one(render(values), "StatefulSet")
    rec = sts["metadata"]["annotations"]["kaas.io/cluster-dir"]
    assert "kaas.io/cluster-dir" not in sts["spec"]["template"]["metadata"].get("annotations", {})
    vols = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    env = env_map(broker_container(sts))
    if "control-plane" in vols:
        assert rec == "claim:" + vols["control-plane"]["persistentVolumeClaim"]["claimName"]
        assert "KAAS_CLUSTER_DIR" in env
    else:
        assert rec == "data" and "KAAS_CLUSTER_DIR" not in env
    moved = render(values, sets=("storage.controlPlane.movedFrom=data",))
    assert one(moved, "StatefulSet")["metadata"]["annotations"]["kaas.io/cluster-dir"] == rec


@pytest.mark.parametrize("values", VALUES, ids=values_id)
def test_paths_env_and_flags_are_the_brokers(values):
    docs = render(values)
    sts = one(docs, "StatefulSet")
    spec = sts["spec"]["template"]["spec"]
    c = broker_container(sts)
    env = env_map(c)
    flags, envs = broker_flags()
    assert c["command"][1:] == ["broker"]
    for name in env:
        if name == "KAAS_LOG":
            # Read by main.rs (the tracing filter), not by clap.
            assert '"KAAS_LOG"' in (REPO / "broker/src/main.rs").read_text()
        elif name not in AUX_ENV:
            assert name in envs, f"{name} is not a `kaas broker` env var"
    for a in c.get("args", []):
        if a.startswith("--"):
            assert a.split("=")[0] in flags, f"{a} is not a `kaas broker` flag"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert env["KAAS_DATA_DIR"]["value"] == mounts["data"]
    vols = {v["name"]: v for v in spec["volumes"]}
    if "control-plane" in vols:
        # The control plane is its own claim, mounted where KAAS_CLUSTER_DIR points.
        assert env["KAAS_CLUSTER_DIR"]["value"] == mounts["control-plane"]
        assert (vols["control-plane"]["persistentVolumeClaim"]["claimName"]
                != vols["data"]["persistentVolumeClaim"]["claimName"])
    else:
        assert "KAAS_CLUSTER_DIR" not in env
    # Broker id = ordinal, from the pod-index label.
    assert env["KAAS_BROKER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == POD_INDEX
    # Ports: the listeners bind the container ports the probes and Services use.
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert env["KAAS_LISTEN"]["value"] == f"0.0.0.0:{ports['kafka']}"
    assert env["KAAS_METRICS_LISTEN"]["value"] == f"0.0.0.0:{ports['metrics']}"
    headless = next(s for s in objs(docs, "Service") if s["spec"].get("clusterIP") == "None")
    assert sts["spec"]["serviceName"] == headless["metadata"]["name"]
    assert headless["spec"]["publishNotReadyAddresses"] is True
    adv = env["KAAS_ADVERTISED_LISTENER"]["value"]
    assert adv.startswith(f"$(KAAS_POD_NAME).{headless['metadata']['name']}.{NAMESPACE}.svc.")
    assert adv.endswith(f":{ports['kafka']}")
    assert list(env).index("KAAS_POD_NAME") < list(env).index("KAAS_ADVERTISED_LISTENER")
    # Services reach the named ports.
    for s in objs(docs, "Service"):
        if s["spec"]["selector"].get("app.kubernetes.io/component") == "broker":
            for p in s["spec"]["ports"]:
                assert p["targetPort"] in ports
    # Probes: ready = the Kafka port accepts (it listens only once serving);
    # liveness never does file I/O (TCP to the metrics port).
    assert c["readinessProbe"]["tcpSocket"]["port"] == "kafka"
    assert c["startupProbe"]["tcpSocket"]["port"] == "kafka"
    assert set(c["livenessProbe"]) & {"tcpSocket", "exec", "httpGet"} == {"tcpSocket"}
    startup_budget = c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"]
    lease_s = int(env["KAAS_LEASE_MS"]["value"]) / 1000
    assert startup_budget > 4 * lease_s
    # The kubelet must not SIGKILL a broker in the middle of its hand-off.
    shutdown_s = int(env["KAAS_SHUTDOWN_TIMEOUT_MS"]["value"]) / 1000
    assert spec["terminationGracePeriodSeconds"] > shutdown_s + 3
    # Non-root, read-only root filesystem.
    assert spec["securityContext"]["runAsNonRoot"] is True
    for ctr in spec["containers"] + spec.get("initContainers", []):
        assert ctr["securityContext"]["readOnlyRootFilesystem"] is True
        assert ctr["securityContext"]["allowPrivilegeEscalation"] is False
    # The substrate check vets every mounted kaas volume.
    cfg = yaml.safe_load(values.read_text()) or {}
    inits = {i["name"]: i for i in spec.get("initContainers", [])}
    if cfg.get("substrateCheck", {}).get("enabled", True):
        chk = inits["substrate-check"]
        assert chk["command"][1] == "substrate-check"
        for m in ("data", "control-plane"):
            if m in mounts:
                assert mounts[m] in chk["command"]
    else:
        assert "substrate-check" not in inits


def test_substrate_check_is_on_by_default():
    sts = one(render(), "StatefulSet")
    assert [i["name"] for i in sts["spec"]["template"]["spec"]["initContainers"]] == ["substrate-check"]


def test_operator_least_privilege_and_leader_election():
    docs = render()
    assert not objs(docs, "ClusterRole") and not objs(docs, "ClusterRoleBinding")
    role = one(docs, "Role")
    dep = one(docs, "Deployment")
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        assert "delete" not in rule["verbs"]
        assert "create" not in rule["verbs"] or rule["resources"] in (["events"], ["leases"])
        assert not set(rule["resources"]) & {"secrets", "pods", "persistentvolumeclaims"}
    c = dep["spec"]["template"]["spec"]["containers"][0]
    env = env_map(c)
    # Leader election: the Lease is created, then read and renewed by name
    # only; the holder identity is the pod's name.
    lease = [r for r in role["rules"] if r["resources"] == ["leases"]]
    assert all(r["apiGroups"] == ["coordination.k8s.io"] for r in lease)
    assert {v for r in lease for v in r["verbs"]} == {"create", "get", "update"}
    named = next(r for r in lease if "get" in r["verbs"])
    assert named["resourceNames"] == [env["KAAS_OPERATOR_LEASE_NAME"]["value"]]
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    dur = int(env["KAAS_OPERATOR_LEASE_DURATION_SECONDS"]["value"]) * 1000
    renew = int(env["KAAS_OPERATOR_LEASE_RENEW_DEADLINE_MS"]["value"])
    assert int(env["KAAS_OPERATOR_LEASE_RETRY_MS"]["value"]) < renew < dur
    assert dep["spec"]["replicas"] == 1
    two = one(render(sets=("operator.replicas=2",)), "Deployment")
    assert two["spec"]["replicas"] == 2
    # The operator reads stamps only: every mount read-only.
    assert c["volumeMounts"] and all(m.get("readOnly") for m in c["volumeMounts"])
    svc = next(s for s in objs(docs, "Service") if s["metadata"]["name"] == f"{RELEASE}-kaas")
    assert env["KAAS_BOOTSTRAP"]["value"].startswith(f"{RELEASE}-kaas.{NAMESPACE}.svc.")
    assert env["KAAS_BOOTSTRAP"]["value"].endswith(f":{svc['spec']['ports'][0]['port']}")
    sts = one(docs, "StatefulSet")
    assert env["KAAS_CLUSTER_DIR"] == env_map(broker_container(sts))["KAAS_CLUSTER_DIR"]


def test_operator_env_names_are_real_flags():
    """Every env var the chart gives the operator is one `kaas-operator`
    reads (from its --help), so a renamed flag cannot go unnoticed."""
    op = kaas_bin().parent / "kaas-operator"
    if not op.exists():
        pytest.skip(f"{op} not built (cargo build --release -p kaas-operator)")
    out = subprocess.run([str(op), "--help"], capture_output=True, text=True, timeout=30,
                         check=True).stdout
    # KAAS_LOG is the log filter, read before the flags are parsed.
    known = set(re.findall(r"\[env: ([A-Z0-9_]+)=", out)) | {"KAAS_LOG"}
    c = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert set(env_map(c)) <= known, set(env_map(c)) - known


def test_chart_crd_is_the_committed_crdgen_output():
    # The Rust test operator/tests/crd_drift.rs checks deploy/crds/ against crdgen.
    assert (CHART / "crds" / "kafkatopic.yaml").read_bytes() == \
        (REPO / "deploy" / "crds" / "kafkatopic.yaml").read_bytes()


# ---------------------------------------------------------------------------
# the brokers as the StatefulSet runs them
# ---------------------------------------------------------------------------


def pod_env(container, pod_name: str, ordinal: int) -> dict[str, str]:
    """The env the kubelet would give the container in pod `pod_name`:
    downward-API fields resolved, $(VAR) references expanded in order."""
    out: dict[str, str] = {}
    for e in container["env"]:
        if "value" in e:
            out[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: out.get(m.group(1), m.group(0)), e["value"])
        else:
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            out[e["name"]] = {"metadata.name": pod_name, POD_INDEX: str(ordinal),
                              "metadata.namespace": NAMESPACE}[path]
    return out


@pytest.mark.timeout(180)
def test_brokers_run_as_rendered(tmp_path):
    replicas = 3
    docs = render(sets=(f"broker.replicas={replicas}",))
    sts = one(docs, "StatefulSet")
    spec = sts["spec"]["template"]["spec"]
    c = broker_container(sts)
    mounts = {m["mountPath"]: tmp_path / m["name"] for m in c["volumeMounts"]}
    for d in mounts.values():
        d.mkdir()
    kaas = str(kaas_bin())

    def local(argv: list[str]) -> list[str]:
        # The image's binary path -> the built binary; mount paths -> temp dirs.
        return [kaas if a == c["command"][0] else str(mounts.get(a, a)) for a in argv]

    # The init container, exactly as rendered (quick: the full check's
    # large-file rename is not what this test is about).
    init = spec["initContainers"][0]
    r = subprocess.run(local(init["command"]) + ["--quick"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr

    procs, addrs = [], []
    try:
        for ordinal in range(replicas):
            pod = f"{sts['metadata']['name']}-{ordinal}"
            env = pod_env(c, pod, ordinal)
            assert env["KAAS_BROKER_ID"] == str(ordinal)
            host, port = env["KAAS_ADVERTISED_LISTENER"].rsplit(":", 1)
            assert host == f"{pod}.{sts['spec']['serviceName']}.{NAMESPACE}.svc.cluster.local"
            assert port == env["KAAS_LISTEN"].rsplit(":", 1)[1]
            # Pod IPs and DNS -> loopback: one port per pod instead of one IP.
            kport, mport = free_port(), free_port()
            env["KAAS_LISTEN"] = f"127.0.0.1:{kport}"
            env["KAAS_ADVERTISED_LISTENER"] = f"127.0.0.1:{kport}"
            env["KAAS_METRICS_LISTEN"] = f"127.0.0.1:{mport}"
            for k in ("KAAS_DATA_DIR", "KAAS_CLUSTER_DIR"):
                env[k] = str(mounts[env[k]])
            log = open(tmp_path / f"{pod}.log", "w")
            procs.append(subprocess.Popen(local(c["command"]) + local(c.get("args", [])),
                                          env={"PATH": os.environ.get("PATH", ""), **env},
                                          stdout=log, stderr=subprocess.STDOUT))
            addrs.append(f"127.0.0.1:{kport}")
        bs = ",".join(addrs)
        # Readiness as the probe sees it: the Kafka port accepts connections.
        import socket

        def serving(a):
            h, p = a.split(":")
            try:
                socket.create_connection((h, int(p)), timeout=1).close()
                return True
            except OSError:
                return False
        wait_until(lambda: all(serving(a) for a in addrs), 60, what="all brokers serving")
        # The cluster state went to the control-plane volume, not the data one.
        cp = mounts[next(e["value"] for e in c["env"] if e["name"] == "KAAS_CLUSTER_DIR")]
        assert (cp / "assignment.json").exists() or any(cp.iterdir())
        from confluent_kafka.admin import AdminClient, NewTopic
        a = AdminClient({"bootstrap.servers": bs})
        a.create_topics([NewTopic("chart-topic", 6, 1)])["chart-topic"].result(30)
        wait_topic_ready(bs, "chart-topic", 6)
        data = mounts[next(e["value"] for e in c["env"] if e["name"] == "KAAS_DATA_DIR")]
        assert (data / "chart-topic").is_dir()
        from confluent_kafka import Producer
        prod = Producer(producer_conf(bs))
        errs = []
        sent = [b"chart-%d" % i for i in range(60)]
        for i, v in enumerate(sent):
            prod.produce("chart-topic", value=v, partition=i % 6,
                         on_delivery=lambda err, _m: errs.append(err) if err else None)
        assert prod.flush(30) == 0 and not errs, errs
        got = consume_all(bs, "chart-topic", 6, timeout=60)
        assert sorted(m.value for ms in got.values() for m in ms) == sorted(sent)
        for p in procs:
            assert p.poll() is None, (tmp_path / "rel-kaas-0.log").read_text()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.time() + spec["terminationGracePeriodSeconds"]
        for p in procs:
            try:
                p.wait(max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    # Controlled shutdown finishes inside the pod's grace period.
    assert all(p.returncode == 0 for p in procs), [p.returncode for p in procs]


def test_dashboard_and_alert_rules_have_one_source():
    """deploy/'s Grafana dashboard and alert rules are links to the chart's
    files (the chart shipped an 8-panel dashboard of its own, without the
    lease-headroom and restarts panels), and the chart renders them as
    they are: the ConfigMap's JSON and the PrometheusRule's groups."""
    import json
    chart_files = REPO / "deploy" / "helm" / "kaas" / "files"
    for name, target in (("grafana-dashboard.json", "dashboard.json"),
                         ("prometheus-alerts.yml", "prometheus-alerts.yml")):
        link = REPO / "deploy" / name
        assert link.is_symlink() and link.resolve() == (chart_files / target).resolve(), link
    docs = render(sets=("dashboard.enabled=true", "prometheusRule.enabled=true"))
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard"))
    assert json.loads(cm["data"]["kaas.json"]) == json.loads((chart_files / "dashboard.json").read_text())
    rule = one(docs, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((chart_files / "prometheus-alerts.yml").read_text())
    assert "{{ $labels.instance }}" in json.dumps(rule["spec"]), "alert templates must pass through helm untouched"


def test_brokers_spread_softly_and_the_volume_is_not_rechowned():
    """The default: a soft spread across nodes (ScheduleAnyway, never
    blocks scheduling) that explicit constraints replace, and
    fsGroupChangePolicy OnRootMismatch (else the kubelet may re-chown the
    whole shared volume at every pod start)."""
    sts = one(render(), "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    assert pod["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
    (c,) = pod["topologySpreadConstraints"]
    assert c["whenUnsatisfiable"] == "ScheduleAnyway" and c["topologyKey"] == "kubernetes.io/hostname"
    assert c["labelSelector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]
    off = one(render(sets=("broker.spreadAcrossNodes=false",)), "StatefulSet")
    assert "topologySpreadConstraints" not in off["spec"]["template"]["spec"]


def test_notes_match_what_is_installed():
    """NOTES.txt (rendered by helm 4's install dry run, which needs no
    cluster; helm 3's still dials one, and `helm template` skips NOTES):
    the KafkaTopic example only when the operator runs (it is what serves
    it), an admin-client example otherwise, and how to reach the dashboard."""
    def notes(*sets):
        args = ["install", RELEASE, str(CHART), "-n", NAMESPACE, "--dry-run=client"]
        for s in sets:
            args += ["--set", s]
        r = run_helm("helm4", *args)
        assert r.returncode == 0, r.stderr
        return r.stdout.split("NOTES:", 1)[1]

    on, off = notes(), notes("operator.enabled=false")
    assert "kind: KafkaTopic" in on and "kind: KafkaTopic" not in off, off
    assert "kafka-topics.sh --bootstrap-server" in off
    for n in (on, off):
        assert f"port-forward pod/{RELEASE}-kaas-0 9644" in n and "http://127.0.0.1:9644/" in n, n


def test_crd_refuses_a_shrink_or_a_rename_and_keeps_off_strimzis_short_name():
    """The KafkaTopic CRD carries CEL transition rules on spec (enforced by
    the API server at apply: no API server runs here, so their presence and
    text are what is checked), and not Strimzi's short name `kt`."""
    crd = one(render(), "CustomResourceDefinition")
    assert "kt" not in crd["spec"]["names"]["shortNames"], crd["spec"]["names"]
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = {r["rule"] for r in spec["x-kubernetes-validations"]}
    assert "self.partitions >= oldSelf.partitions" in rules, rules
    assert any("self.topicName == oldSelf.topicName" in r for r in rules), rules
    # status.conditions is a list-map keyed by type, like metav1.Condition
    # lists (server-side apply merges a condition by its type).
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    conds = status["properties"]["conditions"]
    assert (conds.get("x-kubernetes-list-type"), conds.get("x-kubernetes-list-map-keys")) \
        == ("map", ["type"]), conds
    assert "type" in conds["items"]["required"], conds
