#!/usr/bin/env bash
# kaas benchmark: C-speed load with librdkafka's rdkafka_performance.
#
# Usage:  bench/run.sh [--quick]
#
# What it does
#   1. Builds librdkafka's examples/rdkafka_performance.c (static, no SSL/SASL)
#      from the rdkafka-sys crate source, fetched with cargo into
#      ~/.cargo/registry (a throwaway cargo project in bench/out/rdkfetch does
#      the fetch). Needs cmake + a C compiler; installs cmake with apt-get when
#      missing and running as root. Build output is cached in bench/out.
#   2. Starts target/release/kaas (cargo build --release if missing) on free
#      127.0.0.1 ports with a fresh data dir under $BENCH_DIR
#      (default bench/out/run-<timestamp>, same filesystem as the repo).
#   3. Measures, each bounded by `timeout`:
#        produce throughput, acks=all (-a -1): 100 B and 1 KiB records,
#          1 and 6 partitions; the 100 B runs again with an idempotent
#          producer (-X enable.idempotence=true), each right after its plain
#          twin. librdkafka keeps one produce request in flight per
#          partition when idempotent (it counts in-flight messages against
#          its limit of 5 requests), so 1 partition measures fsync round
#          trips, not the broker's sequence checks: see BENCHMARKS.md
#        consume throughput (from the beginning of the 1 KiB / 6-partition topic)
#        produce->consume latency p50/p99 at a fixed rate (bench/latency.py)
#        transactions/s of 100 records of 100 B and p99 commit latency
#          (bench/transactions.py; only when WriteTxnMarkers is advertised)
#        broker peak RSS (VmHWM), broker CPU seconds per 100 MB produced
#          (utime+stime from /proc/<pid>/stat), fsyncs/s (kaas_fsyncs_total)
#        the disk under $BENCH_DIR: sequential write bandwidth (dd
#          oflag=direct conv=fdatasync) and 4 KiB write+fdatasync latency
#          (dd oflag=dsync average, plus p50/p99 from a python loop)
#   4. Prints a table and writes it to $BENCH_DIR/results.txt.
#   5. Failover: 3 brokers on one data dir, kill -9 of a non-controller leader
#      x10 and of the controller x10, and a SIGTERM rolling restart (bench/failover.py; SKIP_FAILOVER=1 skips).
#   6. Consumer groups: offset commits/s, commit latency, rebalance time,
#      coordinator takeover (bench/groups.py; SKIP_GROUPS=1 skips).
#
# Env:   KAAS_BIN     broker binary (default target/release/kaas)
#        BENCH_DIR    where data, logs and results go
#        PERF_BIN     a prebuilt rdkafka_performance to use instead of building
#        LAT_RATE     latency run rate, records/s (default 1000)
#        MSGS_100B    records per 100 B produce run (default 1000000 = 100 MB)
#        MSGS_1K      records per 1 KiB produce run (default 200000 = 200 MB)
# --quick divides the record counts by 10 and shortens the latency run.
#
# Only loopback (127.0.0.1) is ever used. Takes a few minutes on 2 cores.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT="$(pwd)"
OUT="$ROOT/bench/out"
mkdir -p "$OUT"

QUICK=0
if [ "${1:-}" = "--quick" ]; then QUICK=1; fi

MSGS_100B="${MSGS_100B:-1000000}"
MSGS_1K="${MSGS_1K:-200000}"
LAT_RATE="${LAT_RATE:-1000}"
LAT_SECONDS=15
if [ "$QUICK" = 1 ]; then
    MSGS_100B=$((MSGS_100B / 10)); MSGS_1K=$((MSGS_1K / 10)); LAT_SECONDS=5
fi
RUN_TIMEOUT=180   # seconds, per load-tool invocation

BENCH_DIR="${BENCH_DIR:-$OUT/run-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$BENCH_DIR"
RESULTS="$BENCH_DIR/results.txt"
log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# ---------------------------------------------------------------- 1. load tool
build_perf() {
    if [ -n "${PERF_BIN:-}" ]; then echo "$PERF_BIN"; return; fi
    local bin="$OUT/rdk-build/examples/rdkafka_performance"
    if [ -x "$bin" ]; then echo "$bin"; return; fi

    if ! command -v cmake >/dev/null; then
        if [ "$(id -u)" = 0 ]; then
            log "installing cmake"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q cmake >&2 \
                || { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q cmake >&2; }
        else
            log "cmake missing: apt-get install cmake"; exit 1
        fi
    fi

    local reg="${CARGO_HOME:-$HOME/.cargo}/registry/src"
    local src
    src="$(ls -d "$reg"/*/rdkafka-sys-*/librdkafka 2>/dev/null | sort -V | tail -1 || true)"
    if [ -z "$src" ]; then
        log "fetching the rdkafka-sys crate source with cargo"
        mkdir -p "$OUT/rdkfetch/src"
        cat > "$OUT/rdkfetch/Cargo.toml" <<'TOML'
[package]
name = "rdkfetch"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
rdkafka-sys = "4"

[workspace]
TOML
        echo 'fn main() {}' > "$OUT/rdkfetch/src/main.rs"
        (cd "$OUT/rdkfetch" && cargo fetch -q) >&2
        src="$(ls -d "$reg"/*/rdkafka-sys-*/librdkafka | sort -V | tail -1)"
    fi
    log "building rdkafka_performance from $src"
    rm -rf "$OUT/rdk-src" "$OUT/rdk-build"
    cp -r "$src" "$OUT/rdk-src"
    cmake -S "$OUT/rdk-src" -B "$OUT/rdk-build" -DCMAKE_BUILD_TYPE=Release \
        -DRDKAFKA_BUILD_TESTS=OFF -DRDKAFKA_BUILD_EXAMPLES=ON -DRDKAFKA_BUILD_STATIC=ON \
        -DWITH_SSL=OFF -DWITH_SASL=OFF -DWITH_ZSTD=OFF -DWITH_CURL=OFF -DENABLE_LZ4_EXT=OFF \
        > "$OUT/rdk-cmake.log" 2>&1 || { tail -30 "$OUT/rdk-cmake.log" >&2; exit 1; }
    # librdkafka's cmake writes "#define WITH_OAUTHBEARER_OIDC 0" but the code
    # tests it with #ifdef (and would then need curl): drop the define.
    sed -i '/#define WITH_OAUTHBEARER_OIDC 0/d' "$OUT/rdk-build/generated/config.h"
    cmake --build "$OUT/rdk-build" --target rdkafka_performance -j"$(nproc)" \
        > "$OUT/rdk-build.log" 2>&1 || { tail -30 "$OUT/rdk-build.log" >&2; exit 1; }
    echo "$bin"
}

PERF="$(build_perf)"
log "load tool: $PERF ($("$PERF" -h 2>&1 | sed -n 's/.*librdkafka version \([^ ]*\).*/\1/p' | head -1))"

# ---------------------------------------------------------------- 2. broker
KAAS_BIN="${KAAS_BIN:-$ROOT/target/release/kaas}"
if [ ! -x "$KAAS_BIN" ]; then
    log "building the broker (cargo build --release)"
    cargo build --release -q -p kaas >&2
fi
python3 -c 'import confluent_kafka' 2>/dev/null || {
    log "confluent-kafka missing: pip install -r .ci/requirements.txt"; exit 1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PORT="$(free_port)"; MPORT="$(free_port)"
BOOT="127.0.0.1:$PORT"
METRICS="http://127.0.0.1:$MPORT/metrics"
DATA="$BENCH_DIR/data"
mkdir -p "$DATA"

BROKER_PID=""
cleanup() {
    if [ -n "$BROKER_PID" ] && kill -0 "$BROKER_PID" 2>/dev/null; then
        kill -TERM "$BROKER_PID" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$BROKER_PID" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$BROKER_PID" 2>/dev/null || true
    fi
}
trap cleanup EXIT

log "starting broker on $BOOT, data in $DATA"
RUST_LOG="${RUST_LOG:-warn}" "$KAAS_BIN" broker --data-dir "$DATA" --listen "$BOOT" \
    --metrics-listen "127.0.0.1:$MPORT" --broker-id 0 > "$BENCH_DIR/broker.log" 2>&1 &
BROKER_PID=$!
for _ in $(seq 1 300); do
    if ! kill -0 "$BROKER_PID" 2>/dev/null; then log "broker exited:"; tail -30 "$BENCH_DIR/broker.log" >&2; exit 1; fi
    if python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$PORT),0.3)" 2>/dev/null; then break; fi
    sleep 0.1
done
python3 -c "import socket; socket.create_connection(('127.0.0.1',$PORT),1)" \
    || { log "broker not listening after 30 s"; tail -30 "$BENCH_DIR/broker.log" >&2; exit 1; }

CLK_TCK="$(getconf CLK_TCK)"
cpu_seconds() {  # utime+stime of the broker, seconds
    awk -v t="$CLK_TCK" '{ sub(/^.*\) /, ""); printf "%.3f\n", ($12 + $13) / t }' "/proc/$BROKER_PID/stat"
}
fsyncs() {
    curl_out="$(python3 - "$METRICS" <<'PY' 2>/dev/null || true
import sys, urllib.request
try:
    t = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
except Exception:
    print("nan"); sys.exit(0)
tot = 0.0; seen = False
for line in t.splitlines():
    if line.startswith("kaas_fsyncs_total"):
        tot += float(line.split()[-1]); seen = True
print(tot if seen else "nan")
PY
)"
    echo "${curl_out:-nan}"
}
create_topic() {  # name partitions
    python3 - "$BOOT" "$1" "$2" <<'PY'
import sys, time
from confluent_kafka.admin import AdminClient, NewTopic
boot, name, parts = sys.argv[1], sys.argv[2], int(sys.argv[3])
a = AdminClient({"bootstrap.servers": boot, "broker.address.family": "v4"})
a.create_topics([NewTopic(name, num_partitions=parts, replication_factor=1)])[name].result(30)
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    t = a.list_topics(topic=name, timeout=10).topics.get(name)
    if t and t.error is None and len(t.partitions) == parts and all(p.leader >= 0 for p in t.partitions.values()):
        sys.exit(0)
    time.sleep(0.2)
sys.exit("topic not ready")
PY
}
fmt() { python3 -c "import sys; v=sys.argv[1]; print(v if v in ('nan','-') else f'{float(v):.{int(sys.argv[2])}f}')" "$1" "$2"; }

declare -a ROWS=()
row() { ROWS+=("$(printf '%-44s %14s %s' "$1" "$2" "$3")"); }

# ---------------------------------------------------------------- 3. produce
TOTAL_MB=0; TOTAL_CPU=0
produce_run() {  # size partitions count [idem]
    local size=$1 parts=$2 count=$3 idem=${4:-} topic="bench-p-${1}b-${2}p${4:+-$4}"
    local extra=() label=""
    if [ "$idem" = idem ]; then extra=(-X enable.idempotence=true); label=", idempotent"; fi
    create_topic "$topic" "$parts"
    local c0 f0 t0 c1 f1 t1 out line
    c0=$(cpu_seconds); f0=$(fsyncs); t0=$(date +%s.%N)
    out="$BENCH_DIR/produce-${size}b-${parts}p${idem:+-$idem}.txt"
    timeout "$RUN_TIMEOUT" "$PERF" -P -t "$topic" -b "$BOOT" -s "$size" -c "$count" -a -1 \
        -X broker.address.family=v4 -X linger.ms=5 -X batch.size=1000000 \
        -X queue.buffering.max.messages=1000000 "${extra[@]}" -i 1000 > "$out" 2>&1 || log "produce run rc=$? (see $out)"
    t1=$(date +%s.%N); c1=$(cpu_seconds); f1=$(fsyncs)
    line="$(grep 'messages produced' "$out" | tail -1 || true)"
    local msgs mbs delivered failed
    msgs="$(sed -n 's/.* in [0-9]*ms: \([0-9]*\) msgs\/s.*/\1/p' <<<"$line")"
    mbs="$(sed -n 's/.* msgs\/s and \([0-9.]*\) MB\/s.*/\1/p' <<<"$line")"
    delivered="$(sed -n 's/.* \([0-9]*\) delivered .*/\1/p' <<<"$line")"
    failed="$(sed -n 's/.*offset -\{0,1\}[0-9]*, \([0-9]*\) failed.*/\1/p' <<<"$line")"
    local secs cpu mb
    secs=$(python3 -c "print(max(1e-9, $t1 - $t0))")
    cpu=$(python3 -c "print($c1 - $c0)")
    mb=$(python3 -c "print(${delivered:-0} * $size / 1e6)")
    TOTAL_MB=$(python3 -c "print($TOTAL_MB + $mb)"); TOTAL_CPU=$(python3 -c "print($TOTAL_CPU + $cpu)")
    local fps="nan"
    if [ "$f0" != nan ] && [ "$f1" != nan ]; then fps=$(python3 -c "print(($f1 - $f0) / $secs)"); fi
    local cpu100="nan"
    if python3 -c "import sys; sys.exit(0 if $mb > 0 else 1)"; then cpu100=$(python3 -c "print($cpu / $mb * 100)"); fi
    row "produce ${size} B x ${parts}p, acks=all${label}" "${msgs:-?} msg/s" "${mbs:-?} MB/s  (delivered ${delivered:-?}, failed ${failed:-?}; broker CPU $(fmt "$cpu100" 2) s/100MB; $(fmt "$fps" 0) fsyncs/s)"
}

log "produce runs"
produce_run 100 1 "$MSGS_100B"
produce_run 100 1 "$MSGS_100B" idem
produce_run 100 6 "$MSGS_100B"
produce_run 100 6 "$MSGS_100B" idem
produce_run 1024 1 "$MSGS_1K"
produce_run 1024 6 "$MSGS_1K"

# ---------------------------------------------------------------- consume
log "consume run"
CONS_TOPIC="bench-p-1024b-6p"
out="$BENCH_DIR/consume.txt"
timeout "$RUN_TIMEOUT" "$PERF" -C -t "$CONS_TOPIC" -b "$BOOT" -p 0 -p 1 -p 2 -p 3 -p 4 -p 5 \
    -o beginning -e -X broker.address.family=v4 -i 1000 > "$out" 2>&1 || log "consume run rc=$? (see $out)"
line="$(grep 'consumed in' "$out" | grep -v INTERVAL | tail -1 || true)"
cmsgs="$(sed -n 's/.*ms: \([0-9]*\) msgs\/s.*/\1/p' <<<"$line")"
cmbs="$(sed -n 's/.*msgs\/s (\([0-9.]*\) MB\/s).*/\1/p' <<<"$line")"
ctot="$(sed -n 's/^% \([0-9]*\) messages.*/\1/p' <<<"$line")"
row "consume 1 KiB x 6p from beginning" "${cmsgs:-?} msg/s" "${cmbs:-?} MB/s  (${ctot:-?} records)"

# ---------------------------------------------------------------- latency
log "latency run (${LAT_RATE}/s for ${LAT_SECONDS}s)"
create_topic bench-latency 1
latline="$(timeout "$RUN_TIMEOUT" python3 "$ROOT/bench/latency.py" --bootstrap "$BOOT" --topic bench-latency \
    --rate "$LAT_RATE" --seconds "$LAT_SECONDS" --size 100 2>"$BENCH_DIR/latency.err" | grep '^LATENCY' || true)"
kv() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<" $latline"; }
row "produce->consume latency @${LAT_RATE}/s" "p50 $(kv e2e_p50_ms) ms" "p99 $(kv e2e_p99_ms) ms, max $(kv e2e_max_ms) ms; ack p50 $(kv ack_p50_ms) / p99 $(kv ack_p99_ms) ms; lost $(kv lost)"

# ---------------------------------------------------------------- transactions
TXNS="${TXNS:-2000}"; [ "$QUICK" = 1 ] && TXNS=$((TXNS / 10))
TXN_PRODUCERS="${TXN_PRODUCERS:-8}"   # concurrent transactional producers
if python3 -c "
import socket, struct, sys
s = socket.create_connection(('127.0.0.1', $PORT), 2)
s.sendall(struct.pack('>ihhih', 10, 18, 0, 1, -1))
n = struct.unpack('>i', s.recv(4))[0]; b = b''
while len(b) < n: b += s.recv(n - len(b))
k = struct.unpack('>i', b[6:10])[0]
sys.exit(0 if any(struct.unpack('>h', b[10 + 6 * i:12 + 6 * i])[0] == 27 for i in range(k)) else 1)
" 2>/dev/null; then
    log "transactions run ($TXNS x 100 records)"
    create_topic bench-txn 1
    txline="$(timeout "$RUN_TIMEOUT" python3 "$ROOT/bench/transactions.py" --bootstrap "$BOOT" --topic bench-txn \
        --txns "$TXNS" --records 100 --size 100 --producers "$TXN_PRODUCERS" 2>"$BENCH_DIR/transactions.err" | grep '^TXNS' || true)"
    tkv() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<" $txline"; }
    row "transactions, 100 x 100 B each, 1p, ${TXN_PRODUCERS} producers" "$(tkv txn_per_s) txn/s" "commit p50 $(tkv commit_p50_ms) ms / p99 $(tkv commit_p99_ms) ms; $(tkv records_per_s) rec/s; read_committed saw $(tkv seen) of $((TXNS * 100))"
else
    row "transactions" "-" "skipped: WriteTxnMarkers not advertised (partition side of transactions missing)"
fi

# ---------------------------------------------------------------- broker resources
HWM="$(awk '/VmHWM/ {print $2 " " $3}' "/proc/$BROKER_PID/status")"
row "broker peak RSS (VmHWM)" "$HWM" ""
CPU100="nan"
if python3 -c "import sys; sys.exit(0 if $TOTAL_MB > 0 else 1)"; then CPU100=$(python3 -c "print($TOTAL_CPU / $TOTAL_MB * 100)"); fi
row "broker CPU per 100 MB produced (all runs)" "$(fmt "$CPU100" 2) s" "($(fmt "$TOTAL_CPU" 1) s for $(fmt "$TOTAL_MB" 0) MB)"
cleanup

# ---------------------------------------------------------------- disk baseline
log "disk baseline in $BENCH_DIR"
DD="$BENCH_DIR/dd.tmp"
DD_MB=512; [ "$QUICK" = 1 ] && DD_MB=128
seq_bw="$(dd if=/dev/zero of="$DD" bs=1M count=$DD_MB oflag=direct conv=fdatasync 2>&1 | tail -1 | sed -n 's/.*, \([0-9.,]* [kMG]B\/s\)$/\1/p')"
if [ -z "$seq_bw" ]; then  # O_DIRECT unsupported (tmpfs, some FUSE): buffered + fdatasync
    seq_bw="$(dd if=/dev/zero of="$DD" bs=1M count=$DD_MB conv=fdatasync 2>&1 | tail -1 | sed -n 's/.*, \([0-9.,]* [kMG]B\/s\)$/\1/p') (buffered)"
fi
rm -f "$DD"
row "disk sequential write (dd 1 MiB, direct+fdatasync)" "$seq_bw" "($DD_MB MiB)"
DSYNC_N=1000; [ "$QUICK" = 1 ] && DSYNC_N=200
dsync_s="$(dd if=/dev/zero of="$DD" bs=4k count=$DSYNC_N oflag=dsync 2>&1 | tail -1 | sed -n 's/.* copied, \([0-9.,]*\) s.*/\1/p' | tr , .)"
rm -f "$DD"
dsync_avg="$(python3 -c "print(f'{float(\"${dsync_s:-nan}\") / $DSYNC_N * 1000:.3f}')")"
fsync_pct="$(python3 - "$DD" "$DSYNC_N" <<'PY'
import os, sys, time
path, n = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
buf = b"\0" * 4096
lat = []
try:
    for _ in range(n):
        t = time.perf_counter()
        os.write(fd, buf)
        os.fdatasync(fd)
        lat.append((time.perf_counter() - t) * 1000)
finally:
    os.close(fd)
    os.unlink(path)
lat.sort()
print(f"p50 {lat[len(lat) // 2]:.3f} ms, p99 {lat[int(len(lat) * 0.99)]:.3f} ms")
PY
)"
row "disk 4 KiB write+fdatasync latency" "avg $dsync_avg ms" "(dd oflag=dsync x$DSYNC_N); $fsync_pct"

# ---------------------------------------------------------------- 4. table
{
    echo
    echo "kaas benchmark  $(date -u +%FT%TZ)  $(nproc) cores  $(uname -r)"
    echo "broker: $KAAS_BIN   data: $DATA ($(df -hT "$BENCH_DIR" | awk 'NR==2 {print $2 " on " $1}'))"
    echo "load:   $PERF"
    printf '%-44s %14s %s\n' "measurement" "value" "detail"
    printf '%-44s %14s %s\n' "-----------" "-----" "------"
    for r in "${ROWS[@]}"; do echo "$r"; done
    echo
} | tee "$RESULTS"
log "raw outputs and broker log in $BENCH_DIR"

# ---------------------------------------------------------------- 5. failover
# Three brokers on one data dir: kill -9 a non-controller leader, then the
# controller, FAILOVER_RUNS times each (default 10; 3 with --quick), and
# measure kill -> first ack on every partition the victim led (reported per
# kind); then a SIGTERM rolling restart (max per-partition produce stall).
# Checks zero acknowledged loss. Broker defaults for the lease settings.
# SKIP_FAILOVER=1 skips it.
if [ "${SKIP_FAILOVER:-0}" != 1 ]; then
    runs="${FAILOVER_RUNS:-$([ "$QUICK" = 1 ] && echo 3 || echo 10)}"
    log "failover: 3 brokers, kill -9 x $runs leader + x $runs controller, rolling restart (bench/failover.py)"
    BENCH_DIR="$BENCH_DIR" KAAS_BIN="$KAAS_BIN" timeout 1800 \
        python3 "$ROOT/bench/failover.py" --runs "$runs" 2>>"$BENCH_DIR/failover.stderr" | tee -a "$RESULTS"
fi

# ---------------------------------------------------------------- 6. groups
# Consumer groups: offset commits/s (each durable before its answer), commit
# latency p50/p99 with the volume's fsync latency from the same run, 3-member
# rebalance time, coordinator takeover after kill -9 (bench/groups.py).
# SKIP_GROUPS=1 skips it.
if [ "${SKIP_GROUPS:-0}" != 1 ]; then
    log "groups: commit throughput and latency, rebalance, takeover (bench/groups.py)"
    BENCH_DIR="$BENCH_DIR" KAAS_BIN="$KAAS_BIN" timeout 1200 \
        python3 "$ROOT/bench/groups.py" $([ "$QUICK" = 1 ] && echo --quick) \
        2>>"$BENCH_DIR/groups.stderr" | tee -a "$RESULTS"
fi
