#!/usr/bin/env bash
# Fetch the official Java Kafka client (kafka-clients) for
# tests/e2e/test_java_client.py and compile tests/java/src against it.
#
# Why not Maven: this project's machines and CI reach crates.io, PyPI, npm
# and Debian only; Maven Central is not among them. The one registry
# package found that carries kafka-clients 4.x unshaded is the PyPI wheel
# atoti-server-kafka: its plugin.jar bundles org.apache.kafka:kafka-clients
# 4.2.1 (Apache-2.0 classes, unrenamed) with lz4. The wheel is downloaded
# with pip (--no-deps, never installed), checked against a pinned sha256,
# and only its jar is kept. slf4j and the JDK come from Debian
# (libslf4j-java, openjdk-17-jdk-headless in .ci/apt-packages.txt).
#
# Output (gitignored): tests/java/lib/kafka-clients.jar, tests/java/classes/.
# Idempotent: a re-run with both up to date does no network and no javac.
set -euo pipefail
cd "$(dirname "$0")"

WHEEL_SPEC="atoti-server-kafka==6.2.2"
WHEEL_FILE="atoti_server_kafka-6.2.2-py3-none-any.whl"
WHEEL_SHA256="c1dfa79b21908d467ff31cc95ac021d3e5f950ae3a4a5e825421c5fca06bab1d"
KAFKA_VERSION="4.2.1"
SLF4J_JARS="/usr/share/java/slf4j-api.jar:/usr/share/java/slf4j-simple.jar"
PY="${PYTHON:-python3}"

mkdir -p lib .cache
if [ ! -s lib/kafka-clients.jar ]; then
    if [ ! -s ".cache/$WHEEL_FILE" ]; then
        # --python-version: the wheel is pure Python (py3-none-any) but says
        # Requires-Python >= 3.12; it is only unpacked, never installed.
        "$PY" -m pip download -q --disable-pip-version-check --no-deps \
            --only-binary=:all: --python-version 3.12 -d .cache "$WHEEL_SPEC"
    fi
    echo "$WHEEL_SHA256  .cache/$WHEEL_FILE" | sha256sum -c --quiet
    "$PY" - ".cache/$WHEEL_FILE" lib/kafka-clients.jar "$KAFKA_VERSION" <<'PYEOF'
import io, os, sys, zipfile
wheel, out, want = sys.argv[1:4]
with zipfile.ZipFile(wheel) as w:
    data = w.read("_atoti_server_kafka/__resources__/plugin.jar")
props = zipfile.ZipFile(io.BytesIO(data)).read("kafka/kafka-version.properties").decode()
got = dict(l.split("=", 1) for l in props.split() if "=" in l).get("version")
if got != want:
    sys.exit(f"the wheel's jar holds kafka-clients {got}, expected {want}")
with open(out + ".tmp", "wb") as f:
    f.write(data)
os.replace(out + ".tmp", out)
PYEOF
fi

for j in ${SLF4J_JARS//:/ }; do
    [ -s "$j" ] || { echo "$j missing: apt-get install libslf4j-java" >&2; exit 1; }
done

# Compile when a source is newer than the stamp (or there is no stamp).
if [ ! -e classes/.stamp ] || [ -n "$(find src -name '*.java' -newer classes/.stamp)" ]; then
    rm -rf classes && mkdir -p classes
    javac -nowarn -d classes -cp "lib/kafka-clients.jar:$SLF4J_JARS" src/*.java
    touch classes/.stamp
fi
echo "java client ready: kafka-clients $KAFKA_VERSION, classpath tests/java/classes:tests/java/lib/kafka-clients.jar:$SLF4J_JARS"
