"""Leader election end to end: two `kaas-operator` processes against one
in-memory Kubernetes API server (kmock_server.py) and one broker. Exactly
one holds the Lease and reconciles (the other's reconcile count stays 0);
after the leader is killed with SIGKILL (no release), the other takes the
Lease over within the lease duration (plus a retry round) and reconciles;
a gracefully stopped leader hands the Lease back at once.
"""

from __future__ import annotations

import signal
import time

import pytest

from conftest import wait_until
from test_operator import LEASE, Operator, create_kafkatopic, kube_api, ready  # noqa: F401

DURATION_S = 3
RENEW_MS = 2000
RETRY_MS = 500
FAST_LEASE = {
    "KAAS_OPERATOR_LEASE_DURATION_SECONDS": str(DURATION_S),
    "KAAS_OPERATOR_LEASE_RENEW_DEADLINE_MS": str(RENEW_MS),
    "KAAS_OPERATOR_LEASE_RETRY_MS": str(RETRY_MS),
    "KAAS_OPERATOR_RESYNC_SECONDS": "2",
}


def holder(api) -> str | None:
    lease = api.call("GET", f"{LEASE}/kaas-operator")
    return ((lease or {}).get("spec") or {}).get("holderIdentity")


def leading(op: Operator) -> bool:
    return op.metric("kaas_operator_leader") == 1


def wait_ready(api, name: str, timeout: float = 30) -> None:
    wait_until(lambda: ready(api.get(name)) == ("True", "Ready"), timeout, what=f"{name} Ready")


@pytest.mark.timeout(180)
def test_two_operators_one_reconciles_and_the_other_takes_over_after_kill9(
        broker, kube_api, tmp_path):
    api = kube_api
    create_kafkatopic(api, "orders", {"partitions": 1})
    ops = {n: Operator(api, broker, tmp_path, n, POD_NAME=n, **FAST_LEASE)
           for n in ("op-a", "op-b")}
    try:
        wait_ready(api, "orders")
        leader = ops[wait_until(lambda: holder(api), 10, what="a lease holder")]
        standby = next(o for o in ops.values() if o is not leader)
        # Exactly one reconciles, for several lease durations and through
        # new work, and the standby never counts itself leader.
        create_kafkatopic(api, "payments", {"partitions": 2})
        deadline = time.monotonic() + 3 * DURATION_S
        while time.monotonic() < deadline:
            assert leading(leader) and not leading(standby)
            assert standby.reconciles() == 0, standby.log()
            assert holder(api) == leader.name
            time.sleep(0.2)
        wait_ready(api, "payments")
        assert leader.reconciles() > 0 and standby.reconciles() == 0, standby.log()
        assert (broker.data_dir / "payments").is_dir()

        # kill -9: no release; the standby waits out the lease, then leads.
        killed = time.monotonic()
        leader.proc.send_signal(signal.SIGKILL)
        leader.proc.wait(10)
        wait_until(lambda: holder(api) == standby.name and leading(standby),
                   DURATION_S + 10, what="the standby takes the lease over")
        took = time.monotonic() - killed
        # Not before the lease expired (the last renewal was at most one
        # retry before the kill) ...
        assert took >= DURATION_S - 2 * RETRY_MS / 1000, took
        # ... and within the duration plus the rounds that notice it (and
        # this test's 0.05 s polling and a loaded machine's slack).
        assert took <= DURATION_S + 2 * RETRY_MS / 1000 + 2.0, took
        create_kafkatopic(api, "after", {"partitions": 1})
        wait_ready(api, "after")
        assert standby.reconciles() > 0
        assert (broker.data_dir / "after").is_dir()
        lease = api.call("GET", f"{LEASE}/kaas-operator")
        assert lease["spec"]["leaseTransitions"] >= 1
        assert lease["spec"]["leaseDurationSeconds"] == DURATION_S
    except BaseException:
        for o in ops.values():
            print(f"--- {o.name}\n{o.log()}")
        raise
    finally:
        for o in ops.values():
            o.stop()


@pytest.mark.timeout(120)
def test_a_stopped_leader_hands_the_lease_back(broker, kube_api, tmp_path):
    """SIGTERM: the leader stops reconciling, then releases the Lease, so
    the standby leads well before the lease would have expired."""
    api = kube_api
    create_kafkatopic(api, "orders", {"partitions": 1})
    env = {**FAST_LEASE, "KAAS_OPERATOR_LEASE_DURATION_SECONDS": "30",
           "KAAS_OPERATOR_LEASE_RENEW_DEADLINE_MS": "20000"}
    ops = {n: Operator(api, broker, tmp_path, n, POD_NAME=n, **env) for n in ("op-a", "op-b")}
    try:
        wait_ready(api, "orders")
        leader = ops[wait_until(lambda: holder(api), 10, what="a lease holder")]
        standby = next(o for o in ops.values() if o is not leader)
        stopped = time.monotonic()
        leader.stop()
        assert leader.proc.returncode == 0, leader.log()
        wait_until(lambda: holder(api) == standby.name and leading(standby), 15,
                   what="the standby takes the released lease")
        assert time.monotonic() - stopped < 15, "waited for expiry: the lease was not released"
        assert "lease released" in leader.log_path.read_text()
    except BaseException:
        for o in ops.values():
            print(f"--- {o.name}\n{o.log()}")
        raise
    finally:
        for o in ops.values():
            o.stop()
