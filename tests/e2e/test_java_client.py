"""The official Java client (kafka-clients 4.2.1) in consumer groups, both
`group.protocol=classic` and `group.protocol=consumer` (KIP-848).

tests/java/src/GroupTakeover.java produces N records, runs two consumers
A and B in one group (each commits synchronously after every batch), checks
they split the partitions, closes A once half the records are consumed,
checks B takes over every partition and consumes the rest with no record
lost, then checks a fresh member finds committed offsets equal to the log
end offsets and resumes from them with no loss and no duplicate.

Run against one broker (both substrates) and a 3-broker cluster (so the
coordinator, the partition leaders and the client's bootstrap broker are
usually different brokers). tests/java/fetch.sh provides the client (a jar
named by KAAS_KAFKA_CLIENTS_JAR, or Maven Central when reachable) and
compiles the program; the tests skip, saying why, when no JDK, slf4j or
kafka-clients jar is available — as on this project's CI machines, which
reach no Maven repository.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import create_topic

JAVA_DIR = Path(__file__).resolve().parents[1] / "java"
SLF4J = ["/usr/share/java/slf4j-api.jar", "/usr/share/java/slf4j-simple.jar"]
PARTITIONS = 6
RECORDS = 600
GROUP_ARGS = ["--group-shards", "8", "--group-initial-rebalance-delay-ms", "300",
              "--group-consumer-heartbeat-interval-ms", "500",
              "--group-consumer-session-timeout-ms", "6000"]


@pytest.fixture(scope="module")
def java_classpath() -> str:
    # fetch.sh is idempotent: with the jar and classes in place it only checks.
    r = subprocess.run(["bash", str(JAVA_DIR / "fetch.sh")], capture_output=True, text=True,
                       env={**os.environ, "PYTHON": sys.executable}, timeout=300)
    if r.returncode == 3:
        pytest.skip(r.stderr.strip() or "java client unavailable")
    assert r.returncode == 0, f"tests/java/fetch.sh failed:\n{r.stdout}\n{r.stderr}"
    return ":".join([str(JAVA_DIR / "classes"), str(JAVA_DIR / "lib" / "kafka-clients.jar"), *SLF4J])


def run_java(cp: str, bootstrap: str, topic: str, protocol: str, tmp_path: Path) -> dict[str, str]:
    group = f"java-{protocol}-{uuid.uuid4().hex[:8]}"
    argv = ["java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp", cp, "GroupTakeover", bootstrap, topic, str(PARTITIONS), group, protocol,
            str(RECORDS)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    (tmp_path / f"java-{protocol}.log").write_text(r.stdout + "\n--- stderr ---\n" + r.stderr)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"java client ({protocol}) failed, rc={r.returncode}:\n{out[-8000:]}"
    line = next(l for l in r.stdout.splitlines() if l.startswith("RESULT "))
    res = dict(kv.split("=", 1) for kv in line.split()[1:])
    # A commits before every poll, so a rebalance hands over no
    # uncommitted work: at-least-once allows duplicates, this pattern has none.
    assert res["duplicates"] == "0", line
    assert int(res["a_consumed"]) > 0 and int(res["b_consumed"]) > 0, line
    # Errors the client logged at WARN/ERROR while the group moved are
    # expected to be retriable ones only; an unknown error code or a
    # schema problem shows up as an exception and fails above.
    assert not re.search(r"SchemaException|Error reading field|UnsupportedVersion", out), out[-8000:]
    return res


@pytest.mark.substrates("local", "weakfs")
@pytest.mark.broker_args(*GROUP_ARGS)
@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_java_client_group_takeover(java_classpath, broker, topic_name, protocol, tmp_path):
    create_topic(broker.bootstrap, topic_name, partitions=PARTITIONS)
    res = run_java(java_classpath, broker.bootstrap, topic_name, protocol, tmp_path)
    print("java", res)
    assert broker.alive()


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_java_client_group_takeover_three_brokers(java_classpath, broker_factory, topic_name,
                                                  protocol, tmp_path):
    from cluster import FAST, bootstrap, create_everywhere
    bs = broker_factory.cluster(3, FAST + GROUP_ARGS)
    create_everywhere(bs, topic_name, PARTITIONS)
    res = run_java(java_classpath, bootstrap(bs), topic_name, protocol, tmp_path)
    print("java", res)
    assert all(b.alive() for b in bs)
