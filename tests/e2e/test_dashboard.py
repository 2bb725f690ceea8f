"""The telemetry HTTP endpoints behind the dashboard, against running
clusters: /api/actors, /api/cluster, /api/partitions, /metrics (parsed by
prometheus_client's parser), the page itself, bad input, and `kaas inspect`
after a kill -9 takeover (read-only: the directory is byte-identical after).

Scenarios that need an actor to fail or block use a weakfs mount per broker:
a short cut-off fails a leader's fsync (a supervisor restart); stopping the
FUSE daemon for a moment blocks the leader's writes (its mailbox backs up).
"""

import hashlib
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from cluster import FAST, Ledger, bootstrap, create_everywhere, read_assignment as fold_assignment, wait_leaders
from conftest import create_topic, kaas_bin, producer_conf, wait_until


def base(b) -> str:
    return b.metrics_url.rsplit("/", 1)[0]


def get(b, path: str, timeout: float = 5.0):
    with urllib.request.urlopen(base(b) + path, timeout=timeout) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read()


def api(b, path: str):
    status, ctype, body = get(b, path)
    assert status == 200 and ctype.startswith("application/json"), (path, status, ctype)
    return json.loads(body)


def all_actors(b, kind: str = "") -> list[dict]:
    """Every row of /api/actors, page by page (the endpoint is paged)."""
    out, offset = [], 0
    while True:
        page = api(b, f"/api/actors?kind={kind}&offset={offset}&limit=100")
        assert page["limit"] == 100
        out.extend(page["actors"])
        offset += len(page["actors"])
        if not page["actors"] or offset >= page["total"]:
            return out


def read_assignment(data_dir: Path) -> dict:
    return fold_assignment(data_dir / "__cluster")


class Load(threading.Thread):
    """A producer (acks=all) keeping every partition busy until stopped."""

    def __init__(self, bs: str, topic: str, partitions: int):
        super().__init__(daemon=True)
        self.p = Producer(producer_conf(bs, **{"linger.ms": 1, "message.timeout.ms": 60000,
                                               "enable.idempotence": False}))
        self.topic, self.partitions = topic, partitions
        self.stop_flag = threading.Event()
        self.acked = 0

    def _cb(self, err, _msg):
        if err is None:
            self.acked += 1

    def run(self):
        i = 0
        while not self.stop_flag.is_set():
            try:
                self.p.produce(self.topic, value=b"v%d" % i, partition=i % self.partitions, on_delivery=self._cb)
                i += 1
            except BufferError:
                self.p.poll(0.05)
            if i % 100 == 0:
                self.p.poll(0)
        self.p.flush(30)

    def stop(self):
        self.stop_flag.set()
        self.join(60)


def test_api_endpoints_under_load_on_three_brokers(broker_factory, topic_name):
    brokers = broker_factory.cluster(3, FAST)
    parts = 12
    create_everywhere(brokers, topic_name, parts)
    load = Load(bootstrap(brokers), topic_name, parts)
    load.start()
    try:
        wait_until(lambda: load.acked > 500, timeout=30, what="acknowledged load")
        data_dir = brokers[0].data_dir
        assignment = read_assignment(data_dir)
        entries = assignment["topics"][topic_name]["partitions"]

        # Every partition leader appears exactly once cluster-wide.
        seen: dict[str, list[int]] = {}
        for b in brokers:
            for row in all_actors(b, "partition_leader"):
                if row["id"].rsplit("-", 1)[0] == topic_name:
                    seen.setdefault(row["id"], []).append(b.broker_id)
                    p = int(row["id"].rsplit("-", 1)[1])
                    # The file it owns exists on the volume ...
                    assert Path(row["owns"]) == data_dir / topic_name / str(p), row
                    assert Path(row["owns"]).is_dir(), row
                    # ... and it writes under the epoch the assignment granted.
                    assert row["epoch"] == entries[p]["epoch"], (row, entries[p])
                    assert entries[p]["leader"] == b.broker_id, (row, entries[p])
                    for k in ("mailbox_depth", "messages_per_sec", "handle_p50_ms", "handle_p99_ms",
                              "restarts", "last_error", "supervisor", "kind", "handled"):
                        assert k in row, (k, row)
                    assert row["supervisor"] == "owner_registry"
        assert sorted(seen) == sorted(f"{topic_name}-{p}" for p in range(parts)), seen
        assert all(len(v) == 1 for v in seen.values()), seen

        # The cluster document agrees from every broker (the shared files
        # are re-read once a second: wait for a read after every join).
        for b in brokers:
            wait_until(lambda: len(api(b, "/api/cluster")["brokers"]) == 3, timeout=10,
                       what=f"broker {b.broker_id} reading every broker record")
        views = [api(b, "/api/cluster") for b in brokers]
        records = {b.broker_id: json.loads((data_dir / "__cluster" / "brokers" / f"{b.broker_id}.json").read_text())
                   for b in brokers}
        for b, c in zip(brokers, views):
            assert c["broker_id"] == b.broker_id
            ids = {x["id"]: x for x in c["brokers"]}
            # A u64 as a decimal string, digit for digit the record's (a
            # JSON number loses its low bits in the page's JavaScript).
            assert {i: x["incarnation"] for i, x in ids.items()} == \
                {i: str(r["incarnation"]) for i, r in records.items()}, c["brokers"]
            assert set(ids) == {0, 1, 2}, c["brokers"]
            assert all(x["alive"] for x in ids.values()), c["brokers"]
            assert all(x["lease_age_ms"] < 5000 for x in ids.values()), c["brokers"]
            assert c["controller"]["broker_id"] == assignment["controller_id"], c["controller"]
            assert c["controller"]["epoch"] >= assignment["controller_epoch"]
            assert sum(x["partitions_led"] for x in ids.values()) >= parts
            topics = {t["name"]: t for t in c["assignment"]["topics"]}
            led = {int(k): v for k, v in topics[topic_name]["leaders"].items()}
            want = {}
            for e in entries:
                want[e["leader"]] = want.get(e["leader"], 0) + 1
            assert led == want, (led, want)
            assert c["lease"]["headroom_ms"] > 0

        # Per-partition pages cover each partition once, with the leader's
        # live log on the broker that leads it.
        rows = []
        offset = 0
        while True:
            page = api(brokers[0], f"/api/partitions?topic={topic_name}&offset={offset}&limit=5")
            assert len(page["partitions"]) <= 5
            rows += page["partitions"]
            offset += 5
            if offset >= page["total"]:
                break
        assert [(r["partition"], r["epoch"]) for r in rows] == [(p, entries[p]["epoch"]) for p in range(parts)]
        mine = [r for r in rows if r["leader"] == 0]
        assert mine and all(r["local"] is not None for r in mine), mine
        wait_until(lambda: any((r["local"] or {}).get("high_watermark", 0) > 0
                               for r in api(brokers[0], f"/api/partitions?topic={topic_name}&local=1")["partitions"]),
                   timeout=10, what="a high watermark on the partition view")

        # Rates: the sampler shows messages/s under load on some leader.
        wait_until(lambda: any(r["messages_per_sec"] > 0 for b in brokers for r in all_actors(b, "partition_leader")),
                   timeout=10, what="messages/s under load")
        series = api(brokers[0], "/api/series")["points"]
        assert series and "produce_bytes_per_sec" in series[-1]

        # /metrics by a real Prometheus text parser: kinds and message types
        # as labels, never a partition or topic.
        _, ctype, body = get(brokers[0], "/metrics")
        assert ctype.startswith("text/plain")
        families = {f.name: f for f in text_string_to_metric_families(body.decode())}
        for name in ("kaas_actor_mailbox_depth", "kaas_actor_restarts", "kaas_actor_messages",
                     "kaas_actor_handle_seconds", "kaas_actor_queue_wait_seconds", "kaas_fsync_seconds",
                     "kaas_lease_headroom_seconds", "kaas_actor_errors", "kaas_fsyncs", "kaas_actors"):
            assert name in families, (name, sorted(families))
        for f in families.values():
            for s in f.samples:
                assert not ({"partition", "topic"} & set(s.labels)), s
        kinds = {s.labels["kind"] for s in families["kaas_actors"].samples}
        assert {"partition_leader", "membership", "controller", "assignment_watcher"} <= kinds
        headroom = families["kaas_lease_headroom_seconds"].samples[0].value
        assert 0 < headroom <= 1.5, headroom

        # The old endpoint still answers.
        legacy = json.loads(get(brokers[0], "/actors")[2])
        assert any(v["kind"] == "partition_leader" for v in legacy.values())
    finally:
        load.stop()


@pytest.mark.parametrize("path", [
    "/api/actors?limit=abc", "/api/actors?offset=-1", "/api/partitions?limit=0",
    "/api/partitions?topic=%zz", "/api/cluster?offset=99999999999999999999999",
])
def test_bad_query_strings_are_400(broker, path):
    with pytest.raises(urllib.error.HTTPError) as e:
        get(broker, path)
    assert e.value.code == 400, path
    # Still serving.
    assert api(broker, "/api/actors?limit=1")["limit"] == 1


def test_the_page_and_its_assets_are_served_read_only(broker):
    status, ctype, body = get(broker, "/")
    assert status == 200 and ctype.startswith("text/html")
    html = body.decode()
    assert "/dashboard.js" in html and "http" not in html.replace("http-equiv", ""), "no outside URLs"
    for asset, want in (("/dashboard.js", "javascript"), ("/dashboard.css", "css")):
        s, c, b = get(broker, asset)
        assert s == 200 and want in c and len(b) > 100
    with pytest.raises(urllib.error.HTTPError) as e:
        get(broker, "/nope")
    assert e.value.code == 404
    req = urllib.request.Request(base(broker) + "/api/actors", method="POST", data=b"x")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 405
    # A request head larger than the bound is refused, not buffered.
    import socket
    with socket.create_connection(("127.0.0.1", broker.metrics_port), timeout=5) as s:
        s.sendall(b"GET /api/actors?" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n")
        reply = s.recv(100)
    assert reply.startswith(b"HTTP/1.1 400"), reply


def leader_depth(b) -> int:
    return sum(k["mailbox_depth"] for k in api(b, "/api/actors?limit=1")["kinds"] if k["kind"] == "partition_leader")


def leader_restarts(b) -> int:
    return sum(k["restarts"] for k in api(b, "/api/actors?limit=1")["kinds"] if k["kind"] == "partition_leader")


@pytest.mark.substrates("weakfs")
def test_depth_rises_when_blocked_and_restarts_when_failed(broker_factory, topic_name):
    """Stop the broker's FUSE daemon (its volume hangs): appends pile up and
    the leaders' mailbox depth rises, then drains. Cut the volume off for a
    moment: the fsync fails, the leader restarts, and /api/actors and
    /metrics count the restart."""
    b = broker_factory()
    parts = 4
    create_topic(b.bootstrap, topic_name, parts)
    load = Load(b.bootstrap, topic_name, parts)
    load.start()
    try:
        wait_until(lambda: load.acked > 200, timeout=30, what="acknowledged load")
        assert leader_depth(b) < 1000
        # Block: the daemon stops answering; writes and fsyncs hang.
        os.kill(b.weakfs.proc.pid, signal.SIGSTOP)
        peak = 0
        try:
            deadline = time.monotonic() + 1.2
            while time.monotonic() < deadline:
                peak = max(peak, leader_depth(b))
                time.sleep(0.1)
        finally:
            os.kill(b.weakfs.proc.pid, signal.SIGCONT)
        assert peak > 0, "mailbox depth stayed 0 while the leaders were blocked"
        wait_until(lambda: leader_depth(b) < peak, timeout=15, what="the backlog draining")

        before = leader_restarts(b)
        b.weakfs.cut()
        time.sleep(0.4)
        b.weakfs.heal()
        wait_until(lambda: leader_restarts(b) > before, timeout=15, what="a leader restart counted")
        hot = api(b, "/api/actors?limit=1")["highlighted"]
        assert any("restarted" in h["why"] for h in hot), hot
        fam = {f.name: f for f in text_string_to_metric_families(b.metrics())}
        restarts = sum(s.value for s in fam["kaas_actor_restarts"].samples
                       if s.labels.get("kind") == "partition_leader")
        assert restarts > before
        acked = load.acked
        wait_until(lambda: load.acked > acked + 100, timeout=30, what="produce resuming after the restart")
    finally:
        load.stop()
    # `kaas inspect` works through the NFS-like mount too (read-only).
    r = inspect(b.data_dir, "--json", "--topic", topic_name)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert [t["name"] for t in rep["topics"]] == [topic_name]
    assert len(rep["topics"][0]["partitions"]) == parts
    assert all(p["claims"] and p["manifests"] for p in rep["topics"][0]["partitions"])


def tree_digest(root: Path) -> dict:
    """Every file and directory under `root`: kind, size, mtime and content hash."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            p = Path(dirpath) / d
            out[str(p.relative_to(root))] = ("dir", p.stat().st_mtime_ns)
        for f in filenames:
            p = Path(dirpath) / f
            st = p.stat()
            out[str(p.relative_to(root))] = ("file", st.st_size, st.st_mtime_ns,
                                             hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def inspect(data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(kaas_bin()), "inspect", str(data_dir), *args],
                          capture_output=True, text=True, timeout=60)


def test_inspect_after_kill9_takeover(broker_factory, topic_name):
    brokers = broker_factory.cluster(2, FAST)
    create_everywhere(brokers, topic_name, 1)
    p = Producer(producer_conf(bootstrap(brokers)))
    for i in range(200):
        p.produce(topic_name, value=b"before-%d" % i, partition=0)
    assert p.flush(30) == 0
    data_dir = brokers[0].data_dir
    first = read_assignment(data_dir)["topics"][topic_name]["partitions"][0]
    old_leader = next(b for b in brokers if b.broker_id == first["leader"])
    survivor = next(b for b in brokers if b is not old_leader)
    records = {b.broker_id: json.loads((data_dir / "__cluster" / "brokers" / f"{b.broker_id}.json").read_text())
               for b in brokers}
    old_leader.kill9()
    wait_leaders([survivor], topic_name, 1, {survivor.broker_id}, timeout=30)
    p = Producer(producer_conf(survivor.bootstrap))
    for i in range(50):
        p.produce(topic_name, value=b"after-%d" % i, partition=0)
    assert p.flush(30) == 0
    second = read_assignment(data_dir)["topics"][topic_name]["partitions"][0]
    assert second["epoch"] > first["epoch"] and second["leader"] == survivor.broker_id
    # Stop everything so that the directory holds still, then inspect.
    survivor.kill9()
    before = tree_digest(data_dir)

    r = inspect(data_dir, "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    text = inspect(data_dir)
    assert text.returncode == 0, text.stderr
    topic = next(t for t in rep["topics"] if t["name"] == topic_name)
    part = topic["partitions"][0]
    # Both epochs' claims, with their owners' incarnations.
    claims = {e: owner for e, owner in part["claims"]}
    assert claims[first["epoch"]]["broker_id"] == old_leader.broker_id
    assert claims[first["epoch"]]["incarnation"] == records[old_leader.broker_id]["incarnation"]
    assert claims[second["epoch"]]["broker_id"] == survivor.broker_id
    # The new owner: the assignment's entry and the newest manifest.
    assert part["assigned"][0] == survivor.broker_id and part["assigned"][2] == second["epoch"]
    newest_epoch, newest = part["manifests"][-1]
    assert newest_epoch == second["epoch"]
    sealed = [s for s in newest["segments"] if s["epoch"] == first["epoch"]]
    assert sealed and all(s["sealed"] for s in sealed), newest["segments"]
    assert any(s["epoch"] == second["epoch"] for s in newest["segments"])
    assert {b["id"] for b in rep["brokers"]} == {0, 1}
    assert rep["controller_epochs"] and rep["assignment"]["version"] >= 1
    t = text.stdout
    # One representation of an incarnation everywhere: the record's
    # decimal digits, as the logs print them (was hex here).
    inc = records[old_leader.broker_id]["incarnation"]
    assert f"claim    epoch {first['epoch']:>4}  broker {old_leader.broker_id} incarnation {inc}" in t, t
    assert f"joined the cluster broker_id={old_leader.broker_id} incarnation={inc}" in old_leader.log_text()
    assert f"claim    epoch {first['epoch']:>4}  broker {old_leader.broker_id}" in t, t
    assert f"claim    epoch {second['epoch']:>4}  broker {survivor.broker_id}" in t, t
    assert "sealed" in t and f"leader {survivor.broker_id}" in t

    # The sealed segment dumps with every CRC valid, up to its sealed length.
    seg = sealed[0]
    log = data_dir / topic_name / "0" / f"{seg['base']:020d}-e{seg['epoch']}.log"
    if not log.exists():
        log = next((data_dir / topic_name / "0").glob(f"*-e{seg['epoch']}.log"))
    d = inspect(data_dir, "segment", str(log), "--json")
    assert d.returncode == 0, d.stdout + d.stderr
    dump = json.loads(d.stdout)
    assert dump["batches"] and all(x["crc_valid"] for x in dump["batches"])
    assert dump["batches"][0]["base_offset"] == seg["base"]
    assert all(x["leader_epoch"] == seg["epoch"] for x in dump["batches"])
    assert dump["batches"][-1]["last_offset"] + 1 == seg["next_offset"]
    assert "isvalid: true" in inspect(data_dir, "segment", str(log)).stdout

    # Read-only: nothing changed, not a byte, not a name, not an mtime.
    assert tree_digest(data_dir) == before


def test_cluster_events_name_a_lapse_a_dead_broker_and_a_controller_change(broker_factory):
    """/api/cluster's events (the cluster half of "needs attention"): a
    broker frozen past its lease shows as stopped heartbeating and then as
    a new incarnation — long after it looks healthy again — and a killed
    controller as dead and as a controller change. Before, the list held
    only this broker's live actors' counters, so none of these appeared."""
    brokers = broker_factory.cluster(3, FAST)
    wait_until(lambda: (api(brokers[0], "/api/cluster")["controller"] or {}).get("broker_id") is not None,
               timeout=20, what="a controller")
    ctl = api(brokers[0], "/api/cluster")["controller"]["broker_id"]
    controller = next(b for b in brokers if b.broker_id == ctl)
    page = next(b for b in brokers if b is not controller)
    frozen = next(b for b in brokers if b not in (page, controller))

    def view():
        return api(page, "/api/cluster")

    wait_until(lambda: len(view()["brokers"]) == 3 and all(b["alive"] for b in view()["brokers"]),
               timeout=20, what="every broker alive on the page")

    def events(kind, broker_id):
        return [e for e in view()["events"] if e["kind"] == kind and e["broker"] == broker_id]

    frozen.proc.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: events("broker_dead", frozen.broker_id), timeout=20,
                   what="the frozen broker reported as not heartbeating")
    finally:
        frozen.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: events("incarnation", frozen.broker_id), timeout=30,
               what="the frozen broker's new incarnation reported")
    e = events("incarnation", frozen.broker_id)[-1]
    assert "lease lapsed" in e["text"] and e["age_ms"] >= 0, e
    controller.kill9()
    wait_until(lambda: events("broker_dead", controller.broker_id), timeout=30,
               what="the killed controller reported dead")
    wait_until(lambda: any(x["kind"] == "controller" for x in view()["events"]), timeout=30,
               what="the controller change reported")
    assert all(x["broker"] != controller.broker_id
               for x in view()["events"] if x["kind"] == "controller"), view()["events"]
    assert len(view()["events"]) <= 64

    # /metrics says the same: two live brokers, a new controller (the
    # gauges KaasBrokerDown and KaasPartitionsLeaderless alert on).
    def gauge(name):
        line = next(ln for ln in page.metrics().splitlines() if ln.startswith(name + " "))
        return float(line.split()[1])

    wait_until(lambda: gauge("kaas_cluster_brokers_live") == 2, timeout=30, what="2 live brokers in /metrics")
    wait_until(lambda: gauge("kaas_cluster_controller_id") != controller.broker_id, timeout=30,
               what="the new controller in /metrics")
