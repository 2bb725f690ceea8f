"""kill -9 the broker mid-stream (3 times) while a producer (acks=all, no
idempotence, no retries) writes a numbered sequence; every acknowledged record
must survive exactly once, at the offset it was acknowledged with, and the log
must hold each partition's values in strictly increasing order (no value is
ever written twice, because nothing is ever resent)."""

import threading
import time

import pytest
from confluent_kafka import Producer

from conftest import consume_all, create_topic, producer_conf, wait_until

# Run on a local dir and on a weakfs (NFS-like) mount: see conftest.py.
pytestmark = pytest.mark.substrates("local", "weakfs")

PARTITIONS = 3
KILL_CYCLES = 3
ACKS_PER_CYCLE = 3000
MAX_OUTSTANDING = 2000


class SeqProducer(threading.Thread):
    def __init__(self, bootstrap, topic):
        super().__init__(daemon=True)
        self.topic = topic
        self.p = Producer(producer_conf(bootstrap, **{
            "acks": "all",
            "enable.idempotence": False,
            "message.send.max.retries": 0,   # every value is sent at most once
            "retry.backoff.ms": 100,
            "linger.ms": 2,
            "message.timeout.ms": 15000,
            "request.timeout.ms": 10000,
        }))
        self.lock = threading.Lock()
        self.acked = {}    # seq -> (partition, offset)
        self.failed = {}   # seq -> error string
        self.sent = 0
        self.stop_flag = threading.Event()
        self.exc = None

    def _cb(self, err, msg):
        seq = int(msg.value())
        with self.lock:
            if err is None:
                self.acked[seq] = (msg.partition(), msg.offset())
            else:
                self.failed[seq] = str(err)

    def outstanding(self):
        with self.lock:
            return self.sent - len(self.acked) - len(self.failed)

    def n_acked(self):
        with self.lock:
            return len(self.acked)

    def run(self):
        try:
            deadline = time.monotonic() + 240
            while not self.stop_flag.is_set() and time.monotonic() < deadline:
                if self.outstanding() >= MAX_OUTSTANDING:
                    self.p.poll(0.02)
                    continue
                seq = self.sent
                try:
                    self.p.produce(self.topic, value=b"%010d" % seq,
                                   partition=seq % PARTITIONS, on_delivery=self._cb)
                except BufferError:
                    self.p.poll(0.05)
                    continue
                with self.lock:
                    self.sent += 1
                self.p.poll(0)
                if seq % 50 == 0:
                    time.sleep(0.001)  # keep a steady stream, not one giant burst
            self.p.flush(30)
        except Exception as e:  # surfaced by the test
            self.exc = e


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kill9_loses_no_acked_record(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, PARTITIONS)
    prod = SeqProducer(broker.bootstrap, topic_name)
    prod.start()
    try:
        for cycle in range(KILL_CYCLES):
            target = (cycle + 1) * ACKS_PER_CYCLE
            wait_until(lambda: prod.n_acked() >= target or prod.exc, timeout=60,
                       what=f"{target} acks before kill #{cycle + 1}")
            assert prod.exc is None, prod.exc
            broker.kill9()
            time.sleep(0.3)
            broker.start()
        final = (KILL_CYCLES + 1) * ACKS_PER_CYCLE
        wait_until(lambda: prod.n_acked() >= final or prod.exc, timeout=90,
                   what=f"{final} acks after the last restart")
    finally:
        prod.stop_flag.set()
        prod.join(60)
    assert not prod.is_alive(), "producer thread did not stop"
    assert prod.exc is None, prod.exc

    acked = dict(prod.acked)
    print(f"sent={prod.sent} acked={len(acked)} failed={len(prod.failed)}")
    got = consume_all(broker.bootstrap, topic_name, PARTITIONS, timeout=60)

    for part in range(PARTITIONS):
        msgs = got[part]
        seqs = [int(m.value) for m in msgs]
        # no duplicates, produce order preserved (nothing is ever resent)
        bad = [(a, b) for a, b in zip(seqs, seqs[1:]) if b <= a]
        assert not bad, f"partition {part}: values not strictly increasing, first bad pairs {bad[:5]}"
        offs = [m.offset for m in msgs]
        assert offs == sorted(set(offs)), f"partition {part}: offsets repeat or go backwards"
        assert all(s % PARTITIONS == part for s in seqs)
        at = {m.offset: int(m.value) for m in msgs}
        for seq, (p_, off) in acked.items():
            if p_ != part:
                continue
            assert at.get(off) == seq, \
                f"acked seq {seq} (p{part}@{off}) missing or replaced by {at.get(off)!r}"
    present = {int(m.value) for msgs in got.values() for m in msgs}
    lost = sorted(set(acked) - present)
    assert not lost, f"{len(lost)} acknowledged records lost, first {lost[:10]}"
