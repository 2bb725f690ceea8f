"""Advertised versions a newer client actually sends (issue 27, item 3, in part).

A client that has seen Produce v13 takes the broker for Kafka 4.x and sends
FindCoordinator v6; kaas advertised 0-4, and kafka-python 3.0 pinned to
api_version (3, 9) had its connection closed ~11,000 times in one run: every
group test failed. (The kafka-python in this repository's venv, 2.3, stops at
an older FindCoordinator even when pinned, so the test speaks the wire.)
FindCoordinator v5 and v6 keep v4's schema (v6 adds key type 2, share
groups, which a broker without them refuses per key with INVALID_REQUEST).
"""

from __future__ import annotations

import time

import kafka_wire as w

FIND_COORDINATOR = 10
INVALID_REQUEST = 42


def find_coordinator_v6(addr, key_type: int, keys: list[str]) -> list[tuple[str, int, int]]:
    """(key, node id, error code) per key, FindCoordinator v6 on the wire."""
    body = (w.request_header(FIND_COORDINATOR, 6, 7, flexible=True)
            + w.i8(key_type)
            + w.compact_array([w.compact_string(k) for k in keys])
            + w.TAGS_NONE)
    with w.connect(addr) as s:
        r = w.Reader(w.roundtrip(s, body))
    assert r.i32() == 7  # correlation id
    r.skip_tags()
    r.i32()  # throttle_time_ms
    out = []
    for _ in range(r.compact_array_len()):
        key = r.compact_string()
        node = r.i32()
        r.compact_string()  # host
        r.i32()  # port
        err = r.i16()
        r.compact_string()  # error message
        r.skip_tags()
        out.append((key, node, err))
    return out


def test_find_coordinator_v6_answers_groups_and_refuses_share_keys(broker):
    """Was: v6 not advertised, the connection closed without an answer."""
    deadline = time.monotonic() + 20
    while True:
        got = find_coordinator_v6(broker.addr, 0, ["g1", "g2"])
        if all(err == 0 for _, _, err in got) or time.monotonic() > deadline:
            break
        time.sleep(0.2)  # coordinator shards loading
    assert [(k, n, e) for k, n, e in got] == [("g1", broker.broker_id, 0), ("g2", broker.broker_id, 0)]
    assert find_coordinator_v6(broker.addr, 2, ["share"]) == [("share", -1, INVALID_REQUEST)]


DESCRIBE_GROUPS = 15
GROUP_ID_NOT_FOUND = 69


def describe_groups(addr, version: int, groups: list[str]) -> list[tuple]:
    """(error code, error message, group id, state) per group, DescribeGroups
    v5 or v6 (both flexible) on the wire."""
    body = (w.request_header(DESCRIBE_GROUPS, version, 9, flexible=True)
            + w.compact_array([w.compact_string(g) for g in groups])
            + w.i8(0)  # include_authorized_operations
            + w.TAGS_NONE)
    with w.connect(addr) as s:
        r = w.Reader(w.roundtrip(s, body))
    assert r.i32() == 9
    r.skip_tags()
    r.i32()  # throttle_time_ms
    out = []
    for _ in range(r.compact_array_len()):
        err = r.i16()
        msg = r.compact_string() if version >= 6 else None
        gid = r.compact_string()
        state = r.compact_string()
        r.compact_string()  # protocol type
        r.compact_string()  # protocol data
        assert r.compact_array_len() == 0  # members
        r.i32()  # authorized operations
        r.skip_tags()
        out.append((err, msg, gid, state))
    return out


def test_describe_groups_v6_answers_an_unknown_group_group_id_not_found(broker):
    """Was: v6 not advertised (kafka-python 3 pinned to 4.0 sends it). v6
    (KIP-1043) answers GROUP_ID_NOT_FOUND with a message where v5 answers a
    Dead group without error."""
    deadline = time.monotonic() + 20
    while True:
        got = describe_groups(broker.addr, 5, ["nobody"])
        if got[0][0] == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)  # coordinator shards loading
    assert got == [(0, None, "nobody", "Dead")]
    assert describe_groups(broker.addr, 6, ["nobody"]) == [
        (GROUP_ID_NOT_FOUND, "Group nobody not found.", "nobody", "Dead")]
