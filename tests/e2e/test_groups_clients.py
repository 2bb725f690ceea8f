"""Consumer groups with more real clients, and what the broker tells on-call.

* DescribeGroups shows each member's client id and client host (the
  request header's client id, the connection's peer address), as Kafka does.
* Consumer lag: a group that commits behind the end of a topic shows up in
  `/metrics` (per group and topic, and per partition) and in the
  coordinator's entry of `/api/actors`.
* A client hammering an API the broker does not serve gets a bounded number
  of WARN lines (once per interval per peer), not one per request.
* Real clients in groups: kafkajs (npm, tests/clients), two Debian kcat
  balanced consumers (`kcat -G`) sharing a topic, confluent-kafka with
  `cooperative-sticky` (a member leaves, another joins: incremental
  rebalances, every record consumed exactly once), static membership
  (`group.instance.id`: a restart within the session timeout rebalances
  nothing), and a commit storm of many groups that leaves an unrelated
  partition's produce and fetch latency within a bound of a baseline
  measured in the same test.
"""

from __future__ import annotations

import json
import multiprocessing
import re
import shutil
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

import kafka_wire as w
from conftest import client_conf, create_topic, producer_conf, wait_until
from test_dashboard import api

pytestmark = [
    pytest.mark.substrates("local"),
    pytest.mark.broker_args("--group-shards", "8",
                            "--group-initial-rebalance-delay-ms", "300"),
]


def produce(bootstrap: str, topic: str, n: int, partitions: int, start: int = 0) -> None:
    p = Producer(producer_conf(bootstrap))
    for i in range(start, start + n):
        p.produce(topic, value=b"%d" % i, partition=i % partitions)
        p.poll(0)
    assert p.flush(30) == 0


def group_consumer(bootstrap: str, group: str, **extra) -> Consumer:
    conf = {
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        "fetch.wait.max.ms": 100,
    }
    conf.update(extra)
    return Consumer(client_conf(bootstrap, **conf))


def wait_assigned(cs: list[Consumer], total: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while sum(len(c.assignment()) for c in cs) != total:
        assert time.monotonic() < deadline, "group never balanced"
        for c in cs:
            c.poll(0.1)


# ---------------------------------------------------------------------------
# DescribeGroups: client id and host
# ---------------------------------------------------------------------------


def test_describe_groups_shows_member_client_id_and_host(broker, topic_name):
    from confluent_kafka.admin import AdminClient

    create_topic(broker.bootstrap, topic_name, 2)
    group = f"desc-{uuid.uuid4().hex[:8]}"
    c = group_consumer(broker.bootstrap, group, **{"client.id": "lag-watcher-7"})
    c.subscribe([topic_name])
    wait_assigned([c], 2)

    a = AdminClient(client_conf(broker.bootstrap))
    d = a.describe_consumer_groups([group])[group].result(timeout=30)
    assert len(d.members) == 1, d
    m = d.members[0]
    assert m.client_id == "lag-watcher-7", m
    # Kafka shows the peer address as "/ip"; the client connects on loopback.
    assert m.host.lstrip("/") == "127.0.0.1", m.host

    c.close()
    broker.assert_no_panic()


# ---------------------------------------------------------------------------
# consumer lag in /metrics and /api/actors
# ---------------------------------------------------------------------------


def lag_series(text: str, group: str) -> dict[tuple, int]:
    """{(topic,) or (topic, partition): lag} of `group` in a /metrics text."""
    out = {}
    for line in text.splitlines():
        m = re.match(r'kaas_consumer_group_lag\{group="([^"]*)",topic="([^"]*)"\} (\d+)$', line)
        if m and m.group(1) == group:
            out[(m.group(2),)] = int(m.group(3))
        m = re.match(r'kaas_consumer_group_partition_lag\{group="([^"]*)",topic="([^"]*)",'
                     r'partition="(\d+)"\} (\d+)$', line)
        if m and m.group(1) == group:
            out[(m.group(2), int(m.group(3)))] = int(m.group(4))
    return out


def test_consumer_lag_in_metrics_and_actors_json(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 2)
    produce(broker.bootstrap, topic_name, 100, 2)  # 50 per partition
    group = f"lag-{uuid.uuid4().hex[:8]}"
    c = group_consumer(broker.bootstrap, group)
    # Commit behind the end: 10 of partition 0, 45 of partition 1.
    c.commit(offsets=[TopicPartition(topic_name, 0, 10), TopicPartition(topic_name, 1, 45)],
             asynchronous=False)

    def wait_lag(want: dict) -> None:
        # Committed offsets are republished once a second.
        deadline = time.monotonic() + 15
        while (got := lag_series(broker.metrics(), group)) != want:
            assert time.monotonic() < deadline, f"lag series {got}, want {want}"
            time.sleep(0.2)
    wait_lag({(topic_name,): 45, (topic_name, 0): 40, (topic_name, 1): 5})

    # The coordinator's entry in the actors JSON carries the same lag.
    url = broker.metrics_url.rsplit("/", 1)[0] + "/api/actors?kind=group_coordinator&limit=1000"
    doc = json.load(urllib.request.urlopen(url, timeout=5))
    entries = [t for a in doc["actors"] for t in a["consumer_lag"]["topics"]
               if t["group"] == group]
    assert len(entries) == 1, entries
    e = entries[0]
    assert (e["topic"], e["lag"], e["unknown_partitions"]) == (topic_name, 45, 0), e
    assert [(p["partition"], p["committed"], p["high_watermark"], p["lag"])
            for p in e["partitions"]] == [(0, 10, 50, 40), (1, 45, 50, 5)]

    # More records: the lag grows with the high watermark, read live.
    produce(broker.bootstrap, topic_name, 20, 2, start=100)
    wait_lag({(topic_name,): 65, (topic_name, 0): 50, (topic_name, 1): 15})
    # Caught up: no lag.
    c.commit(offsets=[TopicPartition(topic_name, 0, 60), TopicPartition(topic_name, 1, 60)],
             asynchronous=False)
    wait_lag({(topic_name,): 0, (topic_name, 0): 0, (topic_name, 1): 0})
    text = broker.metrics()
    assert "kaas_consumer_lag_groups_max 100" in text
    assert "kaas_consumer_lag_unknown_partitions 0" in text
    c.close()
    broker.assert_no_panic()


def three_brokers_and_a_group_behind(broker_factory, topic_name: str, prefix: str):
    """Three brokers, a 6-partition topic with 20 records per partition, and
    a group that committed p on partition p (lag 20 - p each, 105 in all):
    (brokers, group, partitions)."""
    from cluster import FAST, bootstrap, create_everywhere
    bs = broker_factory.cluster(3, FAST + ["--group-shards", "8"])
    parts = 6
    create_everywhere(bs, topic_name, parts)
    produce(bootstrap(bs), topic_name, 20 * parts, parts)
    group = f"{prefix}-{uuid.uuid4().hex[:8]}"
    c = group_consumer(bootstrap(bs), group)
    c.commit(offsets=[TopicPartition(topic_name, p, p) for p in range(parts)],
             asynchronous=False)
    c.close()
    return bs, group, parts


@pytest.mark.slow
def test_consumer_lag_of_partitions_led_by_other_brokers(broker_factory, topic_name):
    """Three brokers: the group's coordinator leads only some of the topic's
    partitions. Its lag (in /metrics and /api/actors) still covers every
    partition: the high watermarks of the others are read from their
    leaders (ListOffsets, refreshed every second), none left unknown.
    Before that, two thirds of the partitions were unknown and the lag
    counted only the coordinator's own."""
    from cluster import bootstrap, leaders
    bs, group, parts = three_brokers_and_a_group_behind(broker_factory, topic_name, "lag-remote")
    want = {(topic_name,): 105, **{(topic_name, p): 20 - p for p in range(parts)}}

    # The coordinator is the broker whose metrics carry the group.
    deadline = time.monotonic() + 30
    while True:
        got = {b.broker_id: lag_series(b.metrics(), group) for b in bs}
        coord = [i for i, g in got.items() if g]
        if len(coord) == 1 and got[coord[0]] == want:
            break
        assert time.monotonic() < deadline, f"lag per broker {got}, want {want} on one"
        time.sleep(0.2)
    coordinator = next(b for b in bs if b.broker_id == coord[0])
    led = leaders(bs, topic_name)
    assert any(l != coordinator.broker_id for l in led.values()), \
        f"the coordinator {coordinator.broker_id} leads every partition {led}: nothing tested"
    text = coordinator.metrics()
    assert "kaas_consumer_lag_unknown_partitions 0" in text
    url = coordinator.metrics_url.rsplit("/", 1)[0] + "/api/actors?kind=group_coordinator&limit=1000"
    doc = json.load(urllib.request.urlopen(url, timeout=5))
    [e] = [t for a in doc["actors"] for t in a["consumer_lag"]["topics"] if t["group"] == group]
    assert (e["lag"], e["unknown_partitions"]) == (105, 0), e
    assert [(p["partition"], p["committed"], p["high_watermark"]) for p in e["partitions"]] \
        == [(p, p, 20) for p in range(parts)]

    # More records on every partition: the remote high watermarks follow.
    produce(bootstrap(bs), topic_name, 10 * parts, parts, start=20 * parts)
    want = {(topic_name,): 165, **{(topic_name, p): 30 - p for p in range(parts)}}
    wait_until(lambda: lag_series(coordinator.metrics(), group) == want, 15,
               what=f"lag {want} on the coordinator")


@pytest.mark.slow
def test_consumer_lag_of_every_group_on_every_broker_page(broker_factory, topic_name):
    """Three brokers, a group coordinated by one of them: every broker's
    /api/cluster names the group, its coordinator and its lag per
    partition (the others read it from the coordinator over Kafka while a
    page looks), and every broker's /api/partitions gives the log start and
    high watermark of partitions it does not lead (read from their
    leaders). Before, the lag was only on the coordinator's own page and
    two thirds of the partition rows had no offsets at all."""
    from cluster import bootstrap, leaders
    bs, group, parts = three_brokers_and_a_group_behind(broker_factory, topic_name, "lag-view")
    # Offsets below the start: 5 records deleted from partition 0.
    from confluent_kafka.admin import AdminClient
    adm = AdminClient({"bootstrap.servers": bootstrap(bs)})
    [f] = adm.delete_records([TopicPartition(topic_name, 0, 5)]).values()
    f.result(30)

    def view(b):
        for g in api(b, "/api/cluster")["consumer_lag"]["groups"]:
            if g["group"] == group:
                [t] = g["topics"]
                return (g["coordinator"], g["lag"], g["unknown_partitions"],
                        sorted((p["partition"], p["committed"], p["high_watermark"]) for p in t["partitions"]))
        return None

    want_parts = [(p, p, 20) for p in range(parts)]
    seen = {}
    deadline = time.monotonic() + 30
    while True:
        seen = {b.broker_id: view(b) for b in bs}
        coords = {v[0] for v in seen.values() if v}
        if all(v and v[1:] == (105, 0, want_parts) for v in seen.values()) and len(coords) == 1:
            break
        assert time.monotonic() < deadline, f"per broker (coordinator, lag, unknown, partitions): {seen}"
        time.sleep(0.3)
    [coordinator] = coords
    assert coordinator in {b.broker_id for b in bs}
    # The view on a broker that is not the coordinator is what was new.
    assert any(b.broker_id != coordinator for b in bs)

    led = leaders(bs, topic_name)
    for b in bs:
        def offsets(b=b):
            rows = api(b, f"/api/partitions?topic={topic_name}&limit=50")["partitions"]
            got = {}
            for r in rows:
                x = r["local"] if r["local"] else r["remote"]
                got[r["partition"]] = (x["log_start_offset"], x["high_watermark"])
            return got
        want = {p: (5 if p == 0 else 0, 20) for p in range(parts)}
        wait_until(lambda: offsets() == want, 15,
                   what=f"broker {b.broker_id}'s partition rows {offsets()} (leaders {led}), want {want}")
        remote = [r for r in api(b, f"/api/partitions?topic={topic_name}&limit=50")["partitions"]
                  if r["leader"] != b.broker_id]
        assert remote and all(r["local"] is None and r["remote"] for r in remote), remote


# ---------------------------------------------------------------------------
# repeated refusals: logged once per interval per peer, not per request
# ---------------------------------------------------------------------------
DESCRIBE_ACLS = 29  # an API kaas does not advertise
WARN_INTERVAL_S = 10  # PeerWarnings' interval in the broker


def warn_lines(broker, needle: str) -> int:
    return sum(1 for line in broker.log_text().splitlines() if " WARN " in line and needle in line)


def test_a_client_hammering_refused_requests_gets_bounded_warn_lines(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 1)
    before_api = warn_lines(broker, "closing connection")
    t0 = time.monotonic()
    # An API not advertised: every request closes its connection; the
    # client reconnects and asks again, as real clients do.
    body = (w.i8(1) + w.string(None) + w.i8(3) + w.string(None) + w.string(None)
            + w.i8(1) + w.i8(1))
    hammered = 0
    while hammered < 200:
        with w.connect(broker.addr) as s:
            s.sendall(w.frame(w.request_header(DESCRIBE_ACLS, 1, hammered) + body))
            assert w.wait_closed(s, 10) is not None, "connection left open"
        hammered += 1
    # A produce batch refused for its CRC, again and again on one connection.
    good = w.record_batch_v2([w.Rec(value=b"x")])
    bad = good[:-1] + bytes([good[-1] ^ 0xFF])
    with w.connect(broker.addr) as s:
        for i in range(200):
            resp = w.roundtrip(s, w.produce_request_v3(i, topic_name, 0, bad))
            _, [res] = w.parse_produce_response_v3(resp)
            assert res.error_code == 2, res  # CORRUPT_MESSAGE
    elapsed = time.monotonic() - t0
    # At most one line per peer and kind per interval (plus the first).
    bound = 1 + int(elapsed // WARN_INTERVAL_S) + 1
    api_lines = warn_lines(broker, "closing connection") - before_api
    assert 1 <= api_lines <= bound, f"{api_lines} WARN lines for 200 refused requests"
    produce_lines = warn_lines(broker, "rejected produce batch")
    assert 1 <= produce_lines <= bound, f"{produce_lines} WARN lines for 200 refused batches"
    # The count of what was not logged is carried on the next line.
    assert re.search(r"count=\d+", broker.log_text())
    broker.assert_no_panic()


# ---------------------------------------------------------------------------
# kafkajs (npm) consumer group
# ---------------------------------------------------------------------------
CLIENTS_DIR = Path(__file__).resolve().parent.parent / "clients"


def test_kafkajs_consumer_group(broker, topic_name):
    if shutil.which("node") is None or not (CLIENTS_DIR / "node_modules" / "kafkajs").is_dir():
        pytest.skip("node or kafkajs missing (.ci/run installs tests/clients)")
    create_topic(broker.bootstrap, topic_name, 4)
    n = 400
    produce(broker.bootstrap, topic_name, n, 4)
    group = f"kjs-{uuid.uuid4().hex[:8]}"
    r = subprocess.run(["node", str(CLIENTS_DIR / "kafkajs_group.mjs"), broker.bootstrap,
                        topic_name, group, str(n), "2"],
                       capture_output=True, timeout=150, cwd=CLIENTS_DIR)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    out = json.loads(r.stdout.decode().strip().splitlines()[-1])
    assert out["why"] == "ok", out["why"]
    assert sorted({v for v, _ in out["values"]}) == list(range(n))
    # Both members were handed partitions, and between them all four.
    parts = {m: set(ps) for m, ps in out["members"].items()}
    assert len(parts) == 2 and all(parts.values()), parts
    assert set().union(*parts.values()) == {0, 1, 2, 3}, parts
    # The group committed where it got to: a fresh member of it starts at
    # the committed offsets (auto-commit every 100 ms and on disconnect).
    c = group_consumer(broker.bootstrap, group)
    committed = c.committed([TopicPartition(topic_name, p) for p in range(4)], timeout=30)
    assert sum(tp.offset for tp in committed) == n, committed
    c.close()
    broker.assert_no_panic()


# ---------------------------------------------------------------------------
# Debian kcat: two balanced consumers share a topic
# ---------------------------------------------------------------------------


def test_two_kcat_balanced_consumers_share_the_partitions(broker, topic_name):
    import threading
    from confluent_kafka.admin import AdminClient

    if shutil.which("kcat") is None:
        pytest.skip("kcat not installed")
    create_topic(broker.bootstrap, topic_name, 4)
    group = f"kcg-{uuid.uuid4().hex[:8]}"
    procs = [subprocess.Popen(["kcat", "-b", broker.bootstrap, "-G", group,
                               "-X", "auto.offset.reset=earliest",
                               "-X", "session.timeout.ms=6000",
                               "-X", "heartbeat.interval.ms=500",
                               "-f", "%p %s\\n", "-u", topic_name],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
             for _ in range(2)]
    lines: list[list[str]] = [[], []]

    def reader(i):
        for line in procs[i].stdout:
            lines[i].append(line.decode().strip())
    threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    n = 200
    try:
        a = AdminClient(client_conf(broker.bootstrap))

        def both_members():
            d = a.describe_consumer_groups([group])[group].result(timeout=10)
            return (len(d.members) == 2 and "STABLE" in str(d.state)
                    and all(m.assignment.topic_partitions for m in d.members))
        wait_until(both_members, timeout=60, what="two stable kcat members")
        produce(broker.bootstrap, topic_name, n, 4)
        wait_until(lambda: len(lines[0]) + len(lines[1]) >= n, timeout=60,
                   what="both kcat consumers to read everything")
        time.sleep(1.0)  # anything handed out twice would show up now
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    seen: dict[int, int] = {}
    by_proc: list[set[int]] = []
    for out in lines:
        parts = set()
        for line in out:
            part, value = line.split()
            parts.add(int(part))
            seen[int(value)] = seen.get(int(value), 0) + 1
        by_proc.append(parts)
    assert sorted(seen) == list(range(n)), f"missing: {set(range(n)) - set(seen)}"
    assert all(c == 1 for c in seen.values()), "a record consumed twice"
    # Each consumed its own partitions, none shared.
    assert all(by_proc) and not (by_proc[0] & by_proc[1]), by_proc
    broker.assert_no_panic()


# ---------------------------------------------------------------------------
# confluent-kafka cooperative-sticky: incremental rebalances, exactly once
# ---------------------------------------------------------------------------


class Member:
    """A confluent consumer that records its assignment callbacks."""

    def __init__(self, bootstrap: str, group: str, topic: str, name: str, **extra):
        self.name = name
        self.events: list[tuple[str, set[int]]] = []
        self.c = group_consumer(bootstrap, group, **extra)
        self.c.subscribe([topic], on_assign=self._assign, on_revoke=self._revoke)

    def _assign(self, c, parts):
        self.events.append(("assign", {p.partition for p in parts}))

    def _revoke(self, c, parts):
        self.events.append(("revoke", {p.partition for p in parts}))

    def owned(self) -> set[int]:
        return {p.partition for p in self.c.assignment()}


def poll_members(ms: list[Member], seen: dict[int, list[str]], until, timeout: float,
                 what: str) -> None:
    """Poll round robin; each record is committed (sync) before the next
    poll, so a rebalance never hands it out again."""
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, f"timeout waiting for {what}"
        for m in ms:
            msg = m.c.poll(0.05)
            if msg is None or msg.error():
                continue
            seen.setdefault(int(msg.value()), []).append(m.name)
            m.c.commit(message=msg, asynchronous=False)


def test_cooperative_sticky_leave_and_join_are_incremental(broker, topic_name):
    parts = 6
    create_topic(broker.bootstrap, topic_name, parts)
    group = f"coop-{uuid.uuid4().hex[:8]}"
    conf = {"partition.assignment.strategy": "cooperative-sticky"}
    ms = [Member(broker.bootstrap, group, topic_name, f"m{i}", **conf) for i in range(3)]
    seen: dict[int, list[str]] = {}

    def balanced(members):
        return lambda: (sorted(p for m in members for p in m.owned()) == list(range(parts))
                        and all(len(m.owned()) == parts // len(members) for m in members))
    poll_members(ms, seen, balanced(ms), 60, "three balanced members")
    produce(broker.bootstrap, topic_name, 300, parts)
    poll_members(ms, seen, lambda: len(seen) >= 300, 90, "phase 1")

    # m1 leaves: the survivors only gain partitions (no revoke of their own).
    before = {m.name: m.owned() for m in ms}
    for m in ms:
        m.events.clear()
    gone = ms.pop(1)
    gone.c.close()
    poll_members(ms, seen, balanced(ms), 60, "the survivors to take over")
    for m in ms:
        revoked = set().union(*[p for e, p in m.events if e == "revoke"] or [set()])
        assert not revoked, f"{m.name} lost {revoked} when another member left"
        assert before[m.name] <= m.owned(), (m.name, before[m.name], m.owned())
    produce(broker.bootstrap, topic_name, 300, parts, start=300)
    poll_members(ms, seen, lambda: len(seen) >= 600, 90, "phase 2")

    # m3 joins: only the partitions it gets move; the others stay put.
    before = {m.name: m.owned() for m in ms}
    for m in ms:
        m.events.clear()
    ms.append(Member(broker.bootstrap, group, topic_name, "m3", **conf))
    poll_members(ms, seen, balanced(ms), 60, "the newcomer to get its share")
    moved = set()
    for m in ms[:2]:
        revoked = set().union(*[p for e, p in m.events if e == "revoke"] or [set()])
        assert revoked == before[m.name] - m.owned(), (m.name, m.events)
        assert len(revoked) == 1, f"{m.name} gave up {revoked}, not just its surplus"
        moved |= revoked
    assert ms[2].owned() == moved
    produce(broker.bootstrap, topic_name, 300, parts, start=600)
    poll_members(ms, seen, lambda: len(seen) >= 900, 90, "phase 3")
    end = time.monotonic() + 2
    poll_members(ms, seen, lambda: time.monotonic() > end, 10, "drain")
    assert sorted(seen) == list(range(900))
    dups = {v: who for v, who in seen.items() if len(who) > 1}
    assert not dups, f"consumed more than once: {dict(list(dups.items())[:10])}"
    assert {w for v, who in seen.items() if v >= 600 for w in who} == {"m0", "m2", "m3"}
    for m in ms:
        m.c.close()
    broker.assert_no_panic()


# ---------------------------------------------------------------------------
# static membership: a restart within the session timeout rebalances nothing
# ---------------------------------------------------------------------------


def describe(a, group: str):
    return a.describe_consumer_groups([group])[group].result(timeout=30)


def test_static_member_restart_within_session_timeout_causes_no_rebalance(broker, topic_name):
    from confluent_kafka.admin import AdminClient

    create_topic(broker.bootstrap, topic_name, 4)
    group = f"static-{uuid.uuid4().hex[:8]}"
    conf = {"session.timeout.ms": 20000}
    a_ = Member(broker.bootstrap, group, topic_name, "a", **{"group.instance.id": "inst-a"}, **conf)
    b_ = Member(broker.bootstrap, group, topic_name, "b", **{"group.instance.id": "inst-b"}, **conf)
    seen: dict[int, list[str]] = {}
    poll_members([a_, b_], seen, lambda: len(a_.owned()) == 2 and len(b_.owned()) == 2, 60,
                 "two balanced static members")
    admin_ = AdminClient(client_conf(broker.bootstrap))
    wait_until(lambda: "STABLE" in str(describe(admin_, group).state), 30, what="stable")
    d0 = describe(admin_, group)
    by_inst0 = {m.group_instance_id: (m.member_id, sorted(p.partition for p in
                                                          m.assignment.topic_partitions))
                for m in d0.members}
    assert set(by_inst0) == {"inst-a", "inst-b"}, d0
    owned_a = a_.owned()
    b_.events.clear()

    # Restart a: a static member's close sends no LeaveGroup, and it
    # rejoins with the same instance id well within the session timeout.
    a_.c.close()
    a2 = Member(broker.bootstrap, group, topic_name, "a2", **{"group.instance.id": "inst-a"},
                **conf)
    poll_members([a2, b_], seen, lambda: a2.owned() == owned_a, 30,
                 "the restarted member to get its old partitions back")
    # b saw no rebalance: no revoke, no new assignment.
    t_end = time.monotonic() + 3
    poll_members([a2, b_], seen, lambda: time.monotonic() > t_end, 10, "quiet period")
    assert b_.events == [], f"b rebalanced: {b_.events}"
    d1 = describe(admin_, group)
    assert "STABLE" in str(d1.state), d1.state
    by_inst1 = {m.group_instance_id: (m.member_id, sorted(p.partition for p in
                                                          m.assignment.topic_partitions))
                for m in d1.members}
    # Same members, same assignment; a got a new member id (Kafka replaces
    # the static member's id), b kept its own: the generation is unchanged,
    # else b's id-and-generation commit below would be refused.
    assert by_inst1["inst-b"] == by_inst0["inst-b"]
    assert by_inst1["inst-a"][1] == by_inst0["inst-a"][1]
    produce(broker.bootstrap, topic_name, 40, 4)
    poll_members([a2, b_], seen, lambda: len(seen) >= 40, 60, "consumption after the restart")
    assert b_.events == [], f"b rebalanced: {b_.events}"
    a2.c.close()
    b_.c.close()
    broker.assert_no_panic()


# ---------------------------------------------------------------------------
# a commit storm does not hold up an unrelated partition's produce and fetch
# ---------------------------------------------------------------------------
OFFSET_COMMIT = 8


def offset_commit_v2(cid: int, group: str, topic: str, partition: int, offset: int) -> bytes:
    body = (w.string(group) + w.i32(-1) + w.string("") + w.i64(-1)
            + w.i32(1) + w.string(topic) + w.i32(1)
            + w.i32(partition) + w.i64(offset) + w.string(None))
    return w.request_header(OFFSET_COMMIT, 2, cid) + body


def storm_worker(addr, topic: str, groups: list[str], stop, counts, idx: int) -> None:
    """Pipelined standalone commits (16 in flight per group's connection)
    until `stop` is set; the acknowledged count goes to counts[idx]."""
    import select
    socks = [w.connect(tuple(addr)) for _ in groups]
    done, bad, offset = 0, 0, 0
    inflight = [0] * len(groups)
    while not stop.is_set():
        for i, (s, g) in enumerate(zip(socks, groups)):
            while inflight[i] < 16:
                offset += 1
                s.sendall(w.frame(offset_commit_v2(offset, g, topic, offset % 4, offset)))
                inflight[i] += 1
        ready, _, _ = select.select(socks, [], [], 1.0)
        for s in ready:
            i = socks.index(s)
            resp = w.recv_frame(s)
            r = w.Reader(resp)
            r.i32()  # correlation id
            r.i32()  # topics
            r.string()
            r.i32()  # partitions
            r.i32()
            if r.i16() != 0:
                bad += 1
            done += 1
            inflight[i] -= 1
        # Published as it goes, so the test can wait for the storm to start.
        counts[idx] = done if bad == 0 else -bad
    counts[idx] = done if bad == 0 else -bad
    for s in socks:
        s.close()


def produce_fetch_latencies(broker, topic: str, n: int) -> list[float]:
    """Round trips of n produce (acks=all) and n fetch requests, each on
    its own persistent connection, in seconds."""
    out = []
    batch = w.record_batch_v2([w.Rec(value=b"q")])
    with w.connect(broker.addr) as ps, w.connect(broker.addr) as fs:
        for i in range(n):
            t = time.perf_counter()
            _, [res] = w.parse_produce_response_v3(
                w.roundtrip(ps, w.produce_request_v3(i, topic, 0, batch)))
            out.append(time.perf_counter() - t)
            assert res.error_code == 0, res
            t = time.perf_counter()
            w.parse_fetch_response(w.roundtrip(fs, w.fetch_request(i, 4, topic, 0, res.base_offset)), 4)
            out.append(time.perf_counter() - t)
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def test_commit_storm_leaves_unrelated_produce_and_fetch_latency_bounded(broker, topic_name):
    quiet = topic_name + "-quiet"
    storm_topic = topic_name + "-storm"
    create_topic(broker.bootstrap, quiet, 1)
    create_topic(broker.bootstrap, storm_topic, 4)
    produce_fetch_latencies(broker, quiet, 20)  # warm up connections and caches
    base = produce_fetch_latencies(broker, quiet, 150)

    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    workers = 3
    counts = ctx.Array("q", workers)
    procs = [ctx.Process(target=storm_worker,
                         args=(list(broker.addr), storm_topic,
                               [f"storm-{k}-{g}" for g in range(10)], stop, counts, k))
             for k in range(workers)]
    for p in procs:
        p.start()
    try:
        # Spawned interpreters take seconds to start on a loaded machine:
        # measure only once every worker has commits answered.
        wait_until(lambda: all(c != 0 for c in counts), 60, what="every storm worker committing")
        time.sleep(1.0)  # the storm is on
        t0 = time.monotonic()
        during = produce_fetch_latencies(broker, quiet, 150)
        storm_s = time.monotonic() - t0
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=30)
    commits = list(counts)
    assert all(c > 0 for c in commits), f"commits failed or none made: {commits}"
    rate = sum(commits) / (storm_s + 1.0)
    b50, b99, d50, d99 = pct(base, .5), pct(base, .99), pct(during, .5), pct(during, .99)
    print(f"baseline p50={b50 * 1e3:.2f}ms p99={b99 * 1e3:.2f}ms; during a storm of "
          f"~{rate:.0f} commits/s over 30 groups: p50={d50 * 1e3:.2f}ms p99={d99 * 1e3:.2f}ms")
    # Generous bounds against the baseline of the same run: the machine is
    # shared (the storm's own processes take CPU from the broker), so the
    # check is "not held up behind the commits", not "as fast".
    assert d50 <= 10 * b50 + 0.05, (b50, d50)
    assert d99 <= 10 * b99 + 0.5, (b99, d99)
    broker.assert_no_panic()
