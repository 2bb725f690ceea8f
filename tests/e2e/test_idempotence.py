"""Idempotent producers: sequence numbers are checked by the partition
leader, a retried batch is answered with the original offset and stored
once, gaps and stale epochs are refused with Kafka's codes, the state
survives kill -9 and takeover (snapshot + log tail), and producer ids are
never reissued after every broker restarts.

Raw-protocol tests (kafka_wire) pin the exact answers; confluent-kafka
(librdkafka 2.16) and kafka-python run the real clients' idempotence
through kill -9 of partition leaders.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

import kafka_wire as kw
from cluster import FAST, bootstrap, create_everywhere, read_settled, wait_leaders
from conftest import consume_all, create_topic, producer_conf, wait_until


def idem_batch(values: list[bytes], pid: int, epoch: int, seq: int) -> bytes:
    return kw.record_batch_v2([kw.Rec(v) for v in values], producer_id=pid,
                              producer_epoch=epoch, base_sequence=seq)


def values_in(bs: str, topic: str) -> list[bytes]:
    return [m.value for m in consume_all(bs, topic, [0], timeout=30)[0]]


def test_raw_duplicate_gap_and_stale_epoch(broker, topic_name):
    """The same batch twice: the second answer is NONE with the first's base
    offset, and one copy is stored. A gap is OUT_OF_ORDER_SEQUENCE_NUMBER
    (45), an older epoch INVALID_PRODUCER_EPOCH (47), a bumped epoch must
    start at 0 (45 otherwise). Nothing refused is stored."""
    create_topic(broker.bootstrap, topic_name, 1)
    err, pid, epoch = kw.init_producer_id(broker.addr)
    assert (err, epoch) == (0, 0) and pid >= 0, (err, pid, epoch)
    first = idem_batch([b"a", b"b"], pid, 0, 0)
    r = kw.produce_raw(broker.addr, topic_name, 0, first)
    assert (r.error_code, r.base_offset) == (0, 0), r
    r = kw.produce_raw(broker.addr, topic_name, 0, kw.record_batch_v2([kw.Rec(b"plain")]))
    assert (r.error_code, r.base_offset) == (0, 2), r
    for version in (3, 7):
        r = kw.produce_raw(broker.addr, topic_name, 0, first, version=version)
        assert (r.error_code, r.base_offset) == (0, 0), f"duplicate at v{version}: {r}"
    r = kw.produce_raw(broker.addr, topic_name, 0, idem_batch([b"gap"], pid, 0, 5))
    assert r.error_code == kw.OUT_OF_ORDER_SEQUENCE_NUMBER, r
    r = kw.produce_raw(broker.addr, topic_name, 0, idem_batch([b"c"], pid, 0, 2))
    assert (r.error_code, r.base_offset) == (0, 3), r
    # KIP-360 epoch bump: a new epoch restarts at 0 and fences the old one.
    r = kw.produce_raw(broker.addr, topic_name, 0, idem_batch([b"bad-bump"], pid, 1, 3))
    assert r.error_code == kw.OUT_OF_ORDER_SEQUENCE_NUMBER, r
    r = kw.produce_raw(broker.addr, topic_name, 0, idem_batch([b"d"], pid, 1, 0))
    assert (r.error_code, r.base_offset) == (0, 4), r
    r = kw.produce_raw(broker.addr, topic_name, 0, idem_batch([b"old"], pid, 0, 3))
    assert r.error_code == kw.INVALID_PRODUCER_EPOCH, r
    # An unknown producer id is accepted at any sequence (Kafka >= 2.5).
    r = kw.produce_raw(broker.addr, topic_name, 0, idem_batch([b"e"], pid + 10_000, 0, 42))
    assert (r.error_code, r.base_offset) == (0, 5), r
    assert values_in(broker.bootstrap, topic_name) == [b"a", b"b", b"plain", b"c", b"d", b"e"]
    # A transactional id gets its own producer id from its coordinator
    # (test_transactions.py); transactional batches are served
    # (test_txn_partition.py).
    err, tpid, tepoch = kw.init_producer_id(broker.addr, transactional_id="tx")
    assert (err, tepoch) == (0, 0) and tpid >= 0 and tpid != pid, (err, tpid, tepoch)


def test_a_retry_after_a_lost_ack_is_answered_as_a_duplicate(broker, topic_name):
    """The first attempt is written and acknowledged on a connection the
    client never reads (its answer is lost); the retry on a new connection
    gets the original offset, and the record is stored once — also after a
    kill -9, when the state comes back from the log."""
    create_topic(broker.bootstrap, topic_name, 1)
    _, pid, _ = kw.init_producer_id(broker.addr)
    batch = idem_batch([b"once"], pid, 0, 0)
    lost = kw.connect(broker.addr)
    try:
        lost.sendall(kw.frame(kw.produce_request_v3(1, topic_name, 0, batch)))
        wait_until(lambda: kw.list_offsets_v7(broker.addr, topic_name, 0,
                                              kw.LATEST_TIMESTAMP).offset == 1,
                   timeout=10, what="the first attempt is durable")
        with kw.connect(broker.addr) as s:
            r = kw.produce_on(s, 2, topic_name, 0, batch)
        assert (r.error_code, r.base_offset) == (0, 0), r
    finally:
        lost.close()
    # The retry of the next batch comes after a kill -9: the new process
    # rebuilds the producer state from the log tail (no snapshot was
    # written: no roll, no clean close).
    nxt = idem_batch([b"twice?"], pid, 0, 1)
    r = kw.produce_raw(broker.addr, topic_name, 0, nxt)
    assert (r.error_code, r.base_offset) == (0, 1), r
    broker.kill9()
    broker.start()

    def retry():
        r = kw.produce_raw(broker.addr, topic_name, 0, nxt)
        return r if r.error_code == 0 else None

    wait_until(retry, timeout=20, what="the partition serves again")
    r = kw.produce_raw(broker.addr, topic_name, 0, nxt)
    assert (r.error_code, r.base_offset) == (0, 1), r
    r = kw.produce_raw(broker.addr, topic_name, 0, idem_batch([b"gap"], pid, 0, 9))
    assert r.error_code == kw.OUT_OF_ORDER_SEQUENCE_NUMBER, "state rebuilt, not forgotten"
    assert values_in(broker.bootstrap, topic_name) == [b"once", b"twice?"]


@pytest.mark.broker_args("--segment-bytes", "4096")
def test_state_survives_rolls_and_a_clean_restart(broker, topic_name):
    """Many rolls (each writes a snapshot), then SIGTERM (close writes one)
    and a restart: duplicates are still recognised and at most three
    snapshots are kept."""
    create_topic(broker.bootstrap, topic_name, 1)
    _, pid, _ = kw.init_producer_id(broker.addr)
    payload = b"x" * 500
    with kw.connect(broker.addr) as s:
        for seq in range(40):
            r = kw.produce_on(s, seq, topic_name, 0, idem_batch([payload], pid, 0, seq))
            assert (r.error_code, r.base_offset) == (0, seq), r
    pdir = broker.partition_dir(topic_name, 0)
    snaps = [p.name for p in pdir.iterdir() if p.name.endswith(".producers")]
    assert 1 <= len(snaps) <= 3, snaps
    broker.restart("sigterm")
    wait_until(lambda: kw.produce_raw(broker.addr, topic_name, 0,
                                      idem_batch([payload], pid, 0, 39)).error_code == 0,
               timeout=20, what="the partition serves again")
    r = kw.produce_raw(broker.addr, topic_name, 0, idem_batch([payload], pid, 0, 39))
    assert (r.error_code, r.base_offset) == (0, 39), r
    r = kw.produce_raw(broker.addr, topic_name, 0, idem_batch([payload], pid, 0, 40))
    assert (r.error_code, r.base_offset) == (0, 40), r
    snaps = [p.name for p in pdir.iterdir() if p.name.endswith(".producers")]
    assert 1 <= len(snaps) <= 3, snaps


class IdemLedger:
    """confluent-kafka with enable.idempotence=true writing a numbered
    sequence round-robin over partitions; records sends and acks."""

    def __init__(self, bs: str, topic: str, partitions: int):
        from confluent_kafka import Producer
        self.p = Producer(producer_conf(bs, **{
            "enable.idempotence": True,
            "acks": "all",
            # No linger: librdkafka keeps one request in flight per
            # partition when idempotent, so with records always queued a
            # request is (nearly) always in flight — written by the leader,
            # waiting for its fsync — when a leader is killed or paused.
            "linger.ms": 0,
            "retry.backoff.ms": 50,
            "retry.backoff.max.ms": 200,
            "message.timeout.ms": 120_000,
            "request.timeout.ms": 5_000,
            "topic.metadata.refresh.interval.ms": 1000,
        }))
        self.topic, self.partitions = topic, partitions
        self.sent: dict[int, list[int]] = {p: [] for p in range(partitions)}
        self.acked: dict[int, list[int]] = {p: [] for p in range(partitions)}
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)

    def _cb(self, err, msg):
        with self.lock:
            if err is not None:
                self.errors.append(str(err))
            else:
                self.acked[msg.partition()].append(int(msg.value()))

    def _run(self):
        seq = 0
        while not self.stop.is_set():
            p = seq % self.partitions
            try:
                self.p.produce(self.topic, value=str(seq).encode(), partition=p,
                               on_delivery=self._cb)
            except BufferError:
                self.p.poll(0.05)
                continue
            self.sent[p].append(seq)
            seq += 1
            self.p.poll(0)
            time.sleep(0.001)
        self.p.flush(120)

    def acks(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.acked.values())

    def wait_acks(self, more: int, timeout: float = 30.0):
        target = self.acks() + more
        wait_until(lambda: self.acks() >= target or self.errors, timeout=timeout,
                   what=f"{target} idempotent acks")
        assert not self.errors, self.errors[:3]


def check_exactly_once(live, led: IdemLedger):
    """Per partition: what is stored is exactly a prefix of what was sent to
    it, in order — no duplicate, no gap — and holds every acknowledged
    record."""
    got = read_settled(live, led)
    for p in range(led.partitions):
        values = [int(m.value) for m in got[p]]
        assert len(values) == len(set(values)), \
            f"p{p}: duplicates stored (offset, value), e.g. " \
            f"{[(m.offset, int(m.value)) for m in got[p] if values.count(int(m.value)) > 1][:6]}"
        assert values == led.sent[p][:len(values)], f"p{p}: gap or reorder: {values[:20]}"
        assert len(values) >= len(led.acked[p]), f"p{p}: acknowledged records lost"
        assert set(led.acked[p]) <= set(values)


@pytest.mark.substrates("local", "weakfs", "glusterfs")
@pytest.mark.timeout(150)
def test_idempotent_producer_through_leader_kill9_and_pause(broker_factory, topic_name):
    """A 3-broker cluster and an idempotent confluent-kafka producer. The
    leader of partition 0 is killed with -9, then the leaders of partitions
    1, 2 and 0 are paused (SIGSTOP) past their lease in turn: the batches a
    leader had written but not acknowledged are retried to the new leader,
    which knows them from the log tail and answers them as duplicates (with
    the original offsets) instead of storing them twice. Each broker comes
    back. The old binary (no sequence checks) stores such a retry twice in
    about half the runs; the raw-protocol tests above catch it every time."""
    bs = broker_factory.cluster(3, FAST)
    partitions = 3
    create_everywhere(bs, topic_name, partitions)
    led = IdemLedger(bootstrap(bs), topic_name, partitions)
    led.t.start()
    try:
        led.wait_acks(500)
        by_id = {b.broker_id: b for b in bs}
        # Read leaders only once every partition has one (a hand-back can
        # leave one momentarily leaderless: leader -1).
        victim = by_id[wait_leaders(bs, topic_name, partitions, set(by_id))[0]]
        victim.kill9()
        wait_leaders(bs, topic_name, partitions, {b.broker_id for b in bs if b.alive()})
        led.wait_acks(500, timeout=40)
        victim.start()
        wait_leaders(bs, topic_name, partitions, {0, 1, 2})
        led.wait_acks(300, timeout=40)
        for part in (1, 2, 0):
            paused = by_id[wait_leaders(bs, topic_name, partitions, set(by_id))[part]]
            others = [b for b in bs if b is not paused]
            paused.proc.send_signal(signal.SIGSTOP)
            try:
                wait_leaders(others, topic_name, partitions, {b.broker_id for b in others})
                led.wait_acks(500, timeout=40)
            finally:
                paused.proc.send_signal(signal.SIGCONT)
            wait_leaders(bs, topic_name, partitions, {0, 1, 2})
            led.wait_acks(300, timeout=40)
    finally:
        led.stop.set()
        led.t.join(130)
    assert not led.errors, led.errors[:5]
    check_exactly_once([b for b in bs if b.alive()], led)


def test_kafka_python_idempotent_producer_across_kill9(broker, topic_name):
    """kafka-python's idempotent producer: sends across a kill -9 and
    restart of the broker are stored once each, in order."""
    from kafka import KafkaProducer
    create_topic(broker.bootstrap, topic_name, 1)

    def producer():
        return KafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=True,
                             acks="all", retries=1_000, retry_backoff_ms=100,
                             request_timeout_ms=5_000, linger_ms=5,
                             api_version_auto_timeout_ms=10_000)

    p = producer()
    sent = []
    for i in range(200):
        p.send(topic_name, value=str(i).encode(), partition=0)
        sent.append(i)
    p.flush(30)
    futures = [p.send(topic_name, value=str(i).encode(), partition=0) for i in range(200, 400)]
    sent.extend(range(200, 400))
    broker.kill9()
    broker.start()
    for f in futures:
        f.get(timeout=60)
    p.close(10)
    values = [int(v) for v in values_in(broker.bootstrap, topic_name)]
    assert values == sent, f"stored {len(values)} of {len(sent)}; first diff at " + \
        str(next((i for i, (a, b) in enumerate(zip(values, sent)) if a != b), None))


@pytest.mark.substrates("local", "weakfs")
def test_producer_ids_are_never_reissued_after_every_broker_restarts(broker_factory):
    """Ids handed out by every broker before a whole-cluster kill -9: each
    broker's first id after the restart is larger than all of them."""
    bs = broker_factory.cluster(3, FAST)

    def pid_of(b):
        for _ in range(100):
            err, pid, epoch = kw.init_producer_id(b.addr)
            if err == 0:
                assert epoch == 0
                return pid
            time.sleep(0.1)
        raise AssertionError(f"InitProducerId on {b.name} kept failing: {err}")

    before = [pid_of(b) for b in bs for _ in range(3)]
    assert len(set(before)) == len(before), before
    for b in bs:
        b.kill9()
    for b in bs:
        b.spawn()
    for b in bs:
        b.wait_ready()
    after = [pid_of(b) for b in bs]
    assert min(after) > max(before), (before, after)
    assert len(set(after)) == len(after), after
