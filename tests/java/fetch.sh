#!/usr/bin/env bash
# Provide the official Java Kafka client (kafka-clients) for
# tests/e2e/test_java_client.py and compile tests/java/src against it.
#
# Where the jar comes from, in order:
#   1. $KAAS_KAFKA_CLIENTS_JAR — a kafka-clients 4.x jar you provide;
#   2. Maven Central (repo1.maven.org), checked against the .sha1 published
#      beside it — when that host is reachable.
# This project's CI machines reach crates.io, PyPI, npm and Debian only, so
# there the script exits 3 and the Java tests skip, saying why. (A PyPI
# wheel that bundles kafka-clients exists, but its licence is "free for
# non-commercial use": not a dependency this project takes.)
# slf4j comes from Debian (libslf4j-java), the JDK from the machine.
#
# Output (gitignored): tests/java/lib/kafka-clients.jar, tests/java/classes/.
# Idempotent: a re-run with both up to date does no network and no javac.
# Exit codes: 0 ready, 3 unavailable here (skip), anything else a failure.
set -euo pipefail
cd "$(dirname "$0")"

KAFKA_VERSION="4.2.1"
CENTRAL="https://repo1.maven.org/maven2/org/apache/kafka/kafka-clients/$KAFKA_VERSION"
SLF4J_JARS="/usr/share/java/slf4j-api.jar:/usr/share/java/slf4j-simple.jar"

unavailable() { echo "java client unavailable: $*" >&2; exit 3; }

command -v java >/dev/null && command -v javac >/dev/null || unavailable "java/javac missing"
for j in ${SLF4J_JARS//:/ }; do
    [ -s "$j" ] || unavailable "$j missing (Debian: libslf4j-java)"
done

mkdir -p lib
if [ -n "${KAAS_KAFKA_CLIENTS_JAR:-}" ]; then
    [ -s "$KAAS_KAFKA_CLIENTS_JAR" ] || { echo "KAAS_KAFKA_CLIENTS_JAR=$KAAS_KAFKA_CLIENTS_JAR: no such jar" >&2; exit 1; }
    cmp -s "$KAAS_KAFKA_CLIENTS_JAR" lib/kafka-clients.jar 2>/dev/null \
        || cp "$KAAS_KAFKA_CLIENTS_JAR" lib/kafka-clients.jar
elif [ ! -s lib/kafka-clients.jar ]; then
    curl -sf --max-time 5 -o /dev/null "$CENTRAL/kafka-clients-$KAFKA_VERSION.jar.sha1" \
        || unavailable "Maven Central not reachable; set KAAS_KAFKA_CLIENTS_JAR to a kafka-clients 4.x jar"
    curl -sf --max-time 120 -o lib/kafka-clients.jar.tmp "$CENTRAL/kafka-clients-$KAFKA_VERSION.jar"
    sha1="$(curl -sf --max-time 10 "$CENTRAL/kafka-clients-$KAFKA_VERSION.jar.sha1" | cut -c1-40)"
    echo "$sha1  lib/kafka-clients.jar.tmp" | sha1sum -c --quiet
    mv lib/kafka-clients.jar.tmp lib/kafka-clients.jar
fi

# Compile when a source or the jar is newer than the stamp (or no stamp).
if [ ! -e classes/.stamp ] || [ -n "$(find src lib -newer classes/.stamp -type f)" ]; then
    rm -rf classes && mkdir -p classes
    javac -nowarn -d classes -cp "lib/kafka-clients.jar:$SLF4J_JARS" src/*.java
    touch classes/.stamp
fi
echo "java client ready: classpath tests/java/classes:tests/java/lib/kafka-clients.jar:$SLF4J_JARS"
