"""One volume, one cluster.

A broker started over a data directory that another cluster writes — without
its `--cluster-dir`, with another cluster's, or a fresh cluster over a copy —
used to found a second cluster, grant itself every partition, and make the
next leader change of either cluster open from the other's manifest:
acknowledged records dropped, the producer told nothing. Now the data
directory carries its cluster's id (`.cluster-id.json`) and such a broker
refuses to start before it writes anything; and, behind that, a leader that
finds the next epoch of its partition claimed by anyone stops acknowledging
at its next fsync (the successor probe), which the last test shows alone by
switching the stamp check off with the broker's test-only hook.

Every test runs a 3-broker cluster whose cluster state is on its own
directory, an acks=all producer with a ledger, and checks that every
acknowledged record is read back.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from cluster import Ledger, bootstrap, check_ledger, create_everywhere
from conftest import Broker, client_conf, consume_all, create_topic, kaas_bin, producer_conf

pytestmark = pytest.mark.substrates("local", "weakfs")

PARTITIONS = 3


def start_cluster(broker_factory, tmp_path: Path, **kw):
    cp = tmp_path / "control-plane"
    cp.mkdir()
    brokers = broker_factory.cluster(3, ["--cluster-dir", str(cp)], **kw)
    create_everywhere(brokers, "orders", PARTITIONS)
    return brokers, cp, (cp / "cluster-id").read_text().strip()


def intruder(broker_factory, brokers, args, env=None, name: str = "intruder"):
    """A fourth broker over the cluster's data volume (its own weakfs mount
    of the same backing directory on weakfs)."""
    b0 = brokers[0]
    if b0.weakfs is not None:
        return broker_factory(args, start=False, broker_id=3, name=name,
                              backing=b0.weakfs.backing, env=env)
    return broker_factory(args, start=False, broker_id=3, name=name, data_dir=b0.data_dir,
                          env=env)


def volume_root(brokers) -> Path:
    """The data volume itself (the weakfs backing directory on weakfs)."""
    b0 = brokers[0]
    return b0.weakfs.backing if b0.weakfs is not None else b0.data_dir


def refused(b, timeout: float = 30.0) -> str:
    """Start `b`, expect it to exit non-zero; its log."""
    b.spawn()
    deadline = time.monotonic() + timeout
    while b.proc.poll() is None:
        assert time.monotonic() < deadline, f"{b.name} did not refuse to start:\n{b.log_tail()}"
        time.sleep(0.1)
    assert b.proc.returncode != 0, f"{b.name} exited 0:\n{b.log_tail()}"
    return b.log_text()


def test_a_broker_without_the_cluster_dir_is_refused_and_nothing_is_lost(broker_factory, tmp_path):
    """The issue's scenario: a fourth broker on the data directory without
    `--cluster-dir` (its cluster state would default to `<data>/__cluster`)
    refuses to start, naming the data's cluster and the flag; it creates
    nothing on the volume; and a leader failover afterwards loses nothing."""
    brokers, _, cid = start_cluster(broker_factory, tmp_path)
    with Ledger(bootstrap(brokers), "orders", PARTITIONS) as led:
        led.wait_acks(300)
        x = intruder(broker_factory, brokers, [])
        log = refused(x)
        assert f"belongs to cluster {cid}" in log, log[-2000:]
        assert "holds no cluster" in log and "--cluster-dir" in log, log[-2000:]
        assert not (volume_root(brokers) / "__cluster").exists(), \
            "the refused broker created its cluster directory on the data volume"
        led.wait_acks(300)
        brokers[0].kill9()
        led.wait_acks(300, timeout=60)
    assert not led.errors, led.errors[:3]
    check_ledger(brokers, led)


def test_another_clusters_dir_and_a_copied_data_dir_are_refused(broker_factory, tmp_path):
    """A fourth broker with another cluster's `--cluster-dir`, one with an
    empty `--cluster-dir`, and a fresh cluster over a copy of the data
    directory: each refuses to start, naming both ids where there are two;
    the running cluster loses nothing."""
    brokers, _, cid = start_cluster(broker_factory, tmp_path)
    other = tmp_path / "other"
    with Ledger(bootstrap(brokers), "orders", PARTITIONS) as led:
        led.wait_acks(200)
        # Another cluster: a standalone broker on a directory of its own.
        solo = broker_factory([], broker_id=0, name="other", data_dir=other / "data")
        solo.stop()
        other_id = (other / "data" / "__cluster" / "cluster-id").read_text().strip()
        assert other_id != cid
        x = intruder(broker_factory, brokers,
                     ["--cluster-dir", str(other / "data" / "__cluster")], name="wrong-dir")
        log = refused(x)
        assert f"belongs to cluster {cid}" in log and f"is cluster {other_id}" in log, log[-2000:]

        empty = tmp_path / "empty-cp"
        empty.mkdir()
        y = intruder(broker_factory, brokers, ["--cluster-dir", str(empty)], name="empty-dir")
        log = refused(y)
        assert f"belongs to cluster {cid}" in log and "holds no cluster" in log, log[-2000:]
        assert list(empty.iterdir()) == [], "the refused broker wrote to its cluster directory"

        # A plain directory (not a weakfs mount) holding a copy of the volume.
        copy = tmp_path / "copy"
        shutil.copytree(volume_root(brokers), copy)
        z = Broker(tmp_path / "copy-broker", [], broker_id=3, name="copy", data_dir=copy)
        try:
            log = refused(z)
        finally:
            z.stop()
        assert f"belongs to cluster {cid}" in log, log[-2000:]
        assert not (copy / "__cluster").exists()
        led.wait_acks(300)
    assert not led.errors, led.errors[:3]
    check_ledger(brokers, led)


# Without negative lookup caching (the deployment guide's lookupcache=positive):
# the successor probe is an exact-name lookup, which a cached "no such file"
# would delay by up to the attribute-cache time.
POSITIVE_LOOKUPS = ["--actimeo-ms", "3000", "--silly-rename", "--write-back", "--estale"]


def test_the_successor_probe_alone_stops_a_foreign_claim_from_losing_acks(
        broker_factory, tmp_path, substrate):
    """With the stamp check switched off (test-only hook), a fourth broker
    without `--cluster-dir` founds a second cluster and claims every
    partition at the next epoch. The first cluster's leaders see the claim
    at their next fsync and stop acknowledging; no acknowledged record is
    lost, across that and the second cluster's death."""
    kw = {"weakfs_args": POSITIVE_LOOKUPS} if substrate == "weakfs" else {}
    brokers, _, _ = start_cluster(broker_factory, tmp_path, **kw)
    hook = {"KAAS_TEST_ONLY_SKIP_VOLUME_BINDING": "1"}
    with Ledger(bootstrap(brokers), "orders", PARTITIONS) as led:
        led.wait_acks(300)
        b0 = brokers[0]
        if b0.weakfs is not None:
            x = broker_factory([], start=False, broker_id=3, name="intruder",
                               backing=b0.weakfs.backing, env=hook, weakfs_args=POSITIVE_LOOKUPS)
        else:
            x = intruder(broker_factory, brokers, [], env=hook)
        x.start()
        # The second cluster opens every partition; each first-cluster leader
        # it displaced says so at its next fsync.
        deadline = time.monotonic() + 60
        while True:
            opened = len(set(re.findall(r'partition leader open.*?partition=(\d+)', x.log_text())))
            superseded = sum(b.log_text().count("a later epoch of this partition was claimed")
                             for b in brokers)
            if opened >= PARTITIONS and superseded >= 1:
                break
            assert time.monotonic() < deadline, \
                f"opened {opened}, superseded {superseded}:\n{x.log_tail()}"
            time.sleep(0.2)
        time.sleep(2)
        x.kill9()
        # The first cluster takes its partitions back above the foreign
        # epochs and acknowledges again.
        led.wait_acks(300, timeout=90)
        # A leader change now opens each partition from the newest
        # manifest, the second cluster's where it was last: whatever a
        # first-cluster leader acknowledged after that claim would be gone.
        brokers[0].kill9()
        brokers[1].kill9()
        led.wait_acks(300, timeout=90)
    assert not led.errors, led.errors[:3]
    check_ledger(brokers, led)


def move_cluster_dir(src: Path, dst: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(kaas_bin()), "move-cluster-dir", "--from", str(src), "--to", str(dst),
                           "--wait-ms", "1500"], capture_output=True, text=True, timeout=60)


def test_moving_the_control_plane_out_and_back(broker_factory, tmp_path):
    """`kaas move-cluster-dir` moves a stopped cluster's state from
    `<data>/__cluster` to a dedicated directory and back: the cluster comes
    back with its records and its committed group offsets each time, the
    old location is refused afterwards, and the command refuses while the
    broker runs."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    b = broker_factory([])
    create_topic(b.bootstrap, "moved", 2)
    p = Producer(producer_conf(b.bootstrap))
    for i in range(200):
        p.produce("moved", value=b"%d" % i, partition=i % 2)
    assert p.flush(30) == 0

    def commit(offset: int):
        c = Consumer(client_conf(b.bootstrap, **{"group.id": "g", "enable.auto.commit": False}))
        c.commit(offsets=[TopicPartition("moved", 0, offset)], asynchronous=False)
        c.close()

    def committed() -> int:
        c = Consumer(client_conf(b.bootstrap, **{"group.id": "g"}))
        try:
            return c.committed([TopicPartition("moved", 0)], timeout=20)[0].offset
        finally:
            c.close()

    commit(42)
    default = b.data_dir / "__cluster"
    cp = tmp_path / "control-plane"
    r = move_cluster_dir(default, cp)
    assert r.returncode != 0 and "the cluster is running" in r.stderr, r.stderr
    b.sigterm()

    for src, dst, args in [(default, cp, ["--cluster-dir", str(cp)]), (cp, default, [])]:
        r = move_cluster_dir(src, dst)
        assert r.returncode == 0, r.stderr
        b.extra_args = args
        b.start()
        got = consume_all(b.bootstrap, "moved", 2)
        assert sorted(int(m.value) for v in got.values() for m in v) == list(range(200))
        assert committed() == 42
        b.sigterm()
        # The old location no longer holds the cluster: a broker on it refuses.
        old = ["--cluster-dir", str(src)] if src == cp else []
        b.extra_args = old
        log = refused(b)
        assert "holds no cluster" in log.split("e2e: start #")[-1], log[-2000:]
