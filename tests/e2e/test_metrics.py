"""GET /metrics serves Prometheus text with the actor, fsync and connection
metrics, with non-zero counts after some produce traffic."""

import re
import urllib.request

from confluent_kafka import Producer

from conftest import consume_all, create_topic, producer_conf

LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(\s+\d+)?$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse(text):
    """[(name, {labels}, float)] for every sample line."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        assert m, f"not a Prometheus sample line: {line!r}"
        labels = dict(LABEL.findall(m.group(2) or ""))
        out.append((m.group(1), labels, float(m.group(3))))
    return out


def samples(parsed, name, **labels):
    return [(l, v) for n, l, v in parsed if n == name and all(l.get(k) == x for k, x in labels.items())]


def produce_and_read(broker, topic_name: str, n: int) -> Producer:
    """`n` records over two partitions of a new topic, acknowledged and
    read back; returns the producer."""
    create_topic(broker.bootstrap, topic_name, 2)
    p = Producer(producer_conf(broker.bootstrap))
    for i in range(n):
        p.produce(topic_name, value=b"m%d" % i, partition=i % 2)
    assert p.flush(30) == 0
    consume_all(broker.bootstrap, topic_name, 2, timeout=30)
    return p


def test_metrics_after_produce(broker, topic_name):
    p = produce_and_read(broker, topic_name, 500)

    with urllib.request.urlopen(broker.metrics_url, timeout=5) as r:
        assert r.status == 200
        ctype = r.headers.get("Content-Type", "")
        text = r.read().decode()
    assert ctype.startswith("text/plain"), ctype
    parsed = parse(text)
    names = {n for n, _, _ in parsed}

    depth = samples(parsed, "kaas_actor_mailbox_depth", kind="partition_leader")
    assert depth, "kaas_actor_mailbox_depth{kind=\"partition_leader\"} missing"
    assert all(v >= 0 for _, v in depth)

    msgs = samples(parsed, "kaas_actor_messages_total")
    assert msgs and all("kind" in l and "message" in l for l, _ in msgs), msgs[:5]
    pl = [v for l, v in msgs if l["kind"] == "partition_leader"]
    assert sum(pl) > 0, "partition_leader handled no messages"

    for suffix in ("_bucket", "_sum", "_count"):
        assert "kaas_actor_handle_seconds" + suffix in names, f"kaas_actor_handle_seconds{suffix} missing"
    counts = samples(parsed, "kaas_actor_handle_seconds_count")
    assert all("kind" in l and "message" in l for l, _ in counts)
    assert sum(v for _, v in counts) > 0
    buckets = samples(parsed, "kaas_actor_handle_seconds_bucket")
    assert any(l.get("le") == "+Inf" for l, _ in buckets)
    # +Inf bucket equals _count for every series
    for l, v in counts:
        inf = [bv for bl, bv in buckets if bl.get("le") == "+Inf" and bl.get("kind") == l["kind"]
               and bl.get("message") == l["message"]]
        assert inf == [v], (l, inf, v)

    restarts = samples(parsed, "kaas_actor_restarts_total")
    assert restarts and all("kind" in l for l, _ in restarts)

    fsyncs = samples(parsed, "kaas_fsyncs_total")
    assert fsyncs and sum(v for _, v in fsyncs) > 0, "no fsyncs counted after acks=all produce"

    conns = samples(parsed, "kaas_connections")
    assert conns and all(v >= 0 for _, v in conns)

    # counters are monotonic across scrapes
    fs_before = sum(v for _, v in fsyncs)
    # Every answered Produce is timed in the broker (frame read to answer
    # written): the histogram's count grows by at least the request below.
    produced = samples(parsed, "kaas_produce_seconds_count")
    assert produced and produced[0][1] > 0, "kaas_produce_seconds_count missing or 0 after produce"
    p.produce(topic_name, value=b"one more", partition=0)
    assert p.flush(30) == 0
    after = parse(broker.metrics())
    assert sum(v for _, v in samples(after, "kaas_fsyncs_total")) > fs_before
    assert samples(after, "kaas_produce_seconds_count")[0][1] > produced[0][1]
    inf = [v for l, v in samples(after, "kaas_produce_seconds_bucket") if l.get("le") == "+Inf"]
    assert inf == [samples(after, "kaas_produce_seconds_count")[0][1]]


def test_promtool_finds_every_family_described(broker, topic_name):
    """`promtool check metrics` (Prometheus's own linter) is clean on a
    broker that has served produce, fetch and a group's commit — every
    family with HELP and TYPE, counters named _total — and the build info
    and lease-lapse counter are there."""
    import shutil
    import subprocess
    from conftest import commit_offset
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing (Debian package prometheus, .ci/apt-packages.txt)"
    produce_and_read(broker, topic_name, 50)
    commit_offset(broker.bootstrap, topic_name, f"g-{topic_name}", 5)
    text = broker.metrics()
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr
    parsed = parse(text)
    assert samples(parsed, "kaas_build_info")[0][1] == 1
    assert samples(parsed, "kaas_lease_lapses_total") == [({}, 0.0)]
    # The cluster as this broker applied it: itself live and controller,
    # every partition led.
    assert samples(parsed, "kaas_cluster_brokers_live") == [({}, 1.0)]
    assert samples(parsed, "kaas_cluster_controller_id") == [({}, float(broker.broker_id))]
    assert samples(parsed, "kaas_cluster_controller_epoch")[0][1] >= 1
    assert samples(parsed, "kaas_cluster_partitions_leaderless") == [({}, 0.0)]
    assert samples(parsed, "kaas_cluster_shards_leaderless") == [({}, 0.0)]


def test_every_actor_kind_reports_through_one_path(broker, topic_name):
    """Every actor's messages pass the instrumented mailbox: the topic
    catalog, the controller and the partition leaders count their messages
    by type, and /actors lists every live actor with its mailbox depth, the
    file it owns and its epoch."""
    import json

    create_topic(broker.bootstrap, topic_name, 2)
    p = Producer(producer_conf(broker.bootstrap))
    p.produce(topic_name, value=b"x", partition=0)
    assert p.flush(30) == 0

    parsed = parse(broker.metrics())
    msgs = {(l["kind"], l["message"]): v for l, v in samples(parsed, "kaas_actor_messages_total")}
    assert msgs.get(("topic_catalog", "create_topic"), 0) >= 1, msgs
    assert msgs.get(("partition_leader", "append_batches"), 0) >= 1, msgs
    assert msgs.get(("controller", "reconcile_now"), 0) >= 1, msgs
    kinds = {l["kind"] for l, _ in samples(parsed, "kaas_actors")}
    assert {"partition_leader", "topic_catalog", "controller", "membership",
            "assignment_watcher", "producer_id_blocks"} <= kinds, kinds

    base = broker.metrics_url.rsplit("/", 1)[0]
    with urllib.request.urlopen(base + "/actors", timeout=5) as r:
        rows = json.loads(r.read())
    leaders = {k: v for k, v in rows.items() if v["kind"] == "partition_leader"}
    assert f"partition_leader/{topic_name}-0" in leaders, sorted(rows)
    row = leaders[f"partition_leader/{topic_name}-0"]
    assert row["owns"].endswith(f"{topic_name}/0"), row
    assert row["epoch"] >= 1 and row["mailbox_depth"] >= 0 and row["handled"] >= 1, row
    controller = [v for v in rows.values() if v["kind"] == "controller"]
    assert controller and controller[0]["owns"].endswith("assignment.json"), controller
