"""Load beside a broker, for the lease tests and bench/lease_stress.py:
a CPU hog, an fsync storm on the data volume and a connection flood. Each
is a context manager that starts its load on entry and stops it for sure
on exit (processes killed, sockets closed, scratch files removed), so a
failing test never leaves load behind. Loopback only."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

# One busy loop per process; killed on exit.
_SPIN = "while True: pass"

# Rewrites one 1 MiB block of a bounded file (32 MiB, cycled) and fdatasyncs
# it, forever: a storm of small synchronous writes on the data volume that
# competes with the broker's own fsyncs without filling the disk.
_STORM = r"""
import os, sys
path = sys.argv[1]
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
block = os.urandom(1 << 20)
i = 0
while True:
    os.pwrite(fd, block, (i % 32) << 20)
    os.fdatasync(fd)
    i += 1
"""


def _kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


@contextlib.contextmanager
def cpu_hog(n: int | None = None):
    """`n` busy processes (default: twice the CPU count) at the broker's
    own priority."""
    n = n or 2 * (os.cpu_count() or 1)
    procs = [subprocess.Popen([sys.executable, "-c", _SPIN]) for _ in range(n)]
    try:
        yield procs
    finally:
        _kill_all(procs)


@contextlib.contextmanager
def fsync_storm(directory: Path, n: int = 2):
    """`n` writers, each fdatasyncing 1 MiB blocks of its own 32 MiB file
    in `directory` (on the broker's data volume) in a loop."""
    directory.mkdir(parents=True, exist_ok=True)
    files = [directory / f"storm-{i}" for i in range(n)]
    procs = [subprocess.Popen([sys.executable, "-c", _STORM, str(f)]) for f in files]
    try:
        yield procs
    finally:
        _kill_all(procs)
        for f in files:
            with contextlib.suppress(FileNotFoundError):
                f.unlink()


@contextlib.contextmanager
def connection_flood(addr: tuple[str, int], n: int):
    """Up to `n` idle TCP connections to `addr`, held open (the broker may
    refuse some at its connection cap; those are not retried)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            try:
                socks.append(socket.create_connection(addr, timeout=5))
            except OSError:
                pass
        yield socks
    finally:
        for s in socks:
            s.close()


def heartbeat_histogram(metrics_text: str) -> tuple[list[tuple[float, int]], int]:
    """The `kaas_heartbeat_seconds` buckets ((le, cumulative count), +Inf
    last as inf) and `kaas_heartbeat_failures_total` from a /metrics page."""
    buckets = []
    failures = 0
    for line in metrics_text.splitlines():
        if line.startswith("kaas_heartbeat_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), int(float(line.rsplit(" ", 1)[1]))))
        elif line.startswith("kaas_heartbeat_failures_total "):
            failures = int(float(line.rsplit(" ", 1)[1]))
    return buckets, failures


def quantile_bound(before: list[tuple[float, int]], after: list[tuple[float, int]], q: float) -> float:
    """Upper bucket bound of quantile `q` of the observations between two
    histogram snapshots (inf when it is in the last bucket; 0 when none)."""
    prev = dict(before)
    deltas = [(le, c - prev.get(le, 0)) for le, c in after]
    total = deltas[-1][1] if deltas else 0
    if total <= 0:
        return 0.0
    for le, c in deltas:
        if c >= q * total:
            return le
    return float("inf")
