"""Start-up refusals (issue 13): a broker that could not serve refuses to
start with a clear message, before it joins the cluster or writes anything.
"""

import socket
import subprocess

from conftest import free_port, kaas_bin


def run_broker(tmp_path, *args, timeout=30):
    data = tmp_path / "data"
    r = subprocess.run([str(kaas_bin()), "broker", "--data-dir", str(data),
                        "--metrics-listen", f"127.0.0.1:{free_port()}", *args],
                       capture_output=True, text=True, timeout=timeout,
                       env={"PATH": "/usr/bin:/bin"})
    return r, data


def test_wildcard_listen_without_advertised_listener_is_refused(tmp_path):
    r, data = run_broker(tmp_path, "--listen", f"0.0.0.0:{free_port()}")
    assert r.returncode != 0
    assert "--advertised-listener" in r.stderr and "wildcard" in r.stderr, r.stderr
    assert not (data / "__cluster" / "brokers").exists()


def test_port_in_use_exits_before_joining(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r, data = run_broker(tmp_path, "--listen", f"127.0.0.1:{port}",
                             "--advertised-listener", f"127.0.0.1:{port}")
    assert r.returncode != 0
    assert f"binding 127.0.0.1:{port}" in r.stderr and "in use" in r.stderr, r.stderr
    # Nothing published: no liveness record, no assignment granting it anything.
    assert not (data / "__cluster" / "brokers" / "0.json").exists(), r.stderr
    assert not (data / "__cluster" / "assignment.json").exists(), r.stderr
    assert not (data / "__cluster" / "assignment").exists(), r.stderr
    assert "panicked" not in r.stderr
