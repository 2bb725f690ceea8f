"""The dashboard in a real headless browser (Debian's chromium driven by
playwright-core from tests/browser, no browser download): against a running
3-broker cluster it loads with no console errors, shows the brokers and the
actors, updates by itself when load starts and highlights a leader restart;
with 10,000 partitions it still renders within a second (paged, aggregated).
Screenshots go to tests/browser/artifacts/ (gitignored) or
$KAAS_TEST_ARTIFACTS.

Skipped when chromium or the npm packages are missing, except under CI
(CI=true), where that is a failure: .ci/run installs both."""

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from cluster import FAST, bootstrap, create_everywhere
from conftest import create_topic, wait_until
from test_dashboard import Load, api

REPO = Path(__file__).resolve().parents[2]
BROWSER_DIR = REPO / "tests" / "browser"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def artifacts(name: str) -> Path:
    root = Path(os.environ.get("KAAS_TEST_ARTIFACTS", BROWSER_DIR / "artifacts"))
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def need_browser():
    why = None
    if not Path(CHROMIUM).exists():
        why = f"{CHROMIUM} missing (apt-get install chromium)"
    elif shutil.which("node") is None:
        why = "node missing"
    elif not (BROWSER_DIR / "node_modules" / "playwright-core").exists():
        why = "tests/browser/node_modules missing (cd tests/browser && npm ci)"
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"browser test prerequisites missing under CI: {why}")
        pytest.skip(why)


class Driver:
    """The node script as a subprocess speaking its WAIT/OK protocol."""

    def __init__(self, url: str, out: Path, brokers: int, scenario: str, incarnations: list[str] = (),
                 killed: int | None = None):
        self.out = out
        self.log = []
        extra = ["--incarnations", ",".join(incarnations)] if incarnations else []
        extra += ["--killed", str(killed)] if killed is not None else []
        self.p = subprocess.Popen(
            ["node", str(BROWSER_DIR / "dashboard.test.mjs"), "--url", url, "--out", str(out),
             "--brokers", str(brokers), "--scenario", scenario, *extra],
            cwd=BROWSER_DIR, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, bufsize=1, env={**os.environ, "CHROMIUM": CHROMIUM})

    def next_line(self) -> str:
        while True:
            line = self.p.stdout.readline()
            if not line:
                self.p.wait(10)
                raise AssertionError("browser driver exited:\n" + "".join(self.log))
            self.log.append(line)
            line = line.strip()
            if line.startswith(("WAIT ", "OK", "FAIL")):
                return line

    def expect_wait(self, event: str):
        line = self.next_line()
        assert line == f"WAIT {event}", "".join(self.log)

    def send(self, event: str):
        self.p.stdin.write(event + "\n")
        self.p.stdin.flush()

    def finish(self):
        line = self.next_line()
        self.p.wait(30)
        (self.out / "driver.log").write_text("".join(self.log))
        assert line == "OK", "".join(self.log)

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)


@pytest.mark.substrates("weakfs")
def test_dashboard_live_in_a_browser(broker_factory, topic_name):
    need_browser()
    # A lease that outlives the page's 3 s staleness check (broker 0 is
    # stopped for about that long).
    brokers = broker_factory.cluster(3, ["--lease-ms", "8000", "--lease-grace-ms", "500",
                                         "--heartbeat-ms", "200", "--poll-ms", "100"])
    parts = 6
    create_everywhere(brokers, topic_name, parts)
    b0 = brokers[0]
    url = b0.metrics_url.rsplit("/", 1)[0] + "/"
    out = artifacts("live")
    incarnations = [str(json.loads((b0.data_dir / "__cluster" / "brokers" / f"{b.broker_id}.json")
                                   .read_text())["incarnation"]) for b in brokers]
    victim = brokers[2]
    d = Driver(url, out, 3, "live", incarnations, killed=victim.broker_id)
    load = None
    try:
        d.expect_wait("load-started")
        load = Load(bootstrap(brokers), topic_name, parts)
        load.start()
        wait_until(lambda: load.acked > 100, timeout=30, what="acknowledged load")
        d.send("load-started")
        d.expect_wait("lag")
        group, lag, coordinator = lag_elsewhere(brokers, topic_name + "-lag")
        d.send(f"lag {group} {lag} {coordinator}")
        d.expect_wait("restarted")
        # Fail broker 0's volume for a moment: its leaders' fsyncs fail and
        # they restart (the lease, 3 s, outlives the cut).
        before = restarts(b0)
        deadline = time.monotonic() + 30
        while restarts(b0) <= before and time.monotonic() < deadline:
            b0.weakfs.cut()
            time.sleep(0.4)
            b0.weakfs.heal()
            time.sleep(1.0)
        assert restarts(b0) > before, "no leader restart on broker 0"
        d.send("restarted")
        # The page's own broker stops answering (accepted, never answered):
        # the page must say its data is stale within 3 s.
        d.expect_wait("frozen")
        b0.proc.send_signal(signal.SIGSTOP)
        try:
            d.send("frozen")
            d.expect_wait("thawed")
        finally:
            b0.proc.send_signal(signal.SIGCONT)
        d.send("thawed")
        d.expect_wait("killed")
        victim.kill9()
        d.send("killed")
        d.finish()
    finally:
        d.kill()
        if load:
            load.stop()


def lag_elsewhere(brokers, topic: str) -> tuple[str, int, int]:
    """A group, coordinated by a broker other than the page's (brokers[0]),
    committed behind a topic of known size: (group, its lag, coordinator)."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    create_everywhere(brokers, topic, 2)
    p = Producer({"bootstrap.servers": bootstrap(brokers), "acks": "all"})
    for i in range(30):
        p.produce(topic, value=b"%d" % i, partition=i % 2)
    assert p.flush(30) == 0
    page = brokers[0]
    for attempt in range(12):
        group = f"lag-{os.getpid()}-{attempt}"
        c = Consumer({"bootstrap.servers": bootstrap(brokers), "group.id": group,
                      "enable.auto.commit": False})
        # 15 per partition; committed 3 and 4: lag 12 + 11.
        c.commit(offsets=[TopicPartition(topic, 0, 3), TopicPartition(topic, 1, 4)], asynchronous=False)
        c.close()

        def coordinator():
            groups = api(page, "/api/cluster")["consumer_lag"]["groups"]
            return next((g["coordinator"] for g in groups if g["group"] == group and g["lag"] == 23), None)
        wait_until(lambda: coordinator() is not None, timeout=20, what=f"{group} in broker 0's view")
        if coordinator() != page.broker_id:
            return group, 23, coordinator()
    raise AssertionError("every group tried is coordinated by broker 0")


def restarts(b) -> int:
    with urllib.request.urlopen(b.metrics_url.rsplit("/", 1)[0] + "/api/actors?limit=1", timeout=5) as r:
        kinds = json.loads(r.read())["kinds"]
    return sum(k["restarts"] for k in kinds if k["kind"] == "partition_leader")


def test_dashboard_renders_10k_partitions_within_a_second(broker_factory, topic_name):
    """10,000 partitions created through CreateTopics (the per-request bound
    is 10,000, the cluster bound 20,000): the page pages and aggregates, so
    the first render and every poll stay under a second."""
    need_browser()
    b = broker_factory(["--partition-threads", "2"])
    create_topic(b.bootstrap, topic_name, 10_000, timeout=120)
    api = b.metrics_url.rsplit("/", 1)[0]

    def total():
        with urllib.request.urlopen(api + "/api/cluster", timeout=10) as r:
            return json.loads(r.read())["assignment"]["partitions_total"]

    wait_until(lambda: total() >= 10_000, timeout=120, interval=1, what="10,000 partitions assigned")
    # The server side of one poll, measured alone.
    t0 = time.monotonic()
    for path in ("/api/cluster", "/api/actors?limit=25", "/api/partitions?limit=50", "/api/series"):
        with urllib.request.urlopen(api + path, timeout=10) as r:
            body = r.read()
            assert len(body) < 512 * 1024, (path, len(body))
    server_s = time.monotonic() - t0
    assert server_s < 1.0, f"one poll's JSON took {server_s:.2f}s with 10,000 partitions"
    out = artifacts("big")
    d = Driver(api + "/", out, 1, "big")
    try:
        d.finish()
    finally:
        d.kill()
