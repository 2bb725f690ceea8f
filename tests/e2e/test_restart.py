"""Produce, stop (SIGTERM or kill -9), restart on the same data dir: all
records are still there, offsets continue, and the topic id is unchanged."""

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from conftest import client_conf, consume_all, create_topic, producer_conf

# Run on a local dir and on a weakfs (NFS-like) mount: see conftest.py.
pytestmark = pytest.mark.substrates("local", "weakfs")

PARTITIONS = 2
N = 1000


def produce(bootstrap, topic, lo, hi):
    p = Producer(producer_conf(bootstrap))
    offs = {}

    def cb(err, msg):
        assert err is None, err
        offs[int(msg.value())] = (msg.partition(), msg.offset())

    for i in range(lo, hi):
        p.produce(topic, value=b"%d" % i, partition=i % PARTITIONS, on_delivery=cb)
        p.poll(0)
    assert p.flush(30) == 0
    assert len(offs) == hi - lo
    return offs


def topic_id(bootstrap, topic):
    a = AdminClient(client_conf(bootstrap))
    from confluent_kafka import TopicCollection
    d = a.describe_topics(TopicCollection([topic]), request_timeout=20)[topic].result(timeout=30)
    assert d.topic_id is not None
    return str(d.topic_id)


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_restart_keeps_data_and_topic_id(broker, topic_name, how):
    create_topic(broker.bootstrap, topic_name, PARTITIONS)
    offs = produce(broker.bootstrap, topic_name, 0, N)
    stamp = broker.topic_dir(topic_name) / ".topic-id.json"
    assert stamp.is_file(), f"missing {stamp}"
    stamp_before = stamp.read_bytes()
    tid_before = topic_id(broker.bootstrap, topic_name)
    assert tid_before not in ("", "AAAAAAAAAAAAAAAAAAAAAA"), "zero topic id"

    if how == "sigterm":
        assert broker.sigterm() == 0, "non-zero exit on SIGTERM"
    else:
        broker.kill9()
    broker.start()

    assert stamp.read_bytes() == stamp_before
    assert topic_id(broker.bootstrap, topic_name) == tid_before

    # offsets continue where they left off
    offs2 = produce(broker.bootstrap, topic_name, N, N + 100)
    for part in range(PARTITIONS):
        before = max(o for p_, o in offs.values() if p_ == part)
        after = sorted(o for p_, o in offs2.values() if p_ == part)
        assert after == list(range(before + 1, before + 1 + len(after)))

    got = consume_all(broker.bootstrap, topic_name, PARTITIONS, timeout=30)
    for part in range(PARTITIONS):
        vals = [int(m.value) for m in got[part]]
        assert vals == [i for i in range(N + 100) if i % PARTITIONS == part]
        for m in got[part]:
            want = (offs.get(int(m.value)) or offs2[int(m.value)])
            assert (part, m.offset) == want


def test_a_clean_sigterm_logs_no_error(broker, topic_name):
    """A clean exit revokes the lease, then publishes clean_exit: that last
    heartbeat lands after the lease ended on purpose and is not an ERROR
    (ERROR means someone must act)."""
    create_topic(broker.bootstrap, topic_name, PARTITIONS)
    produce(broker.bootstrap, topic_name, 0, 10)
    assert broker.sigterm() == 0
    errors = [l for l in broker.log_text().splitlines() if " ERROR " in l]
    assert not errors, "\n".join(errors)


def test_a_lone_broker_shutting_down_restarts_no_partition(broker, topic_name):
    """A broker shutting down starts no leader: the watcher's periodic
    re-apply (every 20 polls) used to restart every partition a lone broker
    had just stopped, and their closes after the lease was revoked logged
    ERROR "lease lapsed". 400 partitions make the shutdown span a re-apply."""
    create_topic(broker.bootstrap, topic_name, 400, timeout=120)
    produce(broker.bootstrap, topic_name, 0, 10)
    assert broker.sigterm() == 0
    log = broker.log_text()
    after = log[log.index("SIGTERM: controlled shutdown"):]
    restarted = [l for l in after.splitlines() if "applied assignment" in l and "started=0" not in l]
    assert not restarted, "\n".join(restarted)
    errors = [l for l in log.splitlines() if " ERROR " in l]
    assert not errors, "\n".join(errors[:10])
