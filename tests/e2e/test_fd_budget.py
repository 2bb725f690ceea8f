"""The file-descriptor budget (issue 13): a broker started under a small
`RLIMIT_NOFILE` and flooded with idle connections keeps its lease, answers
Metadata and acknowledges produces. Connections beyond its budget are closed
at accept; the accept loop neither spins nor logs each failure."""

import re
import socket
import time

from confluent_kafka.admin import AdminClient

from conftest import client_conf, create_topic, produce_and_check

NOFILE = 256
FLOOD = 400


def test_connection_flood_under_small_fd_limit_keeps_the_lease(broker_factory, topic_name):
    b = broker_factory(start=False)
    orig = b.argv
    b.argv = lambda: ["prlimit", f"--nofile={NOFILE}:{NOFILE}", "--", *orig()]
    b.start()
    create_topic(b.bootstrap, topic_name, 1)
    assert re.search(r"file-descriptor budget.*limit=256", b.log_text()), b.log_tail()

    socks = []
    try:
        for _ in range(FLOOD):
            try:
                socks.append(socket.create_connection(b.addr, timeout=5))
            except OSError:
                pass
        # Hold the flood for two leases (3 s each by default).
        time.sleep(7)
        md = AdminClient(client_conf(b.bootstrap)).list_topics(timeout=10)
        assert topic_name in md.topics and md.topics[topic_name].error is None
        produce_and_check(b.bootstrap, topic_name)
    finally:
        for s in socks:
            s.close()
    assert b.alive()
    log = b.log_text()
    for bad in ("lease lapsed", "fenced", "heartbeat write failed", "Too many open files"):
        assert bad not in log, f"{bad!r} in the broker log\n" + b.log_tail()
    # Refusals are logged once per interval with a count, not per connection.
    refusals = log.count("connection limit reached")
    assert 1 <= refusals <= 3, b.log_tail()
    b.assert_no_panic()
