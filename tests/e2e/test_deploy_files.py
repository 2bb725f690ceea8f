"""deploy/: the Prometheus alert rules and the Grafana dashboard are valid
and built only on metrics a running broker exports.

* rules: `promtool check rules` when promtool is installed (.ci/run installs
  Debian's `prometheus`; under CI its absence is a failure), and always a
  structural check of the YAML;
* Grafana: the JSON's required fields, unique panel ids, non-overlapping
  grid positions, a Prometheus target with an expression per panel;
* both: every metric an expression names is in the broker's /metrics (as
  parsed by prometheus_client), and no expression groups or filters by a
  per-partition label."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus-alerts.yml"
RULES_TEST = REPO / "deploy" / "prometheus-alerts.test.yml"
GRAFANA = REPO / "deploy" / "grafana-dashboard.json"

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
            "unless", "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (label matchers, groupings,
    strings, durations and function names removed)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        tail = e[m.end():].lstrip()
        if tail.startswith("("):
            continue  # a function or aggregation
        if m.group(0).lower() in KEYWORDS:
            continue
        if re.fullmatch(r"\d+[smhdwy]", m.group(0)):
            continue
        names.add(m.group(0))
    return names


def exported(broker) -> set[str]:
    names = set()
    for fam in text_string_to_metric_families(broker.metrics()):
        for s in fam.samples:
            names.add(s.name)
    return names


def rules_exprs() -> list[tuple[str, str]]:
    doc = yaml.safe_load(RULES.read_text())
    out = []
    assert isinstance(doc.get("groups"), list) and doc["groups"]
    for g in doc["groups"]:
        assert g.get("name") and isinstance(g.get("rules"), list) and g["rules"], g
        for r in g["rules"]:
            assert set(r) <= {"alert", "record", "expr", "for", "labels", "annotations", "keep_firing_for"}, r
            assert ("alert" in r) != ("record" in r), r
            assert isinstance(r.get("expr"), str) and r["expr"].strip(), r
            if "alert" in r:
                assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", r["alert"]), r
                assert r.get("labels", {}).get("severity") in {"info", "warning", "critical"}, r
                assert r.get("annotations", {}).get("summary"), r
                if "for" in r:
                    assert re.fullmatch(r"\d+[smh]", r["for"]), r
            out.append((r.get("alert") or r.get("record"), r["expr"]))
    return out


def test_alert_rules_pass_promtool():
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool missing under CI (.ci/apt-packages.txt installs prometheus)")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    r = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout + r.stderr
    # The rules' own unit tests on recorded series: a broker frozen past its
    # lease, a dead broker and leaderless partitions fire; a healthy
    # cluster fires nothing.
    r = subprocess.run([promtool, "test", "rules", str(RULES_TEST)], capture_output=True, text=True,
                       timeout=60, cwd=RULES.parent)
    assert r.returncode == 0, r.stdout + r.stderr


def grafana_exprs() -> list[tuple[str, str]]:
    d = json.loads(GRAFANA.read_text())
    for k in ("uid", "title", "schemaVersion", "panels", "templating", "time"):
        assert k in d, k
    assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 30
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)), ids
    cells = set()
    out = []
    for p in d["panels"]:
        assert p.get("title") and p.get("type") in {"timeseries", "stat", "gauge", "table", "heatmap"}, p
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not (mine & cells), f"panel {p['title']} overlaps another"
        cells |= mine
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t.get("refId") and t.get("expr"), (p["title"], t)
            out.append((p["title"], t["expr"]))
    return out


def test_rules_and_dashboard_use_only_exported_metrics(broker, topic_name):
    from conftest import create_topic, produce_and_check
    from conftest import commit_offset, wait_until
    create_topic(broker.bootstrap, topic_name, 1)
    produce_and_check(broker.bootstrap, topic_name, n=5)
    # A group with a committed offset, so the per-group lag series exist.
    commit_offset(broker.bootstrap, topic_name, f"g-{topic_name}", 1)
    wait_until(lambda: "kaas_consumer_group_lag" in exported(broker), timeout=20,
               what="the group's lag exported")
    have = exported(broker)
    exprs = rules_exprs() + grafana_exprs()
    assert len(exprs) >= 10
    for who, expr in exprs:
        names = metric_names(expr)
        assert names, (who, expr)
        missing = {n for n in names if n not in have}
        assert not missing, f"{who}: {expr} names metrics the broker does not export: {missing}"
        assert not re.search(r"\b(partition|topic)\b\s*[=!~]", expr), (who, expr)
        assert not re.search(r"by\s*\([^)]*\b(partition|topic)\b", expr), (who, expr)


def test_metric_name_extraction():
    assert metric_names('histogram_quantile(0.99, sum by (instance, le) (rate(kaas_fsync_seconds_bucket{kind=~"a|b"}[5m]))) > 0.25') \
        == {"kaas_fsync_seconds_bucket"}
    assert metric_names("min_over_time(kaas_lease_headroom_seconds[1m]) < 1") == {"kaas_lease_headroom_seconds"}
    assert metric_names("(sum by (i) (rate(a_total[10m])) - sum(rate(b_total[1m]))) > 10 * 1024") == {"a_total", "b_total"}


DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
CHART_VALUES = REPO / "deploy" / "helm" / "kaas" / "values.yaml"


def dockerfile_stages(text: str) -> dict[str, list[str]]:
    """Instructions per named stage (continuation lines joined)."""
    stages: dict[str, list[str]] = {}
    cur = None
    for line in re.sub(r"\\\n", " ", text).splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"FROM\s+\S+\s+AS\s+(\S+)$", line, re.I)
        if m:
            cur = m.group(1)
            stages[cur] = []
        if cur is not None:
            stages[cur].append(line)
    return stages


def test_dockerfile_matches_chart():
    """The images the chart names can be built from the repository, and
    agree with it: Rust pinned to rust-toolchain.toml, binaries at the
    chart's command paths, the chart's uid/gid, the chart's ports. (No
    Docker engine in CI: this checks the Dockerfile's text, it builds
    nothing.)"""
    text = DOCKERFILE.read_text()
    stages = dockerfile_stages(text)
    values = yaml.safe_load(CHART_VALUES.read_text())
    channel = re.search(r'channel\s*=\s*"([^"]+)"', (REPO / "rust-toolchain.toml").read_text()).group(1)
    assert re.search(rf"^FROM rust:{re.escape(channel)}(-\S+)? AS build$", text, re.M), channel
    for target, binary, command, ports, sec in (
        ("broker", "kaas", values["broker"]["command"],
         set(values["broker"]["ports"].values()), values["broker"]["podSecurityContext"]),
        ("operator", "kaas-operator", values["operator"]["command"],
         {values["operator"]["metricsPort"]}, values["operator"]["podSecurityContext"]),
    ):
        body = "\n".join(stages[target])
        assert f"COPY --from=build /out/{binary} {command}" in body, target
        assert f'ENTRYPOINT ["{command}"]' in body, target
        assert f"USER {sec['runAsUser']}:{sec['runAsGroup']}" in body, target
        exposed = {int(p) for l in stages[target] if l.startswith("EXPOSE") for p in l.split()[1:]}
        assert exposed == ports, target
        assert sec["runAsNonRoot"] and sec["runAsUser"] != 0
    build = "\n".join(stages["build"])
    assert "--locked" in build and "-p kaas " in build and "-p kaas-operator" in build
    # The runtime user exists in the image with the chart's ids.
    rt = "\n".join(stages["runtime"])
    sec = values["broker"]["podSecurityContext"]
    assert f"--uid {sec['runAsUser']}" in rt and f"--gid {sec['runAsGroup']}" in rt
    # Both images are what the chart pulls by default.
    assert values["image"]["repository"] == "kaas/kaas"
    assert values["operator"]["image"]["repository"] == "kaas/kaas-operator"
