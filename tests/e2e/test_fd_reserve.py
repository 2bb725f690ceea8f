"""Descriptors kept for the control plane (issue 13): the connection budget
bounds connections in the steady state, but a burst of new connections
evicting idle ones runs ahead of the evicted sockets' closes. Under a low
`RLIMIT_NOFILE` and repeated bursts the broker must never run out of
descriptors (the heartbeat would fail with EMFILE and the lease lapse):
new connections are closed while few descriptors are free, the lease never
lapses, and clients get service again once the flood ends."""

import os
import re
import socket
import threading
import time

from conftest import create_topic, produce_and_check

NOFILE = 256
BURST = 300
ROUNDS = 8


def open_many(addr, n, out):
    for _ in range(n):
        try:
            s = socket.create_connection(addr, timeout=5)
            out.append(s)
        except OSError:
            pass


def test_connection_bursts_never_take_the_heartbeats_descriptors(broker_factory, topic_name):
    b = broker_factory(start=False)
    orig = b.argv
    b.argv = lambda: ["prlimit", f"--nofile={NOFILE}:{NOFILE}", "--", *orig()]
    b.start()
    create_topic(b.bootstrap, topic_name, 4)
    peak = [0]
    stop = threading.Event()

    def watch_fds():
        while not stop.is_set():
            try:
                peak[0] = max(peak[0], len(os.listdir(f"/proc/{b.pid}/fd")))
            except OSError:
                pass
            time.sleep(0.002)

    watcher = threading.Thread(target=watch_fds, daemon=True)
    watcher.start()
    held = []
    try:
        for _ in range(ROUNDS):
            # Let what is open go idle (evictable), then burst from several
            # threads at once so accepts outrun the evicted sockets' closes.
            time.sleep(1.2)
            socks = []
            threads = [threading.Thread(target=open_many, args=(b.addr, BURST // 4, socks))
                       for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            held.extend(socks)
            # Keep the number of client sockets bounded on our side.
            while len(held) > 2 * BURST:
                held.pop(0).close()
    finally:
        for s in held:
            s.close()
        stop.set()
        watcher.join()
    # After the flood: service as usual.
    produce_and_check(b.bootstrap, topic_name)
    assert b.alive()
    log = b.log_text()
    print(f"peak descriptors {peak[0]} of {NOFILE}")
    for bad in ("lease lapsed", "fenced", "heartbeat write failed", "Too many open files",
                "heartbeat completed after the lease ended"):
        assert bad not in log, f"{bad!r} in the broker log\n" + b.log_tail()
    assert not re.search(r"partition leader open .*epoch=2", log), "a partition changed epoch"
    b.assert_no_panic()
