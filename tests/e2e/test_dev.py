"""`kaas dev --brokers 3`: the one-command local cluster from the README,
driven with kcat (librdkafka 2.0.2) and confluent-kafka."""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
import time

import pytest

from conftest import client_conf, kaas_bin


def free_run(n: int) -> int:
    """A base port with n consecutive free loopback ports."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65535:
            continue
        try:
            socks = []
            for i in range(n):
                x = socket.socket()
                x.bind(("127.0.0.1", base + i))
                socks.append(x)
            for x in socks:
                x.close()
            return base
        except OSError:
            for x in socks:
                x.close()
    raise RuntimeError("no run of free ports")


def test_dev_runs_a_three_broker_cluster(tmp_path):
    base, mbase = free_run(3), free_run(3)
    log = open(tmp_path / "dev.log", "wb")
    p = subprocess.Popen(
        [str(kaas_bin()), "dev", "--brokers", "3", "--data-dir", str(tmp_path / "data"),
         "--base-port", str(base), "--metrics-base-port", str(mbase),
         "--", "--lease-ms", "1500", "--lease-grace-ms", "500"],
        stdout=log, stderr=log, start_new_session=True)
    try:
        boot = ",".join(f"127.0.0.1:{base + i}" for i in range(3))
        from confluent_kafka.admin import AdminClient
        deadline = time.monotonic() + 30
        md = None
        while time.monotonic() < deadline:
            try:
                md = AdminClient(client_conf(boot)).list_topics(timeout=2)
                if len(md.brokers) == 3 and md.controller_id >= 0:
                    break
            except Exception:
                pass
            time.sleep(0.2)
        assert md is not None and sorted(md.brokers) == [0, 1, 2], md and md.brokers
        if shutil.which("kcat") is None:
            pytest.skip("kcat not installed")
        out = subprocess.run(["kcat", "-b", boot, "-L"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and "3 brokers" in out.stdout, out.stdout + out.stderr
        subprocess.run(["kcat", "-b", boot, "-P", "-t", "devtopic", "-K:"],
                       input="k1:one\nk2:two\nk3:three\n", text=True, check=True, timeout=60)
        got = subprocess.run(["kcat", "-b", boot, "-C", "-t", "devtopic", "-e", "-q", "-f", "%k=%s\n"],
                             capture_output=True, text=True, timeout=60)
        assert got.stdout.split() == ["k1=one", "k2=two", "k3=three"], got.stdout + got.stderr
    finally:
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=60)
        log.close()
    text = (tmp_path / "dev.log").read_text(errors="replace")
    assert rc == 0, text[-3000:]
    assert text.count("stopped (exit status: 0)") == 3, text[-3000:]
    # Every broker line names its broker.
    for i in range(3):
        assert re.search(rf"^b{i} \| .*kaas broker listening on", text, re.M), text[-3000:]
    assert not re.search(r"^\S+Z +(INFO|WARN|ERROR) ", text, re.M), "a broker line without its id"
