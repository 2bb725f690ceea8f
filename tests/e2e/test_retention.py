"""Time-based retention: segment.bytes=16384, retention.ms=1000, broker
checking every 500 ms. After ~1 MB is produced, the log start offset advances
past 0, old segment files disappear from disk, and a consumer reading from the
beginning starts at the new log start offset."""

import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from conftest import client_conf, create_topic, producer_conf, segment_files, wait_until

# Run on a local dir and on a weakfs (NFS-like) mount: see conftest.py.
pytestmark = pytest.mark.substrates("local", "weakfs")

RECORDS = 1000
VALUE = b"r" * 1024


@pytest.mark.broker_args("--retention-check-interval-ms", "500")
@pytest.mark.timeout(120)
def test_time_retention_deletes_old_segments(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 1,
                 config={"segment.bytes": "16384", "retention.ms": "1000",
                         "cleanup.policy": "delete"})
    p = Producer(producer_conf(broker.bootstrap, **{"linger.ms": 0, "batch.size": 4096}))
    for i in range(RECORDS):
        p.produce(topic_name, key=b"%d" % i, value=VALUE, partition=0)
        if i % 50 == 0:
            p.poll(0)
    assert p.flush(30) == 0

    pdir = broker.partition_dir(topic_name, 0)
    segs_before = segment_files(pdir)
    # ~1 MB in 16 KiB segments: the log rolled — several segments exist, or
    # (a slow machine, retention.ms = 1 s) retention already removed the
    # older ones and the newest starts past 0.
    assert len(segs_before) >= 2 or max((b for b, _, _ in segs_before), default=0) > 0, \
        f"expected many segments in {pdir}: {sorted(pdir.parent.rglob('*'))[:20]}"

    c = Consumer(client_conf(broker.bootstrap, **{
        "group.id": "retention-check", "enable.auto.commit": False,
        "auto.offset.reset": "earliest"}))
    try:
        tp = TopicPartition(topic_name, 0)
        lo, hi = c.get_watermark_offsets(tp, timeout=10)
        assert hi == RECORDS, (lo, hi)

        def advanced():
            lo_, hi_ = c.get_watermark_offsets(tp, timeout=10)
            return lo_ if lo_ > 0 else None

        low = wait_until(advanced, timeout=30, interval=0.25,
                         what="log start offset to advance past 0")
        assert low <= RECORDS

        def first_segment_gone():
            segs = segment_files(pdir)
            return all(base > 0 for base, _, _ in segs)

        wait_until(first_segment_gone, timeout=30, interval=0.25,
                   what="segment 00000000000000000000-e*.log to be deleted")
        segs = segment_files(pdir)
        assert all(base > 0 for base, _, _ in segs), segs
        assert not list(pdir.glob("00000000000000000000-e*.log"))
        # no index files left behind for deleted segments
        bases = {base for base, _, _ in segs}
        for idx in list(pdir.glob("*.index")) + list(pdir.glob("*.timeindex")):
            assert int(idx.name[:20]) in bases, f"orphan index {idx.name}; segments {sorted(bases)}"

        low_before, _ = c.get_watermark_offsets(tp, timeout=10)
        if bases:
            assert min(bases) <= low_before, (sorted(bases), low_before)
        if low_before >= RECORDS:
            # everything expired (the active segment too): nothing to read
            return
        c.assign([TopicPartition(topic_name, 0, OFFSET_BEGINNING)])
        first = None
        deadline = time.monotonic() + 20
        while first is None and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                first = m.offset()
        low_after, hi_after = c.get_watermark_offsets(tp, timeout=10)
        assert first is not None, "nothing consumed from the beginning"
        assert hi_after == RECORDS
        assert low_before <= first <= low_after, (low_before, first, low_after)
    finally:
        c.close()
