"""Declared limits (issue 13): a request that asks for more than the broker
declares it serves is refused with the Kafka error code, before it touches
the volume, and the broker keeps serving everyone else.

* CreateTopics / CreatePartitions: partitions per request
  (--max-partitions-per-request), per live broker (--max-partitions-per-broker)
  and in the cluster (--max-partitions) -> POLICY_VIOLATION (44);
* the partition mutation rate (--controller-mutation-rate, KIP-599) ->
  THROTTLING_QUOTA_EXCEEDED (89) with throttle_time_ms from CreateTopics v6,
  CreatePartitions v3 and DeleteTopics v5; older versions are served and then
  held for the throttle time;
* Metadata auto-creation: per request (--max-auto-create-per-request) and per
  second (--auto-create-per-sec) -> LEADER_NOT_AVAILABLE (5), not created;
* partition opens: at most 16 at once, waiting for a slot without holding a
  thread (issue 30), so a big create does not grow the thread count; a
  produce to a partition still opening is answered within a second.
"""

import struct
import time

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

import kafka_wire as kw
from conftest import admin, assert_healthy, client_conf, create_topic, produce_and_check

POLICY_VIOLATION = 44
LEADER_NOT_AVAILABLE = 5
THROTTLING_QUOTA_EXCEEDED = 89
KAFKA_STORAGE_ERROR = 56


def create_codes(bootstrap, topics, timeout=30.0):
    """{name: Kafka error code} of one CreateTopics request."""
    a = admin(bootstrap)
    fs = a.create_topics([NewTopic(n, num_partitions=p, replication_factor=1) for n, p in topics],
                         operation_timeout=timeout, request_timeout=timeout)
    out = {}
    for name, f in fs.items():
        e = f.exception(timeout=timeout)
        out[name] = 0 if e is None else e.args[0].code()
    return out


def metadata_v4(addr, topics, allow_auto_create=True):
    """{name: error code} of a Metadata v4 request for `topics`."""
    body = kw.i32(len(topics)) + b"".join(kw.string(t) for t in topics)
    body += struct.pack(">b", 1 if allow_auto_create else 0)
    with kw.connect(addr, timeout=60) as s:
        r = kw.Reader(kw.roundtrip(s, kw.request_header(3, 4, 7) + body))
    assert r.i32() == 7  # correlation id
    r.i32()  # throttle
    for _ in range(r.i32()):  # brokers
        r.i32(), r.string(), r.i32(), r.string()
    r.string()  # cluster id
    r.i32()  # controller
    out = {}
    for _ in range(r.i32()):
        code, name = r.i16(), r.string()
        r.i8()  # internal
        for _ in range(r.i32()):
            r.i16(), r.i32(), r.i32(), r.i32()
            for _ in range(r.i32()):
                r.i32()
            for _ in range(r.i32()):
                r.i32()
        out[name] = code
    return out


def test_100000_partitions_in_one_request_is_a_policy_violation(broker, topic_name):
    codes = create_codes(broker.bootstrap, [(topic_name, 100_000)])
    assert codes[topic_name] == POLICY_VIOLATION == KafkaError.POLICY_VIOLATION
    assert not broker.topic_dir(topic_name).exists()
    assert_healthy(broker)


def test_partitions_per_request_count_every_topic(broker_factory, topic_name):
    b = broker_factory(["--max-partitions-per-request", "5"])
    codes = create_codes(b.bootstrap, [(topic_name + "-a", 3), (topic_name + "-b", 3)])
    assert sorted(codes.values()) == [0, POLICY_VIOLATION], codes
    refused = [n for n, c in codes.items() if c]
    assert not b.topic_dir(refused[0]).exists()
    assert_healthy(b)


def test_cluster_partition_limit(broker_factory, topic_name):
    b = broker_factory(["--max-partitions", "10"])
    create_topic(b.bootstrap, topic_name + "-a", 8)
    assert create_codes(b.bootstrap, [(topic_name + "-b", 3)]) == {topic_name + "-b": POLICY_VIOLATION}
    assert not b.topic_dir(topic_name + "-b").exists()
    assert create_codes(b.bootstrap, [(topic_name + "-c", 2)]) == {topic_name + "-c": 0}
    # Auto-creation is held to the same limit: deferred, not created.
    assert metadata_v4(b.addr, [topic_name + "-d"]) == {topic_name + "-d": LEADER_NOT_AVAILABLE}
    assert not b.topic_dir(topic_name + "-d").exists()
    # Existing topics are served as before (no new topic fits).
    produce_and_check(b.bootstrap, topic_name + "-a")
    b.assert_no_panic()


def test_auto_create_is_capped_per_request(broker_factory, topic_name):
    b = broker_factory(["--max-auto-create-per-request", "3"])
    names = [f"{topic_name}-{i}" for i in range(5)]
    codes = metadata_v4(b.addr, names)
    created = [n for n in names if b.topic_dir(n).exists()]
    assert len(created) == 3, (codes, created)
    for n in names:
        if n not in created:
            assert codes[n] == LEADER_NOT_AVAILABLE, codes
    # The deferred ones are created when asked again.
    codes = metadata_v4(b.addr, names)
    assert all(b.topic_dir(n).exists() for n in names), codes
    assert_healthy(b)


def test_auto_create_is_rate_limited(broker_factory, topic_name):
    # 0.05 per second: a burst of one, then nothing for 20 s.
    b = broker_factory(["--auto-create-per-sec", "0.05"])
    names = [f"{topic_name}-{i}" for i in range(4)]
    codes = metadata_v4(b.addr, names)
    created = [n for n in names if b.topic_dir(n).exists()]
    assert len(created) == 1, (codes, created)
    assert [codes[n] for n in names if n not in created] == [LEADER_NOT_AVAILABLE] * 3, codes
    # A client that does not allow auto-creation still gets UNKNOWN_TOPIC.
    assert metadata_v4(b.addr, [topic_name + "-x"], allow_auto_create=False) == {topic_name + "-x": 3}
    assert_healthy(b)


def test_repeated_bad_requests_are_logged_once_per_interval_and_named(broker):
    for _ in range(20):
        with kw.connect(broker.addr) as s:
            s.sendall(struct.pack(">i", -5) + b"\x00" * 8)
            assert kw.wait_closed(s, 10) is not None
    # ShareGroupHeartbeat (key 76, KIP-932) is not served: closed, and
    # named in the log.
    for _ in range(5):
        with kw.connect(broker.addr) as s:
            s.sendall(kw.frame(kw.request_header(76, 1, 1) + kw.string("group")))
            assert kw.wait_closed(s, 10) is not None
    log = broker.log_text()
    assert log.count("bad frame") == 1, broker.log_tail()
    assert log.count("unserviceable request") == 1, broker.log_tail()
    assert "api=ShareGroupHeartbeat" in log, broker.log_tail()
    assert_healthy(broker)


def test_every_topic_create_and_delete_is_logged_at_info(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 2)
    a = admin(broker.bootstrap)
    a.delete_topics([topic_name], operation_timeout=30)[topic_name].result(30)
    import time
    deadline = time.monotonic() + 20
    while "topic deleted" not in broker.log_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    log = broker.log_text()
    created = [ln for ln in log.splitlines() if "topic created" in ln and topic_name in ln]
    assert created and "INFO" in created[0] and "partitions=2" in created[0], broker.log_tail()
    deleted = [ln for ln in log.splitlines() if "topic deleted" in ln and topic_name in ln]
    assert deleted and "INFO" in deleted[0], broker.log_tail()


def test_partitions_per_broker_bound_the_cluster(broker_factory, topic_name):
    # One live broker, 10 partitions each: the cluster holds 10 at most.
    b = broker_factory(["--max-partitions-per-broker", "10"])
    create_topic(b.bootstrap, topic_name + "-a", 8)
    assert create_codes(b.bootstrap, [(topic_name + "-b", 3)]) == {topic_name + "-b": POLICY_VIOLATION}
    assert not b.topic_dir(topic_name + "-b").exists()
    # CreatePartitions is held to the same bound.
    a = admin(b.bootstrap)
    f = a.create_partitions([NewPartitions(topic_name + "-a", 11)], operation_timeout=30,
                            request_timeout=30)[topic_name + "-a"]
    e = f.exception(timeout=30)
    assert e is not None and e.args[0].code() == POLICY_VIOLATION, e
    assert "--max-partitions-per-broker" in e.args[0].str(), e
    assert create_codes(b.bootstrap, [(topic_name + "-c", 2)]) == {topic_name + "-c": 0}
    produce_and_check(b.bootstrap, topic_name + "-a")
    b.assert_no_panic()


def create_topics_v7(addr, topics, correlation_id=11):
    """(throttle_time_ms, {name: error code}) of one CreateTopics v7
    request (flexible, the version with THROTTLING_QUOTA_EXCEEDED)."""
    body = kw.compact_array([
        kw.compact_string(n) + kw.i32(p) + kw.i16(1) + kw.compact_array([]) + kw.compact_array([]) + b"\x00"
        for n, p in topics])
    body += kw.i32(30_000) + b"\x00" + b"\x00"  # timeout, validate_only, tags
    header = kw.i16(19) + kw.i16(7) + kw.i32(correlation_id) + kw.string("limits-test") + b"\x00"
    with kw.connect(addr, timeout=60) as s:
        r = kw.Reader(kw.roundtrip(s, header + body))
    assert r.i32() == correlation_id
    r.skip_tags()
    throttle = r.i32()
    out = {}
    for _ in range(r.compact_array_len()):
        name = r.compact_string()
        r.take(16)  # topic id
        code = r.i16()
        r.compact_string()  # message
        r.i32(), r.i16()  # partitions, replication factor
        for _ in range(r.compact_array_len()):  # configs
            r.compact_string(), r.compact_string(), r.i8(), r.i8(), r.i8()
            r.skip_tags()
        r.skip_tags()
        out[name] = code
    return throttle, out


def test_partition_mutation_rate_is_throttled(broker_factory, topic_name):
    # 2 partition mutations per second: a burst of 22.
    b = broker_factory(["--controller-mutation-rate", "2"])
    throttle, codes = create_topics_v7(b.addr, [(topic_name + "-a", 20), (topic_name + "-b", 10),
                                                (topic_name + "-c", 1)])
    # -a fits the burst; -b is admitted with credit left and overdraws it
    # (to -8: 4 s); -c is refused while in debt, and the answer says how
    # long to back off.
    assert codes == {topic_name + "-a": 0, topic_name + "-b": 0,
                     topic_name + "-c": THROTTLING_QUOTA_EXCEEDED}, codes
    assert 3_000 <= throttle <= 4_000, throttle
    assert not b.topic_dir(topic_name + "-c").exists()
    # Once the debt is repaid, creation goes on.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        _, codes = create_topics_v7(b.addr, [(topic_name + "-d", 30)])
        if codes[topic_name + "-d"] != THROTTLING_QUOTA_EXCEEDED:
            break
        time.sleep(0.5)
    assert codes == {topic_name + "-d": 0}, codes
    # In debt again (-30: 15 s). confluent-kafka (librdkafka 2.16) sends
    # CreateTopics v4, older than THROTTLING_QUOTA_EXCEEDED: its topic is
    # created and answered at once with throttle_time_ms, and then its
    # connection is muted for that long (as Kafka mutes the channel).
    throttles = []
    a = AdminClient(client_conf(b.bootstrap, **{"socket.timeout.ms": 60000,
                                                "throttle_cb": lambda ev: throttles.append(ev.throttle_time)}))
    t0 = time.monotonic()
    f = a.create_topics([NewTopic(topic_name + "-e", 1, 1)], operation_timeout=60,
                        request_timeout=60)[topic_name + "-e"]
    assert f.exception(timeout=60) is None
    answered = time.monotonic() - t0
    assert answered < 5, answered
    assert b.topic_dir(topic_name + "-e").exists()
    deadline = time.monotonic() + 10
    while not throttles and time.monotonic() < deadline:
        a.poll(0.2)
    assert throttles and 10 <= throttles[0] <= 16, throttles
    # The next request on that connection waits out the mute.
    t1 = time.monotonic()
    a.list_topics(timeout=60)
    assert time.monotonic() - t1 >= 8, time.monotonic() - t1
    assert_healthy(b)


def opened_new(broker) -> int:
    """New partitions the broker says it opened (its summary lines)."""
    import re
    return sum(int(m) for m in re.findall(r"new partitions opened \(empty, first epoch\) partitions=(\d+)",
                                           broker.log_text()))


def test_opening_many_partitions_at_once_holds_a_bounded_number_of_threads(broker, topic_name):
    """1,000 partitions created in one request open through 16 open slots,
    each taken before the open gets a blocking-pool thread: the broker's
    threads stay bounded while they open (10,000 partitions held 1,037
    threads when every waiting open parked a pool thread, each arbiter's
    pool growing toward its cap), and every partition is served."""
    import threading
    n = 1000
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            try:
                with open(f"/proc/{broker.proc.pid}/status") as f:
                    for line in f:
                        if line.startswith("Threads:"):
                            peak[0] = max(peak[0], int(line.split()[1]))
            except FileNotFoundError:
                return
            time.sleep(0.01)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        assert create_codes(broker.bootstrap, [(topic_name, n)], timeout=60) == {topic_name: 0}
        deadline = time.monotonic() + 90
        while opened_new(broker) < n:
            assert time.monotonic() < deadline, f"{opened_new(broker)} of {n} partitions opened"
            time.sleep(0.2)
    finally:
        done.set()
        t.join(5)
    assert peak[0] <= 150, f"{peak[0]} threads while {n} partitions opened"
    # Summarised (issue 30: one INFO line per new partition before): a
    # line every 2 s with the count, none per partition.
    per_partition = broker.log_text().count(f"partition leader open topic={topic_name}")
    assert per_partition == 0, f"{per_partition} INFO lines, one per new partition"
    produce_and_check(broker.bootstrap, topic_name)
    assert_healthy(broker)


@pytest.mark.broker_args("--max-partitions-per-broker", "10100")
def test_a_produce_to_a_partition_still_opening_is_answered_within_a_second(broker, topic_name):
    """10,000 partitions in one CreateTopics: the answer comes before their
    leaders are open (they open through 16 slots, a few seconds in all).
    A produce sent right after it to partitions that are still opening is
    answered within a second — written, or refused KAFKA_STORAGE_ERROR
    (retriable, never applied) once it waited PARK_MAX (500 ms) — and not
    held until its partition opens (up to 18 s before). Each is retried
    until written, and every partition ends up open."""
    n = 10_000
    assert create_codes(broker.bootstrap, [(topic_name, n)], timeout=60) == {topic_name: 0}
    returned = time.monotonic()
    answered = []
    first_after_create = None
    for p in (n - 1, n - 2, n // 2, 1):
        t0 = time.monotonic()
        r = kw.produce_raw(broker.addr, topic_name, p, kw.record_batch_v2([kw.Rec(b"v%d" % p)]))
        now = time.monotonic()
        first_after_create = first_after_create or now - returned
        answered.append((p, r.error_code, round(now - t0, 3)))
    assert all(code in (0, KAFKA_STORAGE_ERROR) for _, code, _ in answered), answered
    # Measured here: the first answer 0.72-0.76 s after CreateTopics
    # returned (its connection is accepted while 16 opens run), the others
    # PARK_MAX (0.50-0.52 s) or at once. The bound leaves room for a busy
    # CI machine and still fails a write held until its partition opens.
    assert all(dt < 1.5 for _, _, dt in answered), answered
    assert first_after_create < 1.5, (first_after_create, answered)
    print("answered (partition, code, seconds):", answered, "first", round(first_after_create, 3))
    # Retried, each is written once its partition is open.
    deadline = time.monotonic() + 90
    for p, code, _ in answered:
        while code != 0:
            assert time.monotonic() < deadline, f"partition {p} never took the write"
            time.sleep(0.2)
            code = kw.produce_raw(broker.addr, topic_name, p, kw.record_batch_v2([kw.Rec(b"v%d" % p)])).error_code
            assert code in (0, KAFKA_STORAGE_ERROR), code
    while opened_new(broker) < n:
        assert time.monotonic() < deadline, f"{opened_new(broker)} of {n} partitions opened"
        time.sleep(0.2)
    assert_healthy(broker)
