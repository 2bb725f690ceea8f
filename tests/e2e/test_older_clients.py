"""Clients older than Kafka 4 (issue 27 item 5).

Kafka 4.0 removed the request versions KIP-896 deprecated; kaas serves the
cheap ones again: OffsetCommit v0-1, OffsetFetch v0, DescribeConfigs v0 and
CreateTopics v0-1. sarama 1.x commits
with OffsetCommit v1 whatever its configured version, and before this change
kaas closed the connection on it: the user saw `EOF` and a restarted
consumer re-read everything.

A version kaas still refuses is answered with UNSUPPORTED_VERSION (35) in
the response where the crate can encode that version's response, and the
connection stays open; below that (Produce v0-2: message format v0/v1) the
connection closes, as Kafka closes it for every refused version. The broker
names each refused (client id, client software) once in a WARN line.

The sarama tests build tests/clients/sarama with Debian's
golang-github-shopify-sarama-dev 1.22 (GOPATH mode) and skip only when `go`
is not installed.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import kafka_wire as kw
from conftest import assert_healthy, create_topic, producer_conf

ROOT = Path(__file__).resolve().parents[2]
SARAMA_SRC = ROOT / "tests" / "clients" / "sarama" / "main.go"
GOPATH = "/usr/share/gocode"

OFFSET_COMMIT = 8
OFFSET_FETCH = 9
ILLEGAL_GENERATION = 22
DESCRIBE_CONFIGS = 32
CREATE_TOPICS = 19
TOPIC_ALREADY_EXISTS = 36
TOPIC_RESOURCE = 2

# Apis whose crate (kafka-protocol 0.18) range reaches past what kaas may
# advertise, with a request body at that one version above: the refused
# version the test sends is the first of these kaas still does not serve.
# (api key, crate max, body at crate max, response parser -> error code)


def _describe_cluster_v2() -> bytes:
    # include_cluster_authorized_operations, endpoint_type (v1+),
    # include_fenced_brokers (v2+), tags
    return kw.i8(0) + kw.i8(1) + kw.i8(0) + kw.TAGS_NONE


def _list_transactions_v2() -> bytes:
    # state_filters, producer_id_filters, duration_filter (v1+),
    # transactional_id_pattern (v2+), tags
    return (kw.compact_array([]) + kw.compact_array([]) + kw.i64(-1)
            + kw.compact_string(None) + kw.TAGS_NONE)


def _alter_reassignments_v1() -> bytes:
    # timeout_ms, allow_replication_factor_change (v1+), topics, tags
    return kw.i32(30000) + kw.i8(1) + kw.compact_array([]) + kw.TAGS_NONE


def _code_after_throttle(r: kw.Reader) -> int:
    r.i32()  # throttle_time_ms
    return r.i16()


def _code_after_throttle_and_flag(r: kw.Reader) -> int:
    r.i32()  # throttle_time_ms
    r.i8()  # allow_replication_factor_change
    return r.i16()


REFUSABLE = [
    (60, 2, _describe_cluster_v2, _code_after_throttle),
    (66, 2, _list_transactions_v2, _code_after_throttle),
    (45, 1, _alter_reassignments_v1, _code_after_throttle_and_flag),
]


def offset_commit_v0(cid: int, group: str, topic: str, partition: int, offset: int,
                     client_id: str = "kaas-e2e") -> bytes:
    part = kw.i32(partition) + kw.i64(offset) + kw.string("v0")
    return (kw.request_header(OFFSET_COMMIT, 0, cid, client_id) + kw.string(group)
            + kw.i32(1) + kw.string(topic) + kw.i32(1) + part)


def offset_commit_v1(cid: int, group: str, topic: str, partition: int, offset: int,
                     generation: int = -1, member: str = "",
                     timestamp: int = -1) -> bytes:
    part = kw.i32(partition) + kw.i64(offset) + kw.i64(timestamp) + kw.string("v1")
    return (kw.request_header(OFFSET_COMMIT, 1, cid) + kw.string(group) + kw.i32(generation)
            + kw.string(member) + kw.i32(1) + kw.string(topic) + kw.i32(1) + part)


def parse_offset_commit_v0(resp: bytes) -> dict[tuple[str, int], int]:
    """OffsetCommit v0-v2 response: no throttle time, codes per partition."""
    r = kw.Reader(resp)
    r.i32()  # correlation id
    out = {}
    for _ in range(r.i32()):
        t = r.string()
        for _ in range(r.i32()):
            p = r.i32()
            out[(t, p)] = r.i16()
    assert r.remaining() == 0
    return out


def offset_fetch_v0(cid: int, group: str, topic: str, partitions: list[int]) -> bytes:
    return (kw.request_header(OFFSET_FETCH, 0, cid) + kw.string(group) + kw.i32(1)
            + kw.string(topic) + kw.i32(len(partitions))
            + b"".join(kw.i32(p) for p in partitions))


def parse_offset_fetch_v0(resp: bytes) -> dict[tuple[str, int], tuple[int, str | None, int]]:
    """OffsetFetch v0/v1 response: (offset, metadata, error) per partition,
    no top-level error code."""
    r = kw.Reader(resp)
    r.i32()
    out = {}
    for _ in range(r.i32()):
        t = r.string()
        for _ in range(r.i32()):
            p = r.i32()
            out[(t, p)] = (r.i64(), r.string(), r.i16())
    assert r.remaining() == 0
    return out


def test_offset_commit_v0_v1_and_offset_fetch_v0_round_trip(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 2)
    group = f"g-{topic_name}"
    with kw.connect(broker.addr) as s:
        # Nothing committed yet: -1, per partition (v0 has no top-level code).
        got = parse_offset_fetch_v0(kw.roundtrip(s, offset_fetch_v0(1, group, topic_name, [0])))
        assert got == {(topic_name, 0): (-1, "", kw.NONE)}, got

        got = parse_offset_commit_v0(kw.roundtrip(
            s, offset_commit_v0(2, group, topic_name, 0, 17)))
        assert got == {(topic_name, 0): kw.NONE}, got
        # v1 as sarama sends it: generation -1, no member, timestamp -1.
        got = parse_offset_commit_v0(kw.roundtrip(
            s, offset_commit_v1(3, group, topic_name, 1, 23)))
        assert got == {(topic_name, 1): kw.NONE}, got

        got = parse_offset_fetch_v0(kw.roundtrip(
            s, offset_fetch_v0(4, group, topic_name, [0, 1])))
        assert got == {(topic_name, 0): (17, "v0", kw.NONE),
                       (topic_name, 1): (23, "v1", kw.NONE)}, got

        # A v1 with a generation for a group that does not exist: Kafka's
        # ILLEGAL_GENERATION below v9 (OffsetMetadataManager
        # .validateOffsetCommit), and nothing stored.
        other = f"{group}-managed"
        got = parse_offset_commit_v0(kw.roundtrip(
            s, offset_commit_v1(5, other, topic_name, 0, 99, generation=1, member="ghost")))
        assert got == {(topic_name, 0): ILLEGAL_GENERATION}, got
        got = parse_offset_fetch_v0(kw.roundtrip(s, offset_fetch_v0(6, other, topic_name, [0])))
        assert got == {(topic_name, 0): (-1, "", kw.NONE)}, got

    # The same offsets through a current client's OffsetFetch.
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                  "broker.address.family": "v4"})
    try:
        committed = c.committed([TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)],
                                timeout=30)
        assert [tp.offset for tp in committed] == [17, 23], committed
    finally:
        c.close()


def _refusable_version(broker) -> tuple[int, int, bytes, object]:
    table = kw.api_versions(broker.addr).api_keys
    for key, crate_max, body, parse in REFUSABLE:
        lo_hi = table.get(key)
        if lo_hi is not None and lo_hi[1] < crate_max:
            return key, crate_max, body(), parse
    pytest.skip("every api in REFUSABLE is now served up to the crate's version: "
                "no version left that kaas refuses but can answer")


def test_refused_version_is_answered_unsupported_version(broker):
    key, version, body, parse = _refusable_version(broker)
    client_id = "refuse-e2e"
    with kw.connect(broker.addr) as s:
        # KIP-511: the software name the broker's log line names.
        av3 = (kw.request_header(kw.API_VERSIONS, 3, 1, client_id, flexible=True)
               + kw.compact_string("kaas-e2e-wire") + kw.compact_string("1.0") + kw.TAGS_NONE)
        s.sendall(kw.frame(av3))
        kw.recv_frame(s)
        for cid in (2, 3):
            resp = kw.roundtrip(s, kw.request_header(key, version, cid, client_id, flexible=True)
                                + body)
            r = kw.Reader(resp)
            assert r.i32() == cid
            r.uvarint()  # response header tags (flexible)
            assert parse(r) == kw.UNSUPPORTED_VERSION, (key, version)
        # Still open: the next request is served.
        av = kw.parse_api_versions_v0(kw.roundtrip(s, kw.api_versions_request(4, 0)))
        assert (av.correlation_id, av.error_code) == (4, kw.NONE)

    # Below the crate's range (Produce v2: message format v0/v1) there is
    # no response to encode: the connection closes, as Kafka closes it.
    # Twice, on connections that sent no ApiVersions (software unknown).
    for cid in (5, 6):
        with kw.connect(broker.addr) as s:
            produce_v2 = (kw.request_header(kw.PRODUCE, 2, cid, client_id) + kw.i16(1)
                          + kw.i32(1000) + kw.i32(0))
            s.sendall(kw.frame(produce_v2))
            assert kw.wait_closed(s, 10) is not None

    # One WARN per (client id, software), however many refusals.
    lines = [line for line in broker.log_path.read_text(errors="replace").splitlines()
             if "request version not served" in line and f'"{client_id}"' in line
             and "WARN" in line]
    assert len(lines) == 2, lines
    assert 'client_software="kaas-e2e-wire/1.0"' in lines[0], lines
    assert 'client_software="unknown"' in lines[1] and "api=Produce" in lines[1], lines
    assert_healthy(broker)


def test_describe_configs_v0(broker, topic_name):
    """sarama 1.x's ClusterAdmin (ListTopics, DescribeConfig) sends v0
    whatever its configured version."""
    create_topic(broker.bootstrap, topic_name, 1, config={"retention.ms": "1234567"})
    req = (kw.request_header(DESCRIBE_CONFIGS, 0, 1) + kw.i32(1) + kw.i8(TOPIC_RESOURCE)
           + kw.string(topic_name) + kw.i32(-1))
    with kw.connect(broker.addr) as s:
        r = kw.Reader(kw.roundtrip(s, req))
    assert r.i32() == 1
    r.i32()  # throttle
    assert r.i32() == 1
    err, _msg, rtype, rname = r.i16(), r.string(), r.i8(), r.string()
    assert (err, rtype, rname) == (kw.NONE, TOPIC_RESOURCE, topic_name)
    configs = {}
    for _ in range(r.i32()):
        name, value, _read_only, is_default, _sensitive = (
            r.string(), r.string(), r.i8(), r.i8(), r.i8())
        configs[name] = (value, bool(is_default))
    assert r.remaining() == 0
    assert configs["retention.ms"] == ("1234567", False), configs
    assert configs["cleanup.policy"] == ("delete", True), configs


def _create_topics(cid: int, version: int, name: str, validate_only: bool) -> bytes:
    topic = (kw.string(name) + kw.i32(2) + kw.i16(1) + kw.i32(0)  # no assignments
             + kw.i32(0))  # no configs
    body = kw.i32(1) + topic + kw.i32(30000)
    if version >= 1:
        body += kw.i8(1 if validate_only else 0)
    return kw.request_header(CREATE_TOPICS, version, cid) + body


def test_create_topics_v0_v1(broker, topic_name):
    """CreateTopics v1 is what sarama configured for 0.11.x sends; v0 has
    no validate_only and answers without an error message."""
    with kw.connect(broker.addr) as s:
        # v1 validate_only: checked, nothing created.
        r = kw.Reader(kw.roundtrip(s, _create_topics(1, 1, topic_name, True)))
        assert r.i32() == 1
        assert r.i32() == 1
        assert (r.string(), r.i16()) == (topic_name, kw.NONE)
        r.string()  # error message
        assert r.remaining() == 0
        # v0: created.
        r = kw.Reader(kw.roundtrip(s, _create_topics(2, 0, topic_name, False)))
        assert r.i32() == 2
        assert r.i32() == 1
        assert (r.string(), r.i16()) == (topic_name, kw.NONE)
        assert r.remaining() == 0
        # v1 again: it exists (TOPIC_ALREADY_EXISTS) with a message.
        r = kw.Reader(kw.roundtrip(s, _create_topics(3, 1, topic_name, False)))
        assert r.i32() == 3
        assert r.i32() == 1
        name, code, msg = r.string(), r.i16(), r.string()
        assert (name, code) == (topic_name, TOPIC_ALREADY_EXISTS) and msg, (name, code, msg)
    from conftest import wait_topic_ready
    wait_topic_ready(broker.bootstrap, topic_name, 2)


@pytest.fixture(scope="session")
def sarama_bin(tmp_path_factory) -> Path:
    go = shutil.which("go")
    if go is None:
        pytest.skip("go is not installed (apt-get install golang-go "
                    "golang-github-shopify-sarama-dev)")
    out = tmp_path_factory.mktemp("sarama") / "sarama-e2e"
    env = dict(os.environ, GOPATH=GOPATH, GO111MODULE="off", GOFLAGS="")
    env.setdefault("GOCACHE", str(tmp_path_factory.getbasetemp() / "go-cache"))
    r = subprocess.run([go, "build", "-o", str(out), str(SARAMA_SRC)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"go build failed (is golang-github-shopify-sarama-dev " \
                              f"installed?)\n{r.stdout}\n{r.stderr}"
    return out


def run_sarama(binary: Path, broker, topic: str, group: str, mode: str, n: int) -> dict:
    r = subprocess.run([str(binary), "-brokers", broker.bootstrap, "-topic", topic,
                        "-group", group, "-mode", mode, "-max", str(n), "-idle", "15s", "-v"],
                       capture_output=True, text=True, timeout=100)
    assert r.returncode == 0, f"sarama {mode} exited {r.returncode}\n{r.stdout}\n" \
                              f"{r.stderr[-4000:]}\n{broker.log_tail()}"
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["offset-manager", "group"])
def test_sarama_122_resumes_where_it_committed(broker, topic_name, sarama_bin, mode):
    from confluent_kafka import Producer
    create_topic(broker.bootstrap, topic_name, 1)
    p = Producer(producer_conf(broker.bootstrap))
    for i in range(50):
        p.produce(topic_name, value=b"r%d" % i, partition=0)
    assert p.flush(30) == 0
    group = f"sarama-{mode}-{topic_name}"

    first = run_sarama(sarama_bin, broker, topic_name, group, mode, 30)
    assert (first["first"], first["count"], first["commit_errors"]) == (0, 30, []), first
    # Restarted: from the committed offset, nothing re-read.
    second = run_sarama(sarama_bin, broker, topic_name, group, mode, 20)
    assert (second["first"], second["count"], second["commit_errors"]) == (30, 20, []), second
    assert_healthy(broker)
