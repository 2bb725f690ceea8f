"""Helpers for multi-broker tests: fast lease flags, metadata views, an
acknowledged-record ledger producer and its read-back check."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from conftest import client_conf, consume_all, create_topic, producer_conf, wait_until

LEASE_MS, GRACE_MS = 1500, 500
FAST = ["--lease-ms", str(LEASE_MS), "--lease-grace-ms", str(GRACE_MS),
        "--heartbeat-ms", "200", "--poll-ms", "100"]


def read_assignment(cluster_dir: Path) -> dict:
    """The newest assignment, as a broker's watcher sees it: the checkpoint
    (`assignment.json`, absent on a fresh cluster) folded forward through
    the history (`assignment/v-<n:012>.json`, each a delta on the version
    before it), probing v+1, v+2 … by exact name. A torn version (its header's
    length does not match its body) ends the fold, as it does for brokers."""
    try:
        a = json.loads((cluster_dir / "assignment.json").read_text())
    except FileNotFoundError:
        a = _EMPTY
    last = a
    for last in fold_history(cluster_dir, a):
        pass
    return last


_EMPTY = {"controller_epoch": 0, "controller_id": 0, "version": 0,
          "brokers": [], "topics": {}, "coordinators": []}


def assignment_versions(cluster_dir: Path) -> list[dict]:
    """Every version of the history, folded from the first (nothing is
    pruned within a test's minutes): what each one granted, in order."""
    return list(fold_history(cluster_dir, _EMPTY))


def fold_history(cluster_dir: Path, a: dict):
    """Yield the assignment after each complete version past `a`."""
    a = json.loads(json.dumps(a))
    while True:
        n = a["version"] + 1
        try:
            raw = (cluster_dir / "assignment" / f"v-{n:012d}.json").read_bytes()
        except FileNotFoundError:
            return
        head, _, body = raw.partition(b"\n")
        parts = head.split(b" ")
        if len(parts) != 4 or parts[0] != b"kaas-versioned" or int(parts[1]) != n \
                or int(parts[3]) != len(body):
            return
        d = json.loads(body)
        a = json.loads(json.dumps(a))
        for k in ("controller_epoch", "controller_id", "version"):
            a[k] = d[k]
        if "brokers" in d:
            a["brokers"] = d["brokers"]
        for name in d.get("removed", []):
            a["topics"].pop(name, None)
        a["topics"].update(d.get("topics", {}))
        if "coordinators" in d:
            a["coordinators"] = d["coordinators"]
        yield a


def volume(b) -> Path:
    """The shared volume's root as the test sees it (on weakfs the backing
    directory, not the broker's caching mount)."""
    return b.weakfs.backing if b.weakfs else b.data_dir


def bootstrap(brokers) -> str:
    return ",".join(b.bootstrap for b in brokers)


def metadata(brokers, topic: str | None = None, timeout: float = 5.0):
    from confluent_kafka.admin import AdminClient
    a = AdminClient(client_conf(bootstrap([b for b in brokers if b.alive()])))
    return a.list_topics(topic=topic, timeout=timeout)


def leaders(brokers, topic: str) -> dict[int, int]:
    md = metadata(brokers, topic)
    t = md.topics[topic]
    return {p: pm.leader for p, pm in t.partitions.items()}


def wait_leaders(brokers, topic: str, partitions: int, live_ids: set[int],
                 timeout: float = 30.0, spread: bool = False) -> dict[int, int]:
    """Until every partition is led by one of `live_ids` — and, with
    `spread`, every one of `live_ids` leads some partition (a cluster whose
    later brokers have not yet joined the assignment has one leader for all)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = leaders(brokers, topic)
            if len(last) == partitions and all(l in live_ids for l in last.values()) \
                    and (not spread or set(last.values()) == set(live_ids)):
                return last
        except Exception as e:  # metadata from a broker mid-failover
            last = repr(e)
        time.sleep(0.1)
    raise AssertionError(f"partitions not all led by {live_ids} within {timeout}s: {last}")


class Ledger:
    """A producer writing seq numbers round-robin over partitions with
    acks=all and in-order retries; records what was acknowledged."""

    def __init__(self, bs: str, topic: str, partitions: int):
        from confluent_kafka import Producer
        self.p = Producer(producer_conf(bs, **{
            "enable.idempotence": False,
            "max.in.flight.requests.per.connection": 1,
            "retries": 1_000_000,
            "retry.backoff.ms": 50,
            "retry.backoff.max.ms": 200,
            "message.timeout.ms": 120_000,
            "linger.ms": 2,
            "topic.metadata.refresh.interval.ms": 1000,
        }))
        self.topic, self.partitions = topic, partitions
        self.acked: dict[int, list[int]] = {p: [] for p in range(partitions)}
        self.ack_times: list[float] = []
        self.errors: list[str] = []
        self.seq = 0
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)

    def _cb(self, err, msg):
        if err is not None:
            self.errors.append(str(err))
        else:
            self.acked[msg.partition()].append(int(msg.value()))
            self.ack_times.append(time.monotonic())

    def _run(self):
        while not self.stop.is_set():
            p = self.seq % self.partitions
            self.p.produce(self.topic, value=str(self.seq).encode(), partition=p,
                           on_delivery=self._cb)
            self.seq += 1
            self.p.poll(0)
            time.sleep(0.002)
        self.p.flush(120)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join(150)

    def acks(self) -> int:
        return sum(len(v) for v in self.acked.values())

    def wait_acks(self, more: int, timeout: float = 30.0):
        target = self.acks() + more
        deadline = time.monotonic() + timeout
        while self.acks() < target:
            assert time.monotonic() < deadline, f"producer stalled at {self.acks()} acks; errors={self.errors[-3:]}"
            time.sleep(0.05)

    def max_stall(self, since: float) -> float:
        ts = [t for t in self.ack_times if t >= since]
        return max((b - a for a, b in zip(ts, ts[1:])), default=0.0)


def read_settled(live, led: Ledger, timeout: float = 90.0):
    """Read every partition back, retrying (bounded) on the errors a client
    retries: right after a fault a partition may still move (a broker that
    rejoined takes its share), and the read must not mistake a move for a
    loss. Any other error, or no success within `timeout`, fails."""
    from confluent_kafka import KafkaError, KafkaException

    # _UNKNOWN_PARTITION: librdkafka's get_watermark_offsets reports a
    # partition whose Metadata answer had no leader (LEADER_NOT_AVAILABLE,
    # leader -1) as "Local: Unknown partition" without re-querying
    # (rd_kafka_topic_partition_list_query_leaders: "no leader(s) for
    # partitions means all partitions are unknown"). A broker answers so
    # while its own lease is lapsed (it names no leader it cannot vouch for)
    # — seen when the read started right after a cut-off broker healed.
    retriable = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                 KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH,
                 KafkaError.REQUEST_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
                 KafkaError._UNKNOWN_PARTITION}
    deadline = time.monotonic() + timeout
    while True:
        try:
            return consume_all(bootstrap(live), led.topic, list(range(led.partitions)), timeout=60)
        except KafkaException as e:
            if e.args[0].code() not in retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def check_ledger(brokers, led: Ledger):
    """Every acknowledged record is read back at increasing offsets, in the
    order it was acknowledged: the acknowledgements of a partition are a
    subsequence of its log. Anything else in the log is a client's retry of
    a send it had no answer to — a duplicate, or (this producer is not
    idempotent) a record that a leader change overtook: librdkafka sends to
    the new leader while a request to the old one is still unanswered, and
    retries that one later (seen in the soak: 11636 between 12668 and 12674,
    acknowledged in that order, all at one leader epoch)."""
    live = [b for b in brokers if b.alive()]
    want = {p: len(v) for p, v in led.acked.items()}
    got = read_settled(live, led)
    for p in range(led.partitions):
        msgs = got[p]
        offsets = [m.offset for m in msgs]
        assert offsets == sorted(set(offsets)), f"p{p}: offsets not strictly increasing"
        values = [int(m.value) for m in msgs]
        seen = set(values)
        missing = [s for s in led.acked[p] if s not in seen]
        assert not missing, f"p{p}: {len(missing)} acknowledged records lost, e.g. {missing[:5]}"
        # Greedy: each acknowledged value at its next occurrence in the log.
        at = 0
        for v in led.acked[p]:
            try:
                at = values.index(v, at) + 1
            except ValueError:
                raise AssertionError(
                    f"p{p}: {v} acknowledged after {values[at - 1] if at else 'nothing'} "
                    f"but not found after it in the log (offset {offsets[at - 1] if at else -1})")
        assert len(values) >= want[p]


def create_everywhere(brokers, topic: str, partitions: int):
    """Create, then wait until *each* broker's own metadata shows every
    partition led (brokers learn the assignment by polling it)."""
    from kafka_wire import metadata_v4
    create_topic(bootstrap(brokers), topic, partitions=partitions)
    ids = {x.broker_id for x in brokers}
    for b in brokers:
        # Asked of `b` itself (a client library may ask any broker it knows).
        def led(b=b):
            err, parts = metadata_v4(b.addr, [topic])[1].get(topic, (-1, {}))
            return err == 0 and len(parts) == partitions and set(parts.values()) <= ids
        wait_until(led, 30, what=f"broker {b.broker_id} to see {topic} led")


def controller_id(brokers) -> int:
    return metadata(brokers).controller_id
