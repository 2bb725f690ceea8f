"""Shared fixtures for the kaas end-to-end tests.

A `Broker` runs the real broker binary (`$KAAS_BIN`, default
`<repo>/target/release/kaas`) on free loopback ports with a temp data dir,
captures its stderr/stdout to a log file, and on test failure the tail of that
log is attached to the pytest report.

Fixtures:
  broker          a started broker; per-test extra CLI args via
                  @pytest.mark.broker_args("--flag", "value", ...)
  broker_factory  make(extra_args=[...], start=True) -> Broker, for tests
                  that need special flags or several brokers;
                  make.cluster(n, extra_args) -> n brokers (ids 0..n-1) on
                  one shared volume, started together
  topic_name      a unique topic name for the test
  substrate       "local" or "weakfs": what the brokers' data dirs live on.

Substrates: by default a broker's data dir is a plain local directory. With
substrate "weakfs" it is a weakfs FUSE mount (tests/weakfs, one mount per
broker = one NFS "host") over a backing directory, with NFS client behaviours
switched on (`--nfs`: actimeo-like attribute/lookup/listing caching, negative
lookup caching, silly rename, write-back — data invisible to other hosts until
fsync/close — and ESTALE on handles to files another host replaced; see the
weakfs crate docs). Choose it:
  * for a whole module:  pytestmark = pytest.mark.substrates("local", "weakfs")
    (test ids get [local] / [weakfs]); or per test with the same marker;
  * for every test without the marker:  KAAS_E2E_SUBSTRATE=weakfs
Knobs: KAAS_WEAKFS_BIN (default: next to the kaas binary), KAAS_E2E_WEAKFS_ARGS
(default "--nfs --actimeo-ms 3000 --lost-reply-prob 0"), KAAS_E2E_WEAKFS_SEED.
If no FUSE mount can be made here the weakfs variant is skipped with the
reason, never passed. Mounts are unmounted in teardown (fusermount3 -u, then
umount -l), also after a kill -9 of the broker.

Real shared filesystems: substrates "glusterfs" and "cephfs" put the data
dirs on a volume of that filesystem, started once per session by
tests/substrates/<name>.sh (daemons from Debian's packages, loopback only)
and taken down at the end. Every broker gets its own FUSE client of the
volume (a "host"); a cluster's brokers share one directory of it through
their different clients, a lone broker gets a private one; the test's
directory is removed and the clients unmounted in teardown. A volume that
cannot start is skipped with the reason, unless the substrate is named in
KAAS_E2E_REQUIRE_SUBSTRATES (comma-separated; .ci/run sets
"glusterfs,cephfs"), which makes it a failure.

Helpers: create_topic(), wait_topic_ready(), producer_conf(), consume_all(),
produce_and_check(), assert_healthy().
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOG_TAIL_LINES = 80

# ---------------------------------------------------------------------------
# ports
# ---------------------------------------------------------------------------
_handed_out: set[int] = set()


def free_port() -> int:
    """A currently-free TCP port on 127.0.0.1, never handed out twice per run."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError("could not find a free port")


def kaas_bin() -> Path:
    p = os.environ.get("KAAS_BIN")
    if p:
        return Path(p).resolve()
    target = os.environ.get("CARGO_TARGET_DIR")
    return (Path(target) if target else REPO / "target") / "release" / "kaas"


# ---------------------------------------------------------------------------
# Broker
# ---------------------------------------------------------------------------


class BrokerError(AssertionError):
    pass


class Broker:
    def __init__(self, workdir: Path, extra_args: list[str] | None = None,
                 broker_id: int = 0, env: dict[str, str] | None = None,
                 name: str = "broker0", data_dir: Path | None = None):
        self.name = name
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.data_dir = Path(data_dir) if data_dir else self.workdir / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / f"{name}.log"
        self.port = free_port()
        self.metrics_port = free_port()
        self.broker_id = broker_id
        self.extra_args = list(extra_args or [])
        self.env = dict(env or {})
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self._log_offset = 0
        self.weakfs: WeakMount | None = None  # set when the data dir is a weakfs mount

    # -- addresses ---------------------------------------------------------
    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def addr(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def argv(self) -> list[str]:
        return [
            str(kaas_bin()), "broker",
            "--data-dir", str(self.data_dir),
            "--broker-id", str(self.broker_id),
            "--listen", self.bootstrap,
            "--advertised-listener", self.bootstrap,
            "--metrics-listen", f"{self.host}:{self.metrics_port}",
            *self.extra_args,
        ]

    # -- lifecycle ---------------------------------------------------------
    def start(self, timeout: float = 30.0) -> "Broker":
        self.spawn()
        self.wait_ready(timeout)
        return self

    def spawn(self) -> "Broker":
        """Start the process without waiting for its listener."""
        assert not self.alive(), "broker already running"
        binary = kaas_bin()
        if not binary.exists():
            raise BrokerError(f"broker binary {binary} does not exist (set KAAS_BIN or cargo build --release)")
        env = {k: v for k, v in os.environ.items() if not k.startswith("KAAS_")}
        env.setdefault("RUST_BACKTRACE", "1")
        env.setdefault("RUST_LOG", "info")
        # Tests expect a broker that joins or comes back to get its share
        # at once (the production default waits 60 s of stable membership
        # and a 10% imbalance: test_cluster_balance covers that).
        env["KAAS_REBALANCE_DELAY_MS"] = "0"
        env["KAAS_REBALANCE_THRESHOLD_PERCENT"] = "0"
        env.update(self.env)
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== e2e: start #{self.starts}: {' '.join(self.argv())}\n".encode())
            log.flush()
            self._log_offset = log.tell()
            self.proc = subprocess.Popen(
                self.argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                cwd=self.workdir, env=env, start_new_session=True)
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrokerError(
                    f"{self.name} exited with code {self.proc.returncode} during startup\n"
                    + self.log_tail())
            try:
                with socket.create_connection(self.addr, timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise BrokerError(f"{self.name} did not accept connections on {self.bootstrap} "
                          f"within {timeout}s\n" + self.log_tail())

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """SIGKILL the broker and reap it."""
        if not self.alive():
            return
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def sigterm(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait for a graceful exit. Fails (after SIGKILL) if the
        broker does not exit within `timeout`. Returns the exit code."""
        assert self.alive(), f"{self.name} is not running"
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill9()
            raise BrokerError(f"{self.name} did not exit within {timeout}s of SIGTERM\n"
                              + self.log_tail())

    def restart(self, how: str = "sigterm", timeout: float = 30.0) -> "Broker":
        """Stop (sigterm|kill9) and start again on the same data dir and ports."""
        if self.alive():
            if how == "kill9":
                self.kill9()
            else:
                self.sigterm()
        return self.start(timeout)

    def stop(self) -> None:
        """Best-effort shutdown for teardown: SIGTERM, then SIGKILL."""
        if not self.alive():
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill9()

    # -- introspection -----------------------------------------------------
    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        text = self.log_text().splitlines()
        return f"----- last {min(lines, len(text))} lines of {self.log_path} -----\n" + \
            "\n".join(text[-lines:])

    def assert_no_panic(self) -> None:
        text = self.log_text()
        assert "panicked" not in text, f"{self.name} panicked:\n" + self.log_tail()

    def metrics(self, timeout: float = 5.0) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=timeout) as r:
            assert r.status == 200
            return r.read().decode()

    def topic_dir(self, topic: str) -> Path:
        return self.data_dir / topic

    def partition_dir(self, topic: str, partition: int) -> Path:
        return self.data_dir / topic / str(partition)

    def proc_status(self, field: str) -> str:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return line.split(":", 1)[1].strip()
        raise KeyError(field)


# ---------------------------------------------------------------------------
# substrates
# ---------------------------------------------------------------------------

REAL_SUBSTRATES = ("glusterfs", "cephfs")
SUBSTRATES = ("local", "weakfs", *REAL_SUBSTRATES)
DEFAULT_WEAKFS_ARGS = "--nfs --actimeo-ms 3000 --lost-reply-prob 0"


def weakfs_bin() -> Path:
    p = os.environ.get("KAAS_WEAKFS_BIN")
    if p:
        return Path(p).resolve()
    return kaas_bin().parent / "weakfs"


def _is_mount(path: Path) -> bool:
    target = str(path.resolve())
    try:
        with open("/proc/self/mountinfo") as f:
            return any(line.split()[4] == target for line in f)
    except OSError:
        return os.path.ismount(target)


class WeakMount:
    """One weakfs process serving `backing` at `mountpoint`: one NFS "host".

    cut()/heal() toggle the host's cut-off (every call fails with EIO) via
    its control file, which lives outside the mount."""

    def __init__(self, backing: Path, mountpoint: Path, log_path: Path,
                 extra_args: list[str] | None = None):
        self.backing = Path(backing)
        self.mountpoint = Path(mountpoint)
        self.log_path = Path(log_path)
        self.cutoff_file = self.log_path.with_suffix(".cutoff")
        if extra_args is None:
            extra_args = shlex.split(os.environ.get("KAAS_E2E_WEAKFS_ARGS", DEFAULT_WEAKFS_ARGS))
            extra_args += ["--seed", os.environ.get("KAAS_E2E_WEAKFS_SEED", "1")]
        self.args = list(extra_args)
        self.proc: subprocess.Popen | None = None

    def unavailable(self) -> str | None:
        """Why no weakfs mount can be made here, or None."""
        if not weakfs_bin().exists():
            return f"weakfs binary {weakfs_bin()} missing (cargo build --release --workspace)"
        if not os.path.exists("/dev/fuse"):
            return "/dev/fuse does not exist"
        if os.geteuid() != 0 and shutil.which("fusermount3") is None:
            return "not root and no fusermount3 in PATH"
        return None

    def mount(self, timeout: float = 10.0) -> None:
        why = self.unavailable()
        if why:
            pytest.skip(f"weakfs substrate unavailable: {why}")
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        argv = [str(weakfs_bin()), str(self.backing), str(self.mountpoint),
                "--cutoff-file", str(self.cutoff_file), *self.args]
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== e2e: {' '.join(argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _is_mount(self.mountpoint):
                return
            if self.proc.poll() is not None:
                rc, self.proc = self.proc.returncode, None
                pytest.skip(f"weakfs substrate unavailable: weakfs exited with code {rc} "
                            f"before mounting:\n{self.log_tail()}")
            time.sleep(0.05)
        self.unmount()
        pytest.skip(f"weakfs substrate unavailable: no mount at {self.mountpoint} "
                    f"within {timeout}s\n{self.log_tail()}")

    def cut(self) -> None:
        self.cutoff_file.touch()

    def heal(self) -> None:
        self.cutoff_file.unlink(missing_ok=True)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join(text[-lines:])

    def unmount(self) -> None:
        """Unmount for sure: fusermount3 -u, then umount -l; stop weakfs."""
        self.heal()
        for cmd in (["fusermount3", "-u", str(self.mountpoint)],
                    ["umount", str(self.mountpoint)],
                    ["umount", "-l", str(self.mountpoint)]):
            if not _is_mount(self.mountpoint):
                break
            if shutil.which(cmd[0]) is None:
                continue
            for _ in range(20):
                r = subprocess.run(cmd, capture_output=True, timeout=15)
                if r.returncode == 0 or not _is_mount(self.mountpoint):
                    break
                time.sleep(0.1)  # EBUSY while a killed broker's fds drain
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=5)
            self.proc = None
        assert not _is_mount(self.mountpoint), f"could not unmount {self.mountpoint}"


def _unavailable(kind: str, why: str):
    """Skip a test whose substrate cannot be made here, or fail it when
    the substrate is required (KAAS_E2E_REQUIRE_SUBSTRATES)."""
    required = {s.strip() for s in os.environ.get("KAAS_E2E_REQUIRE_SUBSTRATES", "").split(",")}
    msg = f"{kind} substrate unavailable: {why}"
    if kind in required:
        pytest.fail(msg + " (required by KAAS_E2E_REQUIRE_SUBSTRATES)", pytrace=False)
    pytest.skip(msg)


class RealMount:
    """One FUSE client of a real volume, mounted at `path`: one "host"."""

    def __init__(self, volume: "RealVolume", path: Path):
        self.volume = volume
        self.path = Path(path)

    def unmount(self) -> None:
        r = self.volume.run("umount", str(self.path), timeout=60)
        assert r.returncode == 0 and not _is_mount(self.path), \
            f"could not unmount {self.path}: {self.volume._why('umount', r)}"


class RealVolume:
    """One volume of a real shared filesystem for the whole session,
    started by tests/substrates/<kind>.sh once collection shows a test
    needs it (outside every test's timeout; lazily otherwise), and taken
    down when the session finishes."""

    UP_TIMEOUT = 240.0

    def __init__(self, kind: str, state: Path):
        self.kind = kind
        self.state = Path(state)
        self.script = REPO / "tests" / "substrates" / f"{kind}.sh"
        self.error: str | None = None
        self.is_up = False
        self.attempted = False  # `up` ran (fully or not): `down` is owed
        self.clients = 0

    def run(self, *args: str, timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(self.script), *args], capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def _why(self, what: str, r: subprocess.CompletedProcess) -> str:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-15:])
        return f"`{self.script.name} {what}` exited {r.returncode}:\n{tail}"

    def start(self) -> None:
        """Run `up` once; a failure is remembered in `error` (its logs
        copied beside the state directory, which `down` removes)."""
        if self.error is not None or self.is_up:
            return
        self.attempted = True
        try:
            r = self.run("up", str(self.state), timeout=self.UP_TIMEOUT)
            if r.returncode == 0:
                self.is_up = True
            else:
                self.error = self._why("up", r)
        except subprocess.TimeoutExpired:
            self.error = f"`{self.script.name} up` did not finish within {self.UP_TIMEOUT}s"
        except BaseException:
            # A test timeout or ^C inside `up`: take down what it started.
            self.down()
            raise
        if not self.is_up:
            kept = self.state.parent / f"{self.kind}-failed-logs"
            if (self.state / "log").is_dir():
                shutil.copytree(self.state / "log", kept, dirs_exist_ok=True)
                self.error += f"\n(logs kept in {kept})"
            self.down()

    def ensure_up(self) -> None:
        self.start()
        if self.error is not None:
            _unavailable(self.kind, self.error)

    def mount(self, path: Path) -> RealMount:
        self.ensure_up()
        self.clients += 1
        try:
            r = self.run("mount", str(self.state), str(path), timeout=120)
        except subprocess.TimeoutExpired:
            _unavailable(self.kind, f"mounting a client at {path} took over 120 s")
        if r.returncode != 0:
            _unavailable(self.kind, self._why("mount", r))
        return RealMount(self, path)

    def down(self) -> subprocess.CompletedProcess | None:
        try:
            return self.run("down", str(self.state), timeout=180)
        finally:
            self.is_up = False


_real_volumes: dict[str, RealVolume] = {}


def _real_volume(kind: str) -> RealVolume:
    if kind not in _real_volumes:
        import tempfile
        base = Path(tempfile.mkdtemp(prefix=f"kaas-{kind}-"))
        _real_volumes[kind] = RealVolume(kind, base / "state")
    return _real_volumes[kind]


def pytest_collection_finish(session):
    """Start the real volumes the selected tests need now, outside every
    test's timeout (CephFS's `up` alone takes ~15 s, up to its 240 s bound)."""
    if session.config.option.collectonly:
        return
    kinds = set()
    for item in session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        kinds.update(v for k, v in params.items()
                     if k in ("substrate", "kind") and v in REAL_SUBSTRATES)
    for kind in sorted(kinds):
        _real_volume(kind).start()


def pytest_sessionfinish(session, exitstatus):
    """Take every volume down whose `up` ran (outside every test's
    timeout), each on its own; a `down` that left something behind is said."""
    for v in _real_volumes.values():
        if not v.attempted:
            continue
        try:
            r = v.down()
            if r is not None and r.returncode != 0:
                print(f"\nWARNING: {v._why('down', r)}", flush=True)
        except Exception as e:  # noqa: BLE001 - one volume's failure must not keep the next up
            print(f"\nWARNING: taking the {v.kind} volume down failed: {e!r}", flush=True)
        if v.error is None:  # a failed `up` keeps its logs (named in the skip)
            shutil.rmtree(v.state.parent, ignore_errors=True)


@pytest.fixture(scope="session")
def real_volumes():
    """kind -> RealVolume: started when collection saw a test needing it,
    else on first use; taken down when the session finishes."""
    return {k: _real_volume(k) for k in REAL_SUBSTRATES}


def _remove_tree(path: Path, timeout: float = 120.0) -> None:
    """rm -rf through a FUSE client, bounded (a hung filesystem must not
    hang the teardown)."""
    try:
        subprocess.run(["rm", "-rf", "--one-file-system", str(path)], timeout=timeout,
                       capture_output=True)
    except subprocess.TimeoutExpired:
        pass


SEGMENT_RE = re.compile(r"^(\d{20})-e(\d+)\.log$")


def segment_files(partition_dir: Path) -> list[tuple[int, int, Path]]:
    """(base_offset, epoch, path) of every .log segment in a partition dir."""
    out = []
    if partition_dir.is_dir():
        for p in partition_dir.iterdir():
            m = SEGMENT_RE.match(p.name)
            if m:
                out.append((int(m.group(1)), int(m.group(2)), p))
    return sorted(out)


# ---------------------------------------------------------------------------
# pytest plumbing
# ---------------------------------------------------------------------------


def pytest_configure(config):
    config.addinivalue_line("markers", "broker_args(*args): extra CLI args for the `broker` fixture")
    config.addinivalue_line("markers", "substrates(*names): run the test once per substrate "
                            "(local, weakfs, glusterfs, cephfs); ids [local]/[weakfs]/...")
    config.addinivalue_line("markers", "slow: takes more than ~20 s")
    config.addinivalue_line("markers", "needs_txn_partition: needs the partition side of "
                            "transactions; skipped unless WriteTxnMarkers is advertised")


_WRITE_TXN_MARKERS = 27
_txn_partition_served: list[bool] = []


@pytest.fixture(autouse=True)
def _needs_txn_partition(request, tmp_path_factory):
    """Skip a `needs_txn_partition` test unless the broker binary
    advertises WriteTxnMarkers (asked once per session, of a throwaway
    broker)."""
    if request.node.get_closest_marker("needs_txn_partition") is None:
        return
    if not _txn_partition_served:
        import kafka_wire
        b = Broker(tmp_path_factory.mktemp("txn-probe"))
        try:
            b.start()
            keys = kafka_wire.api_versions(b.addr).api_keys
            _txn_partition_served.append(_WRITE_TXN_MARKERS in keys)
        finally:
            b.stop()
    if not _txn_partition_served[0]:
        pytest.skip("the partition side of transactions (WriteTxnMarkers) is not served")


def pytest_generate_tests(metafunc):
    marks = list(metafunc.definition.iter_markers("substrates"))
    if marks and "substrate" in metafunc.fixturenames:
        names = [str(n) for m in marks for n in m.args]
        unknown = set(names) - set(SUBSTRATES)
        assert not unknown, f"unknown substrate(s) {unknown}; known: {SUBSTRATES}"
        metafunc.parametrize("substrate", names, indirect=True, ids=names)


# What a failure report keeps of every broker's log: warnings, errors and
# the events that move ownership (leases, elections, assignment versions,
# leaders opening and closing, topics made and removed).
EVENT_RE = re.compile(
    r" (WARN|ERROR) |joined the cluster|lease|elected controller|stepping down|"
    r"assignment version published|applied assignment|partition leader (open|clos)|"
    r"topic (created|deleted)|vacat|controlled shutdown|e2e: start #")
EVENT_LINES = 60


def cluster_events(brokers, limit: int = EVENT_LINES) -> str:
    """The last `limit` event lines (EVENT_RE) of every broker's log, merged
    in time order and tagged with the broker's name."""
    rows = []
    for b in brokers:
        for i, line in enumerate(b.log_text().splitlines()):
            if EVENT_RE.search(line):
                # Timestamped lines sort by time; a start banner (no
                # timestamp) sorts after the broker's line before it.
                ts = line[:27] if line[:4].isdigit() else ""
                rows.append((ts, b.name, i, line[:300]))
    last_ts: dict[str, str] = {}
    ordered = []
    for ts, name, i, line in sorted(rows, key=lambda r: (r[1], r[2])):
        last_ts[name] = ts or last_ts.get(name, "")
        ordered.append((last_ts[name], name, i, line))
    ordered.sort(key=lambda r: (r[0], r[1], r[2]))
    shown = ordered[-limit:]
    head = f"----- last {len(shown)} of {len(ordered)} event lines, all brokers -----\n"
    return head + "\n".join(f"{name}: {line}" for _, name, _, line in shown)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    brokers = getattr(item, "_kaas_brokers", [])
    if rep.failed and brokers:
        # First, so that a report cut in the middle (CI keeps its head and
        # tail) still shows what the cluster did: a broker's own tail is
        # mostly its 64 coordinator shards loading at start-up.
        rep.sections.append((f"kaas cluster events ({rep.when})", cluster_events(brokers)))
        for b in brokers:
            rep.sections.append((f"kaas {b.name} log ({rep.when})", b.log_tail()))
            if b.weakfs is not None:
                rep.sections.append((f"weakfs {b.name} log ({rep.when})", b.weakfs.log_tail()))


@pytest.fixture
def substrate(request) -> str:
    """What broker data dirs live on: the test's [param], else
    $KAAS_E2E_SUBSTRATE, else "local"."""
    name = getattr(request, "param", None) or os.environ.get("KAAS_E2E_SUBSTRATE", "local")
    assert name in SUBSTRATES, f"unknown substrate {name!r}; known: {SUBSTRATES}"
    return name


@pytest.fixture
def broker_factory(request, tmp_path, substrate):
    made: list[Broker] = []
    mounts: list[WeakMount | RealMount] = []
    request.node._kaas_brokers = made
    volume: RealVolume | None = None
    test_dir: str | None = None  # this test's directory on a real volume
    if substrate in REAL_SUBSTRATES:
        volume = request.getfixturevalue("real_volumes")[substrate]
        volume.ensure_up()
        test_dir = re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name)[:60] + \
            "-" + uuid.uuid4().hex[:8]

    def make(extra_args: list[str] | None = None, start: bool = True,
             backing: Path | None = None, weakfs_args: list[str] | None = None,
             **kw) -> Broker:
        """A broker with its own data dir. On weakfs, the data dir is the
        broker's own mount ("host") of `backing` (default: a private backing
        dir; pass the same path to several brokers to share a volume)."""
        idx = len(made)
        kw.setdefault("name", f"broker{idx}")
        if volume is not None:
            assert "data_dir" not in kw, "a data_dir is not chosen by the test on a real volume"
            # A client of its own; the data dir is in the test's directory
            # of the volume: the shared one (`backing`'s name) or private.
            mnt = tmp_path / kw["name"] / "mnt"
            mnt.mkdir(parents=True, exist_ok=True)
            mounts.append(volume.mount(mnt))
            rel = Path(backing).name if backing else f"{kw['name']}-private"
            kw["data_dir"] = mnt / test_dir / rel / "data"
        b = Broker(tmp_path / kw["name"], extra_args=extra_args, **kw)
        b.real_mount = mounts[-1] if volume is not None else None
        made.append(b)
        if substrate == "weakfs":
            m = WeakMount(backing or (b.workdir / "backing"), b.data_dir,
                          b.workdir / "weakfs.log", weakfs_args)
            m.mount()
            mounts.append(m)
            b.weakfs = m
        if start:
            b.start()
        return b

    def make_cluster(n: int, extra_args: list[str] | None = None,
                     start: bool = True,
                     weakfs_args: list[str] | None = None,
                     settle: bool = True) -> list[Broker]:
        """`n` brokers (ids 0..n-1) sharing one volume: one directory on
        the local substrate; on weakfs one backing directory with a mount
        ("host") per broker. Started together, not one by one; with
        `settle`, returned once every broker has applied an assignment
        naming all `n` (before that the first to join leads every partition
        and every coordinator shard, and a test reading leaders or
        coordinators would see them move under it)."""
        shared = tmp_path / f"volume{len(made)}"
        shared.mkdir()
        out = []
        for i in range(n):
            name = f"broker{len(made)}"
            if substrate == "weakfs" or volume is not None:
                b = make(extra_args, start=False, backing=shared, broker_id=i, name=name,
                         weakfs_args=weakfs_args)
            else:
                b = make(extra_args, start=False, broker_id=i, name=name,
                         data_dir=shared / "data")
            out.append(b)
        if start:
            for b in out:
                b.spawn()
            for b in out:
                b.wait_ready()
            if settle:
                settle_cluster(out)
        return out

    make.cluster = make_cluster
    try:
        yield make
    finally:
        try:
            for b in made:
                b.stop()
            if volume is not None and mounts:
                _remove_tree(mounts[0].path / test_dir)
        finally:
            failed = []
            for m in mounts:  # every one, whatever the others do
                try:
                    m.unmount()
                except Exception as e:  # noqa: BLE001
                    failed.append(f"{m.mountpoint if isinstance(m, WeakMount) else m.path}: {e}")
            assert not failed, "mounts left behind: " + "; ".join(failed)
    for b in made:
        b.assert_no_panic()


def settle_cluster(brokers: list[Broker], timeout: float = 30.0) -> None:
    """Until every broker's Metadata lists every broker in `brokers`."""
    from kafka_wire import metadata_v4
    want = {b.broker_id for b in brokers}
    deadline = time.monotonic() + timeout
    seen = {}
    while time.monotonic() < deadline:
        for b in brokers:
            try:
                seen[b.broker_id] = metadata_v4(b.addr, [])[0]
            except OSError as e:
                seen[b.broker_id] = repr(e)
        if all(v == want for v in seen.values()):
            return
        time.sleep(0.1)
    raise AssertionError(f"brokers {sorted(want)} not all in every broker's metadata "
                         f"within {timeout}s: {seen}")


@pytest.fixture
def broker(request, broker_factory) -> Broker:
    args: list[str] = []
    for m in request.node.iter_markers("broker_args"):
        args.extend(str(a) for a in m.args)
    return broker_factory(args)


@pytest.fixture
def topic_name(request) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name)[:80]
    return f"{base}-{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------------------
# client helpers
# ---------------------------------------------------------------------------


def client_conf(bootstrap: str, **extra) -> dict:
    conf = {
        "bootstrap.servers": bootstrap,
        "broker.address.family": "v4",
        "socket.timeout.ms": 10000,
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 1000,
    }
    conf.update(extra)
    return conf


def producer_conf(bootstrap: str, **extra) -> dict:
    conf = client_conf(bootstrap, **{"acks": "all", "linger.ms": 5,
                                     "message.timeout.ms": 30000})
    conf.update(extra)
    return conf


def admin(bootstrap: str):
    from confluent_kafka.admin import AdminClient
    return AdminClient(client_conf(bootstrap))


def create_topic(bootstrap: str, name: str, partitions: int = 1,
                 config: dict[str, str] | None = None, timeout: float = 30.0) -> None:
    """CreateTopics via confluent AdminClient, then wait until every partition
    has a leader in Metadata."""
    from confluent_kafka.admin import NewTopic
    a = admin(bootstrap)
    fs = a.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1,
                                   config=dict(config or {}))],
                         operation_timeout=timeout, request_timeout=timeout)
    fs[name].result(timeout=timeout)
    wait_topic_ready(bootstrap, name, partitions, timeout=timeout, admin_client=a)


def wait_topic_ready(bootstrap: str, name: str, partitions: int,
                     timeout: float = 30.0, admin_client=None) -> None:
    a = admin_client or admin(bootstrap)
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        md = a.list_topics(topic=name, timeout=10)
        t = md.topics.get(name)
        last = t
        if t is not None and t.error is None and len(t.partitions) == partitions and \
                all(p.leader >= 0 and p.error is None for p in t.partitions.values()):
            return
        time.sleep(0.2)
    raise AssertionError(f"topic {name} not ready within {timeout}s: {last!r}")


@dataclass(frozen=True)
class Msg:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple
    timestamp_type: int
    timestamp: int


def _to_msg(m) -> Msg:
    ts_type, ts = m.timestamp()
    return Msg(m.partition(), m.offset(), m.key(), m.value(),
               tuple(m.headers() or ()), ts_type, ts)


def consume_all(bootstrap: str, topic: str, partitions: list[int] | int,
                timeout: float = 60.0, start_offsets: dict[int, int] | None = None,
                min_counts: dict[int, int] | None = None) -> dict[int, list[Msg]]:
    """Read every partition from the beginning (or `start_offsets`) up to the
    high watermark observed at call time (or until `min_counts` reached).
    Returns {partition: [Msg, ...]} in offset order."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    if isinstance(partitions, int):
        partitions = list(range(partitions))
    c = Consumer(client_conf(bootstrap, **{
        "group.id": f"e2e-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
        "fetch.wait.max.ms": 100,
    }))
    out: dict[int, list[Msg]] = {p: [] for p in partitions}
    try:
        highs = {}
        for p in partitions:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            highs[p] = hi
        starts = start_offsets or {}
        c.assign([TopicPartition(topic, p, starts.get(p, OFFSET_BEGINNING)) for p in partitions])

        def done(p):
            if min_counts is not None:
                return len(out[p]) >= min_counts.get(p, 0)
            return highs[p] <= 0 or (out[p] and out[p][-1].offset >= highs[p] - 1) or eof[p] >= highs[p]

        eof = {p: -1 for p in partitions}
        deadline = time.monotonic() + timeout
        while not all(done(p) for p in partitions):
            if time.monotonic() > deadline:
                got = {p: (len(v), v[-1].offset if v else None) for p, v in out.items()}
                raise AssertionError(f"consume timeout: highs={highs} got(count,last)={got} eof={eof}")
            for m in c.consume(num_messages=10000, timeout=0.5):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        eof[m.partition()] = m.offset()
                        continue
                    raise AssertionError(f"consumer error: {err}")
                if m.partition() in out:
                    out[m.partition()].append(_to_msg(m))
    finally:
        c.close()
    return out


def commit_offset(bootstrap: str, topic: str, group: str, offset: int, partition: int = 0) -> None:
    """Commit `offset` for `group` on one partition (no member joins)."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer(client_conf(bootstrap, **{"group.id": group, "enable.auto.commit": False}))
    try:
        c.commit(offsets=[TopicPartition(topic, partition, offset)], asynchronous=False)
    finally:
        c.close()


def produce_and_check(bootstrap: str, topic: str | None = None, n: int = 10,
                      timeout: float = 30.0) -> None:
    """Sanity round trip with confluent-kafka: create (if needed) a topic,
    produce `n` records acks=all, read them back."""
    from confluent_kafka import Producer
    if topic is None:
        topic = f"sanity-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, 1, timeout=timeout)
    p = Producer(producer_conf(bootstrap))
    reports = []
    marker = uuid.uuid4().hex.encode()

    def cb(err, msg):
        reports.append((err, msg.offset() if err is None else None))

    for i in range(n):
        p.produce(topic, value=marker + b"-%d" % i, partition=0, on_delivery=cb)
    assert p.flush(timeout) == 0, "sanity produce did not complete"
    assert len(reports) == n and all(e is None for e, _ in reports), reports
    msgs = consume_all(bootstrap, topic, [0], timeout=timeout)[0]
    vals = [m.value for m in msgs if m.value and m.value.startswith(marker)]
    assert vals == [marker + b"-%d" % i for i in range(n)]


def assert_healthy(broker: Broker) -> None:
    assert broker.alive(), f"{broker.name} died\n" + broker.log_tail()
    produce_and_check(broker.bootstrap)
    assert broker.alive(), f"{broker.name} died\n" + broker.log_tail()
    broker.assert_no_panic()


def wait_until(pred, timeout: float, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last={last!r})")
