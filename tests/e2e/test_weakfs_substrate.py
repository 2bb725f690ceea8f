"""The broker on a weakfs mount with NFS client behaviours that the plain
substrate variants ([weakfs] ids elsewhere) leave off: a host cut off from
its volume, and lost replies. See the weakfs crate docs for what each
behaviour models (nfs(5), RFC 8881, the Linux NFS client)."""

import signal
import subprocess
import time

import pytest
from confluent_kafka import Producer

from conftest import consume_all, create_topic, producer_conf, wait_until
from kafka_wire import Rec, produce_raw, record_batch_v2

KAFKA_STORAGE_ERROR = 56

pytestmark = pytest.mark.substrates("weakfs")


def produce_one(broker, topic, value: bytes):
    """error code of an acks=all produce of one record, or the exception
    (timeout, reset) if no answer came."""
    try:
        return produce_raw(broker.addr, topic, 0, record_batch_v2([Rec(value=value)])).error_code
    except (OSError, AssertionError) as e:  # socket.timeout is an OSError
        return repr(e)


def test_cut_off_volume_never_acks_and_recovers_after_heal(broker, topic_name):
    """DESIGN section 11: a stuck volume must show up as errors, not as a
    broker that acknowledges writes it could not make durable."""
    create_topic(broker.bootstrap, topic_name, 1)
    assert produce_one(broker, topic_name, b"before") == 0

    broker.weakfs.cut()
    try:
        outcomes = [produce_one(broker, topic_name, b"cut-%d" % i) for i in range(2)]
    finally:
        broker.weakfs.heal()
    print("cut-off produce outcomes:", outcomes)
    assert 0 not in outcomes, f"acknowledged a produce while the volume was cut off: {outcomes}"
    assert all(o == KAFKA_STORAGE_ERROR or isinstance(o, str) for o in outcomes), outcomes

    deadline = time.monotonic() + 30
    last = None
    while time.monotonic() < deadline:
        last = produce_one(broker, topic_name, b"after")
        if last == 0:
            break
        time.sleep(0.5)
    assert last == 0, f"no successful produce within 30 s of healing the volume: {last}"
    assert broker.alive()
    values = [m.value for m in consume_all(broker.bootstrap, topic_name, [0], timeout=30)[0]]
    assert values[0] == b"before" and values[-1] == b"after", values


# Reply loss high enough that segment rolls, index and manifest writes hit it
# every run; seeded, but broker threads interleave so the exact ops vary.
LOSSY = ["--nfs", "--actimeo-ms", "3000", "--lost-reply-prob", "0.25", "--seed", "7"]


# Regression: lost replies (EEXIST from our own exclusive create, ENOENT from
# our own rename) used to fail the partition leader; write_atomic and topic
# create now check, per DESIGN section 11.
def test_lost_replies_do_not_fail_the_partition_leader(broker_factory, topic_name):
    b = broker_factory(["--retention-check-interval-ms", "500"], start=False, weakfs_args=LOSSY)
    b.start()
    create_topic(b.bootstrap, topic_name, 1, config={"segment.bytes": "16384"})
    p = Producer(producer_conf(b.bootstrap, **{"linger.ms": 0, "batch.size": 4096,
                                               "message.timeout.ms": 20000}))
    errs = []
    for i in range(400):
        p.produce(topic_name, value=b"%06d" % i + b"x" * 200, partition=0,
                  on_delivery=lambda err, msg: err and errs.append(err))
        p.poll(0)
    assert p.flush(30) == 0
    assert not errs, errs[:3]
    wait_until(lambda: b.alive(), 1)
    failures = [line for line in b.log_text().splitlines()
                if "partition leader failed" in line or "partition open failed" in line]
    assert not failures, "\n".join(failures[:5])


def test_weakfs_mount_is_nfs_like(broker_factory):
    """The fixture's mount really has the NFS behaviours (silly rename), so a
    [weakfs] pass means something."""
    b = broker_factory(start=False)
    d = b.data_dir / "silly"
    d.mkdir()
    f = d / "f"
    f.write_bytes(b"x")
    with open(f, "rb") as held:
        f.unlink()
        left = [p.name for p in d.iterdir()]
        assert len(left) == 1 and left[0].startswith(".nfs"), left
        with pytest.raises(OSError) as e:
            d.rmdir()
        assert e.value.errno == 39  # ENOTEMPTY
        assert held.read() == b"x"
    # The last close removes the .nfs file, but a FUSE release (like the NFS
    # client's silly delete) is sent after close() has returned: the
    # directory empties shortly after, not at once.
    deadline = time.monotonic() + 10
    while True:
        try:
            d.rmdir()
            break
        except OSError as e:
            assert e.errno == 39 and time.monotonic() < deadline, e
            time.sleep(0.05)


def test_weakfs_negative_lookups_until_a_listing_names_the_file(broker_factory):
    """Two hosts of one volume: a "no such file" answer is cached by the
    host that got it (an open by name keeps failing after the other host
    created the file), until a listing fetched from the volume names the
    file, as the Linux NFS client's READDIRPLUS primes its dentries. Without
    that, a host could list a manifest and be told it does not exist for a
    whole attribute timeout (the takeover flake this models away)."""
    a, b = broker_factory.cluster(2, start=False)
    (a.data_dir / "d").mkdir()
    probe = a.data_dir / "d" / "f"
    assert not probe.exists()  # host a caches "no such file"
    (b.data_dir / "d" / "f").write_bytes(b"x")  # host b creates it
    assert (b.data_dir / "d" / "f").read_bytes() == b"x"
    with pytest.raises(FileNotFoundError):
        probe.read_bytes()  # the negative entry still answers on host a
    assert [p.name for p in (a.data_dir / "d").iterdir()] == ["f"]
    assert probe.read_bytes() == b"x"  # the listing replaced it


@pytest.mark.timeout(150)
def test_a_silly_renamed_file_delays_the_removal_not_the_recreate(broker, topic_name):
    """A file of a deleted topic held open on the broker's own host (a
    reader, a backup agent): unlinking it silly-renames it to `.nfsXXXX`,
    which keeps the renamed-aside directory busy. The delete is still
    answered, a re-create under the same name is a new, empty incarnation
    at once, and once the file is closed the janitor's re-driven removal
    finishes (it runs every 30 s)."""
    from conftest import admin
    create_topic(broker.bootstrap, topic_name, 1)
    assert produce_one(broker, topic_name, b"old") == 0
    pdir = broker.data_dir / topic_name / "0"
    seg = next(p for p in pdir.iterdir() if p.name.endswith(".log"))
    held = open(seg, "rb")

    def aside():
        return [p for p in broker.data_dir.iterdir() if p.name.startswith(".deleted-")]
    try:
        a = admin(broker.bootstrap)
        a.delete_topics([topic_name], operation_timeout=30)[topic_name].result(timeout=40)
        wait_until(lambda: aside(), timeout=30, what="the directory renamed aside")
        wait_until(lambda: any(q.name.startswith(".nfs") for d in aside() for q in d.rglob("*")),
                   timeout=30, what="the held segment silly-renamed inside it")
        create_topic(broker.bootstrap, topic_name, 1)
        assert produce_one(broker, topic_name, b"new") == 0
        values = [m.value for m in consume_all(broker.bootstrap, topic_name, [0], timeout=30)[0]]
        assert values == [b"new"], values
        assert b"old" in held.read()  # the holder still reads the old bytes
        assert aside(), "removed while a file in it was held open"
    finally:
        held.close()
    wait_until(lambda: not aside(), timeout=75, what="the janitor finishes the removal")
    assert broker.alive()


SHUTDOWN_TIMEOUT_MS = 2000
SHUTDOWN_FLOOR_S = 3  # server::SHUTDOWN_FLOOR
SHUTDOWN_CUT_SHORT = 4  # server::SHUTDOWN_CUT_SHORT


@pytest.mark.parametrize("brokers", [1, 2])
def test_sigterm_on_a_hung_volume_gives_up_within_its_bound(broker_factory, topic_name, brokers):
    """Issue 30 item 4: a SIGTERM's controlled shutdown flushes, closes and
    heartbeats through the volume; on a volume that stops answering (the
    FUSE server stopped, as an NFS server that hangs) it waited for ever.
    Now it gives up within --shutdown-timeout-ms + 3 s: the lease ends (so
    nothing of the process writes again), a WARN says so, and the process
    exits with code 4 and no clean-exit record as soon as the kernel lets
    it (a thread waiting on a hung mount's writeback cannot die before the
    mount answers: nothing can make a process in that wait exit). With a
    second broker the hand-off's own checks read the hung volume on the
    shutdown's thread, so the bound is kept by a thread of its own."""
    args = ["--shutdown-timeout-ms", str(SHUTDOWN_TIMEOUT_MS)]
    if brokers == 1:
        broker = broker_factory(args)
    else:
        broker, _other = broker_factory.cluster(2, args)
    create_topic(broker.bootstrap, topic_name, 4)
    assert produce_one(broker, topic_name, b"before") == 0
    fuse = broker.weakfs.proc
    fuse.send_signal(signal.SIGSTOP)
    bound = SHUTDOWN_TIMEOUT_MS / 1000 + SHUTDOWN_FLOOR_S
    try:
        time.sleep(0.5)
        t0 = time.monotonic()
        broker.proc.send_signal(signal.SIGTERM)
        # The log is outside the mount.
        wait_until(lambda: "controlled shutdown did not finish" in broker.log_text(),
                   bound + 5, what="the give-up WARN")
        took = time.monotonic() - t0
    finally:
        fuse.send_signal(signal.SIGCONT)
    assert took < bound + 2, f"gave up {took:.1f} s after SIGTERM (bound {bound} s)"
    try:
        code = broker.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        broker.kill9()
        pytest.fail("no exit within 20 s of the volume answering again")
    assert code == SHUTDOWN_CUT_SHORT, (code, broker.log_tail())
    broker.assert_no_panic()
