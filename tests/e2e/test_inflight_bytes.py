"""In-flight memory bounded by bytes (issues 13 and 17): a connection that
sends requests and never reads the answers stops being read once it holds
--conn-inflight-bytes (requests not answered + answers not written), the
broker's gauge `kaas_inflight_bytes` never goes past the declared bound,
other clients are still served, and the stuck connection is closed after
--request-timeout-ms without progress, giving its bytes back.
"""

import re
import socket
import time

import pytest

import kafka_wire as kw
from conftest import assert_healthy

CONN_LIMIT = 1 << 20
# The broker closes a connection whose answer made no progress this long.
# Until the client sees its sends stall, the broker must not have closed it:
# the timeout is far above the time the fill takes (well under a second
# quiet; CI once took over 4 s and the broker reset the connection mid-fill).
REQUEST_TIMEOUT_MS = 10_000
# One frame being read and one answer being written may exceed the limit.
SLACK = 64 << 10


def inflight(broker) -> int:
    m = re.search(r"^kaas_inflight_bytes (\d+)$", broker.metrics(), re.M)
    assert m, "kaas_inflight_bytes missing from /metrics"
    return int(m.group(1))


@pytest.mark.broker_args("--conn-inflight-bytes", str(CONN_LIMIT),
                         "--broker-inflight-bytes", str(64 << 20),
                         "--request-timeout-ms", str(REQUEST_TIMEOUT_MS))
def test_unread_answers_cannot_hold_more_than_declared(broker):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # Small buffers, so the kernel holds little of what the broker wrote.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    s.connect(broker.addr)
    s.settimeout(0.5)
    # ApiVersions v0: a 23-byte frame whose answer is hundreds of bytes.
    req = kw.frame(kw.request_header(18, 0, 1))
    batch = req * 256
    sent = 0
    peak = 0
    t0 = time.monotonic()
    stalled = False
    while time.monotonic() < t0 + 20:
        try:
            n = s.send(batch)
            sent += n
        except socket.timeout:
            # The broker stopped reading us: it is at its limit.
            stalled = True
            break
        except ConnectionResetError:
            pytest.fail(f"the broker closed the connection {time.monotonic() - t0:.1f} s "
                        f"into the fill ({sent} bytes sent) before it stopped reading")
    assert stalled, f"the broker kept reading ({sent} bytes) from a client that reads nothing"
    for _ in range(10):
        peak = max(peak, inflight(broker))
        time.sleep(0.1)
    assert peak > CONN_LIMIT // 2, f"in-flight {peak} B: the requests should hold the budget"
    assert peak <= CONN_LIMIT + SLACK, f"in-flight {peak} B > declared {CONN_LIMIT} B"
    # Everyone else is still served meanwhile.
    assert_healthy(broker)
    # The answer nobody takes closes the connection; the bytes come back.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and inflight(broker) > 0:
        time.sleep(0.2)
    assert inflight(broker) == 0, "a stuck connection kept its in-flight bytes"
    s.close()
    broker.assert_no_panic()


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        m = re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M)
    assert m, "VmRSS missing"
    return int(m.group(1)) << 10


# Default flags: 32 MiB per connection, 256 MiB per broker.
BROKER_DEFAULT = 256 << 20


def test_unread_fetch_answers_stay_within_the_broker_budget(broker):
    """The issue's case: consumers that never read their Fetch answers. Each
    answer was built and held whole (60 such connections took a broker from
    32 MB to 2.6 GB); now every answer is charged to the broker's budget
    before it is built, so 16 connections asking for 30 MiB each hold at most
    the declared 256 MiB, and other clients are still served."""
    from confluent_kafka import Producer

    from conftest import create_topic
    create_topic(broker.bootstrap, "big", 1)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 50,
                  "message.max.bytes": 2 << 20})
    chunk = b"x" * (100 << 10)
    for _ in range(300):  # ~30 MiB
        p.produce("big", chunk, partition=0)
        p.poll(0)
    assert p.flush(60) == 0
    base = rss_bytes(broker.pid)
    socks = []
    try:
        for i in range(16):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(broker.addr)
            s.sendall(kw.frame(kw.fetch_request(100 + i, 4, "big", 0, 0,
                                                max_bytes=50 << 20)))
            socks.append(s)
        peak = 0
        for _ in range(30):
            peak = max(peak, rss_bytes(broker.pid) - base)
            time.sleep(0.1)
        assert peak <= BROKER_DEFAULT + (64 << 20), (
            f"16 unread fetch answers grew the broker by {peak >> 20} MiB "
            f"(declared bound {BROKER_DEFAULT >> 20} MiB)")
        assert inflight(broker) <= BROKER_DEFAULT + SLACK
        assert_healthy(broker)
    finally:
        for s in socks:
            s.close()
    broker.assert_no_panic()
