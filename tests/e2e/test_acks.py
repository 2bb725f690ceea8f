"""acks=0, acks=1 and acks=all each produce and read back."""

import pytest
from confluent_kafka import Producer

from conftest import consume_all, create_topic, producer_conf

pytestmark = pytest.mark.substrates("local", "weakfs")

N = 2000


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_acks_roundtrip(broker, topic_name, acks):
    create_topic(broker.bootstrap, topic_name, 1)
    p = Producer(producer_conf(broker.bootstrap, acks=acks))
    reports = []

    def on_delivery(err, msg):
        reports.append((err, msg.offset()))

    values = [b"acks-%s-%05d" % (acks.encode(), i) for i in range(N)]
    for v in values:
        p.produce(topic_name, value=v, partition=0, on_delivery=on_delivery)
        p.poll(0)
    assert p.flush(30) == 0
    assert len(reports) == N
    errs = [e for e, _ in reports if e is not None]
    assert not errs, errs[:5]
    if acks != "0":
        # acks>=1: the broker reports the assigned offsets, 0..N-1 in order
        assert [o for _, o in reports] == list(range(N))

    if acks == "0":
        # acks=0 gets no response; wait (bounded) until the records are visible
        msgs = consume_all(broker.bootstrap, topic_name, [0], timeout=30, min_counts={0: N})[0]
    else:
        msgs = consume_all(broker.bootstrap, topic_name, [0], timeout=30)[0]
    assert [m.value for m in msgs] == values
    assert [m.offset for m in msgs] == list(range(N))
