"""Cluster: several brokers on one shared volume, one writer per partition.

Real broker processes on loopback, real clients (confluent-kafka /
librdkafka 2.16), real kill -9, SIGSTOP and SIGTERM. Leases are shortened
(FAST) so a failover takes ~2 s instead of ~4.5 s; the protocol is the same.

Every test runs on the local substrate and on weakfs (one NFS-like mount per
broker over one backing directory).
"""

from __future__ import annotations

import random
import re
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import kafka_wire as kw
from conftest import consume_all, wait_until

pytestmark = pytest.mark.substrates("local", "weakfs")

from cluster import (FAST, GRACE_MS, LEASE_MS, Ledger, bootstrap, check_ledger,  # noqa: E402
                     controller_id, create_everywhere, leaders, metadata, wait_leaders)


@pytest.mark.substrates("glusterfs", "cephfs")
def test_failover_kill9_leader_then_controller(broker_factory, topic_name):
    """kill -9 a non-controller leader, then the controller, then restart
    both, all under acks=all load: no acknowledged record is lost, offsets
    are never served twice, and the producer recovers by itself."""
    bs = broker_factory.cluster(3, FAST)
    create_everywhere(bs, topic_name, 6)
    by_id = {b.broker_id: b for b in bs}
    with Ledger(bootstrap(bs), topic_name, 6) as led:
        led.wait_acks(300)
        ctl = controller_id(bs)
        victim = next(b for b in bs if b.broker_id != ctl and b.broker_id in leaders(bs, topic_name).values())
        led_by_victim = sum(1 for l in leaders(bs, topic_name).values() if l == victim.broker_id)
        victim.kill9()
        t0 = time.monotonic()
        live = {b.broker_id for b in bs if b.alive()}
        wait_leaders(bs, topic_name, 6, live)
        # The controller names the broker it lost and what moves.
        def lost_lines():
            return [line for line in by_id[ctl].log_text().splitlines()
                    if "broker lost (lease expired)" in line
                    and re.search(rf"\bbroker={victim.broker_id}\b", line)]
        lost = wait_until(lost_lines, 10, what="the controller's broker-lost line")
        moved = int(re.search(r"\bpartitions=(\d+)", lost[0]).group(1))
        assert moved >= led_by_victim, lost[0]
        led.wait_acks(300)
        failover = time.monotonic() - t0
        by_id[ctl].kill9()
        live = {b.broker_id for b in bs if b.alive()}
        wait_leaders(bs, topic_name, 6, live)
        led.wait_acks(300)
        victim.start()
        by_id[ctl].start()
        wait_leaders(bs, topic_name, 6, {0, 1, 2})
        led.wait_acks(300)
    assert not led.errors, led.errors[:5]
    check_ledger(bs, led)
    # Lease + grace + poll, plus client metadata refresh; generous for CI.
    assert failover < (LEASE_MS + GRACE_MS) / 1000 + 8, failover


def _fuse_client_pids(mountpoint) -> list[int]:
    """The FUSE client daemon(s) serving `mountpoint` (glusterfs, ceph-fuse)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            comm = (d / "comm").read_text().strip()
            args = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if comm in ("glusterfs", "ceph-fuse") and str(mountpoint).encode() in args:
            pids.append(int(d.name))
    return pids


def _vanish(b) -> None:
    """Kill -9 the FUSE daemon serving `b`'s data directory."""
    if b.real_mount is not None:
        pids = _fuse_client_pids(b.real_mount.path)
        assert pids, f"no FUSE client found for {b.real_mount.path}"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    else:
        b.weakfs.proc.kill()
        b.weakfs.proc.wait(10)


def _come_back(b) -> None:
    """Detach the dead mount and mount a new client at the same place."""
    mnt = b.real_mount.path if b.real_mount is not None else b.weakfs.mountpoint
    subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True, timeout=30)
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)
    if b.real_mount is not None:
        v = b.real_mount.volume
        r = v.run("mount", str(v.state), str(mnt), timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
    else:
        b.weakfs.proc = None
        b.weakfs.mount()


@pytest.mark.substrates("glusterfs", "cephfs")  # and the module's local, weakfs
def test_a_vanished_mount_costs_its_broker_the_lease_and_nothing_acknowledged(
        broker_factory, topic_name, substrate):
    """Bad input from the filesystem itself: the FUSE daemon of one
    broker's mount is killed (-9) under acks=all load, so every call on
    that mount fails ("transport endpoint is not connected"). That broker
    cannot renew its heartbeat, so its lease lapses and it stops leading;
    the other takes its partitions over; it does not crash. Once its mount
    is back it rejoins by itself, and no acknowledged record is lost.
    (CephFS: the survivor also stalls until the MDS evicts the dead client,
    ~5 s with the test substrate's settings — ARCHITECTURE, "The real
    substrates".)"""
    if substrate == "local":
        pytest.skip("a local directory has no mount to lose")
    bs = broker_factory.cluster(2, FAST)
    create_everywhere(bs, topic_name, 4)
    victim = next(b for b in bs if b.broker_id != controller_id(bs))
    survivor = next(b for b in bs if b is not victim)
    with Ledger(bootstrap(bs), topic_name, 4) as led:
        led.wait_acks(200)
        assert victim.broker_id in leaders(bs, topic_name).values()
        _vanish(victim)
        wait_leaders([survivor], topic_name, 4, {survivor.broker_id}, timeout=60)
        led.wait_acks(200)
        assert victim.alive(), "the broker whose mount vanished exited:\n" + victim.log_text()[-3000:]
        _come_back(victim)
        wait_leaders(bs, topic_name, 4, {0, 1}, timeout=90, spread=True)
        led.wait_acks(200)
    assert not led.errors, led.errors[:5]
    assert victim.alive(), victim.log_text()[-3000:]
    check_ledger(bs, led)


@pytest.mark.substrates("glusterfs", "cephfs")
def test_the_filesystems_own_server_killed_and_restarted_loses_nothing(
        broker_factory, topic_name, substrate):
    """Bad input from the filesystem's server side: GlusterFS's only brick,
    or CephFS's only MDS, killed -9 under acks=all load and started again 5 s
    later. Every broker's calls fail or wait meanwhile, so every lease may
    lapse; the brokers stay up, the cluster recovers by itself once the
    server is back (every partition led again, the producer acknowledging),
    and no acknowledged record is lost."""
    if substrate not in ("glusterfs", "cephfs"):
        pytest.skip("only a real shared filesystem has a server to kill")
    bs = broker_factory.cluster(2, FAST)
    create_everywhere(bs, topic_name, 4)
    volume = bs[0].real_mount.volume
    with Ledger(bootstrap(bs), topic_name, 4) as led:
        led.wait_acks(200)
        what = "restart-brick" if substrate == "glusterfs" else "restart-mds"
        r = volume.run(what, str(volume.state), "5", timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        wait_leaders(bs, topic_name, 4, {0, 1}, timeout=120)
        led.wait_acks(200, timeout=120)
    assert not led.errors, led.errors[:5]
    assert all(b.alive() for b in bs), [b.log_text()[-2000:] for b in bs if not b.alive()]
    check_ledger(bs, led)


def test_zombie_leader_acknowledges_nothing_after_its_lease(broker_factory, topic_name):
    """SIGSTOP a leader past its lease; the partition moves; a produce that
    was queued to the zombie is refused with NOT_LEADER_OR_FOLLOWER after
    SIGCONT, and it is never served by anyone."""
    bs = broker_factory.cluster(2, FAST)
    create_everywhere(bs, topic_name, 2)
    ctl = controller_id(bs)
    ls = leaders(bs, topic_name)
    part = next((p for p, l in ls.items() if l != ctl), None)
    if part is None:
        pytest.skip(f"controller leads every partition: {ls}")
    zombie = next(b for b in bs if b.broker_id == ls[part])
    other = next(b for b in bs if b is not zombie)
    before = kw.produce_raw(zombie.addr, topic_name, part,
                            kw.record_batch_v2([kw.Rec(b"before", key=b"k")]))
    assert before.error_code == 0, before
    sock = kw.connect(zombie.addr, timeout=60)
    zombie.proc.send_signal(signal.SIGSTOP)
    try:
        sock.sendall(kw.frame(kw.produce_request_v3(
            11, topic_name, part, kw.record_batch_v2([kw.Rec(b"zombie", key=b"k")]), -1)))
        wait_leaders([other], topic_name, 2, {other.broker_id}, timeout=20)
        # The new leader may still be opening (on weakfs a stale directory
        # view makes it re-drive its open 200 ms later, answering
        # NOT_LEADER meanwhile): retry what clients retry (NOT_LEADER,
        # LEADER_NOT_AVAILABLE, KAFKA_STORAGE_ERROR), bounded.
        for _ in range(25):
            after = kw.produce_raw(other.addr, topic_name, part,
                                   kw.record_batch_v2([kw.Rec(b"after", key=b"k")]))
            if after.error_code not in (5, 6, 56):
                break
            time.sleep(0.2)
        assert after.error_code == 0, after
    finally:
        zombie.proc.send_signal(signal.SIGCONT)
    cid, results = kw.parse_produce_response_v3(kw.recv_frame(sock))
    sock.close()
    assert cid == 11
    assert results[0].error_code == 6, f"zombie answered {results[0]} (want NOT_LEADER_OR_FOLLOWER)"
    time.sleep(1.0)
    got = consume_all(other.bootstrap, topic_name, [part])[part]
    values = [m.value for m in got]
    assert b"before" in values and b"after" in values, values
    assert b"zombie" not in values, values
    assert re.search(r"lease lapsed", zombie.log_text()), "zombie did not notice its lapse"
    # It rejoined as a new incarnation and the cluster is whole again.
    wait_leaders(bs, topic_name, 2, {0, 1})


def test_election_race_one_controller_per_epoch(broker_factory):
    """Brokers started at once, repeatedly, with random delays: every epoch
    has exactly one winner, and all brokers agree on the controller."""
    rng = random.Random(1234)
    print("seed 1234")
    for round_ in range(4):
        bs = broker_factory.cluster(3, FAST, start=False)
        for b in bs:
            time.sleep(rng.uniform(0, 0.15))
            b.spawn()
        for b in bs:
            b.wait_ready()
        deadline = time.monotonic() + 15
        ids = None
        while time.monotonic() < deadline:
            try:
                ids = {b.broker_id: metadata([b]).controller_id for b in bs}
            except Exception:
                ids = None
            if ids and len(set(ids.values())) == 1 and -1 not in ids.values():
                break
            time.sleep(0.1)
        assert ids and len(set(ids.values())) == 1 and -1 not in ids.values(), f"round {round_}: {ids}"
        wins: dict[int, list[str]] = {}
        for b in bs:
            for e in re.findall(r"elected controller epoch=(\d+)", b.log_text()):
                wins.setdefault(int(e), []).append(b.name)
        assert wins and all(len(v) == 1 for v in wins.values()), f"round {round_}: {wins}"
        for b in bs:
            b.sigterm()


@pytest.mark.substrates("glusterfs")
def test_rolling_restart_with_sigterm_hands_off(broker_factory, topic_name):
    """SIGTERM each broker in turn under load: each exits 0 after handing its
    partitions off; the producer sees only retriable errors (none surface),
    loses nothing, and never stalls for long."""
    bs = broker_factory.cluster(3, FAST)
    create_everywhere(bs, topic_name, 6)
    with Ledger(bootstrap(bs), topic_name, 6) as led:
        led.wait_acks(200)
        t0 = time.monotonic()
        for b in bs:
            rc = b.sigterm(timeout=30)
            assert rc == 0, f"{b.name} exited {rc}"
            assert "released" in b.log_text() or "controlled shutdown" in b.log_text()
            led.wait_acks(100)
            b.start()
            wait_leaders(bs, topic_name, 6, {0, 1, 2})
            led.wait_acks(100)
        stall = led.max_stall(t0)
    assert not led.errors, led.errors[:5]
    check_ledger(bs, led)
    print(f"rolling restart: max produce stall {stall:.3f}s")
    # A handoff is a poll or two plus a client metadata refresh, not a
    # lease; the bound leaves room for a noisy 2-core CI machine.
    assert stall < (LEASE_MS + GRACE_MS) / 1000 + 2.0, stall


def test_a_paused_broker_replaced_under_its_id_exits_on_waking(broker_factory, topic_name, substrate):
    """SIGSTOP a broker past its lease, start a replacement process with the
    same broker id (a StatefulSet pod recreated while the old one is frozen),
    then SIGCONT the old one: it must notice the foreign incarnation in its
    record and exit (code 3) instead of heartbeating over the replacement."""
    bs = broker_factory.cluster(2, FAST)
    create_everywhere(bs, topic_name, 2)
    ctl = controller_id(bs)
    old = next(b for b in bs if b.broker_id != ctl)
    other = next(b for b in bs if b is not old)
    old.proc.send_signal(signal.SIGSTOP)
    try:
        if substrate == "weakfs":
            new = broker_factory(FAST, start=False, backing=old.weakfs.backing,
                                 broker_id=old.broker_id, name="replacement")
        else:
            new = broker_factory(FAST, start=False, broker_id=old.broker_id,
                                 name="replacement", data_dir=old.data_dir)
        new.start(timeout=30)  # waits out the old incarnation's lease
        wait_leaders([other, new], topic_name, 2, {0, 1})
    finally:
        old.proc.send_signal(signal.SIGCONT)
    rc = old.proc.wait(timeout=15)
    assert rc == 3, f"paused broker exited {rc}"
    assert "another process heartbeats as this broker id" in old.log_text()
    # The cluster is whole with the replacement.
    res = kw.produce_raw(new.addr if leaders([other, new], topic_name)[0] == new.broker_id else other.addr,
                         topic_name, 0, kw.record_batch_v2([kw.Rec(b"x", key=b"k")]))
    assert res.error_code == 0, res


def test_an_epoch_claimed_by_another_leader_is_never_written_and_regranted_above(
        broker_factory, topic_name):
    """The epoch a broker is granted is already claimed (leader-e<E>.claim,
    planted here as a deposed controller's late grant to broker 9 would
    leave it): the broker writes nothing under that epoch, reports the
    owner, and once the owner is known to be gone (no record for lease +
    grace) the controller re-grants above it."""
    (b,) = broker_factory.cluster(1, FAST)
    create_everywhere([b], topic_name, 1)
    first = kw.produce_raw(b.addr, topic_name, 0, kw.record_batch_v2([kw.Rec(b"one", key=b"k")]))
    assert first.error_code == 0, first
    pdir = b.partition_dir(topic_name, 0)
    epoch = max(int(p.stem.split("-e")[1]) for p in pdir.glob("manifest-e*.json"))
    assert b.sigterm() == 0
    # The restart (a new incarnation) is granted epoch + 1: claim it first.
    taken = epoch + 1
    (pdir / f"leader-e{taken}.claim").write_text(
        json.dumps({"epoch": taken, "broker_id": 9, "incarnation": 99}))
    b.start()
    deadline = time.monotonic() + 30
    res = None
    while time.monotonic() < deadline:
        res = kw.produce_raw(b.addr, topic_name, 0, kw.record_batch_v2([kw.Rec(b"two", key=b"k")]))
        if res.error_code == 0:
            break
        # Retriable only: NOT_LEADER_OR_FOLLOWER (6), LEADER_NOT_AVAILABLE (5),
        # UNKNOWN_TOPIC_OR_PARTITION (3) while the restarted broker loads.
        assert res.error_code in (6, 5, 3), res
        time.sleep(0.2)
    assert res is not None and res.error_code == 0, f"partition never led again: {res}"
    assert "our epoch is claimed by another leader" in b.log_text()
    written = [p.name for p in pdir.glob(f"*-e{taken}.*") if p.suffix != ".claim"]
    assert not written, f"written under the claimed epoch: {written}"
    claim = json.loads((pdir / f"leader-e{taken}.claim").read_text())
    assert claim["broker_id"] == 9, claim
    assert max(int(p.stem.split("-e")[1]) for p in pdir.glob("manifest-e*.json")) > taken
    got = [m.value for m in consume_all(b.bootstrap, topic_name, [0])[0]]
    assert got == [b"one", b"two"], got


def test_a_grant_below_an_epoch_on_disk_is_renewed_above_it(broker_factory, topic_name):
    """A leader that finds a higher epoch on disk at open (here: a late
    manifest of an earlier owner, planted by hand) reports it, and the
    controller re-grants above it — instead of NOT_LEADER forever."""
    (b,) = broker_factory.cluster(1, FAST)
    create_everywhere([b], topic_name, 1)
    first = kw.produce_raw(b.addr, topic_name, 0, kw.record_batch_v2([kw.Rec(b"one", key=b"k")]))
    assert first.error_code == 0, first
    pdir = b.partition_dir(topic_name, 0)
    manifest = max(pdir.glob("manifest-e*.json"), key=lambda p: int(p.stem.split("-e")[1]))
    (pdir / "manifest-e50.json").write_bytes(manifest.read_bytes())
    assert b.sigterm() == 0
    b.start()
    deadline = time.monotonic() + 20
    res = None
    while time.monotonic() < deadline:
        res = kw.produce_raw(b.addr, topic_name, 0, kw.record_batch_v2([kw.Rec(b"two", key=b"k")]))
        if res.error_code == 0:
            break
        time.sleep(0.2)
    assert res is not None and res.error_code == 0, f"partition never led again: {res}"
    assert "fenced by a newer epoch" in b.log_text()
    got = [m.value for m in consume_all(b.bootstrap, topic_name, [0])[0]]
    assert got == [b"one", b"two"], got
    assert leaders([b], topic_name)[0] == b.broker_id


def _epoch_of(name: str) -> int | None:
    """The leader epoch a partition file belongs to (segments, indexes,
    manifests, claims and their temps all carry `-e<E>` in the name)."""
    m = re.search(r"-e(\d+)\.", name)
    return int(m.group(1)) if m else None


def _produce_until_ok(b, topic, part, value, timeout=15.0):
    """A leader named in Metadata may still be recovering (56) for a moment."""
    deadline = time.monotonic() + timeout
    while True:
        r = kw.produce_raw(b.addr, topic, part, kw.record_batch_v2([kw.Rec(value, key=b"k")]))
        if r.error_code == 0 or time.monotonic() > deadline:
            return r
        time.sleep(0.2)


def _snapshot(pdir) -> dict[str, tuple[int, str]]:
    import hashlib
    out = {}
    for p in sorted(pdir.iterdir()):
        if p.is_file():
            data = p.read_bytes()
            out[p.name] = (len(data), hashlib.sha256(data).hexdigest())
    return out


def test_a_zombie_leader_writes_nothing_after_its_lease(broker_factory, topic_name):
    """Issue 12, "no write after the lease": SIGSTOP a leader whose segment
    is due to roll by age (segment.ms=1 s), keep it stopped past its lease
    until the other broker leads the partition, queue a produce to it, then
    SIGCONT. Nothing of the zombie's epoch (or below) — segment, index,
    manifest, claim, temp — changes or appears in the partition directory
    afterwards: the write capability refuses once the lease has lapsed."""
    bs = broker_factory.cluster(2, FAST + ["--segment-ms", "1000"])
    create_everywhere(bs, topic_name, 2)
    ctl = controller_id(bs)
    ls = leaders(bs, topic_name)
    part = next((p for p, l in ls.items() if l != ctl), None)
    if part is None:
        pytest.skip(f"controller leads every partition: {ls}")
    zombie = next(b for b in bs if b.broker_id == ls[part])
    other = next(b for b in bs if b is not zombie)
    # Written and fsynced, so the active segment is non-empty and rolls by age.
    first = _produce_until_ok(zombie, topic_name, part, b"before")
    assert first.error_code == 0, first
    # The volume itself (on weakfs the backing directory, not one host's
    # cached view of it).
    mount = getattr(other, "weakfs", None)
    pdir = (mount.backing / topic_name / str(part)) if mount else other.partition_dir(topic_name, part)
    zepoch = max(e for e in map(_epoch_of, (p.name for p in pdir.iterdir())) if e is not None)
    sock = kw.connect(zombie.addr, timeout=60)
    zombie.proc.send_signal(signal.SIGSTOP)
    try:
        sock.sendall(kw.frame(kw.produce_request_v3(
            12, topic_name, part, kw.record_batch_v2([kw.Rec(b"zombie", key=b"k")]), -1)))
        wait_leaders([other], topic_name, 2, {other.broker_id}, timeout=20)
        after = _produce_until_ok(other, topic_name, part, b"after")
        assert after.error_code == 0, after
        # Past segment.ms as well: the zombie's timer has a roll due on waking.
        time.sleep(1.5)
        before = _snapshot(pdir)
        assert any((_epoch_of(n) or 0) > zepoch for n in before), \
            f"the new leader never opened above epoch {zepoch}: {sorted(before)}"
    finally:
        zombie.proc.send_signal(signal.SIGCONT)
    cid, results = kw.parse_produce_response_v3(kw.recv_frame(sock))
    sock.close()
    assert cid == 12 and results[0].error_code == 6, results
    time.sleep(3.0)
    now = _snapshot(pdir)
    changed = {n: (before.get(n), v) for n, v in now.items()
               if (e := _epoch_of(n)) is not None and e <= zepoch and before.get(n) != v}
    assert not changed, f"the zombie (epoch {zepoch}) wrote after its lease: {changed}"
    assert re.search(r"lease lapsed", zombie.log_text()), "zombie did not notice its lapse"
    got = [m.value for m in consume_all(other.bootstrap, topic_name, [part])[part]]
    assert b"zombie" not in got and b"before" in got and b"after" in got, got


@pytest.mark.parametrize("stagger", [0.0, 0.3, "exit"])
def test_whole_cluster_sigterm_exits_within_seconds(broker_factory, topic_name, stagger):
    """SIGTERM every broker under acks=all load — all at once, the
    controller first and the others `stagger` s later, or the others right
    after the controller has exited ("exit": it resigned, and the others
    start leaving before one of them is elected, so nobody is left to vacate
    their partitions): every broker exits 0 within ~3 s, not the 15 s
    shutdown timeout, and a restarted cluster serves every acknowledged
    record."""
    bs = broker_factory.cluster(3, FAST)
    create_everywhere(bs, topic_name, 6)
    with Ledger(bootstrap(bs), topic_name, 6) as led:
        led.wait_acks(300)
        ctl = controller_id(bs)
        order = sorted(bs, key=lambda b: b.broker_id != ctl)
        t0 = time.monotonic()
        for i, b in enumerate(order):
            b.proc.send_signal(signal.SIGTERM)
            if i == 0 and stagger == "exit":
                b.proc.wait(timeout=30)
            elif i == 0 and stagger:
                time.sleep(stagger)
        took = {}
        for b in order:
            rc = b.proc.wait(timeout=30)
            took[b.name] = round(time.monotonic() - t0, 2)
            assert rc == 0, f"{b.name} exited {rc}\n{b.log_tail()}"
        print(f"whole-cluster SIGTERM (stagger {stagger}s): exit after {took}")
        assert max(took.values()) < 3.0 + (stagger if stagger != "exit" else 0), took
        # The producer queued and retried while the cluster was down.
        for b in bs:
            b.spawn()
        for b in bs:
            b.wait_ready()
        wait_leaders(bs, topic_name, 6, {0, 1, 2})
        led.wait_acks(300)
    assert not led.errors, led.errors[:5]
    check_ledger(bs, led)
