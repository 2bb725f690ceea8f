#!/usr/bin/env bash
# A/B produce ack latency at a fixed rate, in one run: each binary in turn,
# order rotated every round, a fresh data dir and broker per run, then
# bench/latency.py (confluent-kafka, default client settings, acks=all,
# 100 B; ACKS=all or 1) for SECONDS at RATE records/s. Prints one LATENCY
# line per run, with the broker's fsync p50/p99 of the same run (upper
# bounds of kaas_fsync_seconds buckets from /metrics), the broker's own
# produce time (kaas_produce_seconds: frame read to answer written) and the data
# directory's own 4 KiB write + fdatasync p50/p99 measured right after,
# and the broker's context switches (voluntary + involuntary, all its
# threads, from /proc) and CPU time (utime + stime) per produced record over
# the load: the thread hand-offs per acknowledgement, counted rather than
# timed, so they compare across runs however loud the machine is.
# Loopback only; every run bounded by a timeout.
#
#   bench/latency_ab.sh [RATE] [ROUNDS] before=/tmp/kaas-old after=target/release/kaas
#
# RDKAFKA_PERF=<rdkafka_performance> uses librdkafka's C load tool instead
# of latency.py (ack latency only). TMPDIR=/dev/shm puts the data dir on
# tmpfs: fsync costs nothing there, so the same client against the same
# broker gives the latency floor that is not the disk's (client, loopback,
# thread wake-ups on this machine). BROKER_ARGS adds broker flags (e.g.
# --cluster-dir on another device).
set -u
cd "$(dirname "$0")/.."
RATE="${1:-5000}"; ROUNDS="${2:-3}"; shift 2 || true
SECONDS_RUN="${SECONDS_RUN:-8}"
bins=("$@")
[ "${#bins[@]}" -ge 1 ] || { echo "usage: $0 RATE ROUNDS name=binary ..." >&2; exit 2; }
# "<context switches> <CPU ticks>" of process $1, all threads.
cost() {
    local cs=0 f v
    for f in /proc/"$1"/task/*/status; do
        v="$(awk '/ctxt_switches/ {s += $2} END {print s + 0}' "$f" 2>/dev/null)"
        cs=$((cs + ${v:-0}))
    done
    echo "$cs $(awk '{print $14 + $15}' /proc/"$1"/stat)"
}
for ((round = 0; round < ROUNDS; round++)); do
  n=${#bins[@]}
  for ((k = 0; k < n; k++)); do
    spec="${bins[$(((k + round) % n))]}"; name="${spec%%=*}"; bin="${spec#*=}"
    # Two ports the kernel just handed out (a random pick collided with
    # other agents' brokers).
    d="$(mktemp -d)"; read -r port mport < <(.venv/bin/python3 -c "
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(('127.0.0.1', 0))
print(*[x.getsockname()[1] for x in s])")
    # shellcheck disable=SC2086 # BROKER_ARGS: extra broker flags, split on spaces
    "$bin" broker --data-dir "$d" --listen "127.0.0.1:$port" --metrics-listen "127.0.0.1:$mport" ${BROKER_ARGS:-} >"$d/log" 2>&1 &
    pid=$!
    sleep 1.5
    .venv/bin/python3 -c "
from confluent_kafka.admin import AdminClient, NewTopic
a = AdminClient({'bootstrap.servers': '127.0.0.1:$port'})
a.create_topics([NewTopic('lat', 1, 1)])['lat'].result(20)" 2>/dev/null
    sleep 1
    before="$(cost "$pid")"
    if [ -n "${RDKAFKA_PERF:-}" ]; then
        # The C client: rdkafka_performance -l stamps each record and takes
        # its delivery report's latency (no Python, no GIL); linger.ms 0 as
        # latency.py (rdkafka_performance's own default is 1000). The first
        # 500 records (connection and metadata set-up) are not counted.
        acks="${ACKS:-all}"; [ "$acks" = all ] && acks=-1
        timeout 60 "$RDKAFKA_PERF" -P -t lat -p 0 -b "127.0.0.1:$port" -s 100 -r "$RATE" \
            -c "$((RATE * SECONDS_RUN))" -l -A "$d/lat.txt" -X linger.ms=0 -a "$acks" -q >/dev/null 2>&1
        line="$(.venv/bin/python3 -c "
v = sorted(int(x) for x in list(open('$d/lat.txt'))[500:])
n = len(v)
print(f'LATENCY client=c ack_p50_ms={v[n // 2] / 1e3:.2f} ack_p99_ms={v[int(n * 0.99)] / 1e3:.2f} n={n} rate=$RATE')" 2>/dev/null)"
    else
        line="$(timeout 60 .venv/bin/python3 bench/latency.py --bootstrap "127.0.0.1:$port" --topic lat \
            --rate "$RATE" --seconds "$SECONDS_RUN" --acks "${ACKS:-all}" 2>/dev/null | grep LATENCY)"
    fi
    fsync="$(.venv/bin/python3 -c "
import re, urllib.request
t = urllib.request.urlopen('http://127.0.0.1:$mport/metrics', timeout=5).read().decode()
def hist(name):
    b = [(float('inf') if le == '+Inf' else float(le), int(n)) for le, n in
         re.findall(r'^' + name + r'_bucket\\{le=\"([^\"]+)\"\\} (\\d+)', t, re.M)]
    tot = b[-1][1] if b else 0
    q = lambda f: next((le * 1e3 for le, n in b if n >= f * tot), float('nan'))
    return q(0.5), q(0.99), tot
f50, f99, n = hist('kaas_fsync_seconds')
p50, p99, _ = hist('kaas_produce_seconds')
print(f'fsync_p50_ms<={f50:g} fsync_p99_ms<={f99:g} fsyncs={n} broker_produce_p50_ms<={p50:g} broker_produce_p99_ms<={p99:g}')" 2>/dev/null)"
    # The data volume's own fsync, measured right after the load on the
    # same directory: 500 x (append 4 KiB + fdatasync) from one loop.
    probe="$(.venv/bin/python3 -c "
import os, time
fd = os.open('$d/fsync-probe', os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
b, t = b'x' * 4096, []
for _ in range(500):
    s = time.perf_counter(); os.write(fd, b); os.fdatasync(fd); t.append(time.perf_counter() - s)
t.sort(); os.close(fd)
print(f'probe_fsync_p50_ms={t[250]*1e3:.3f} probe_fsync_p99_ms={t[int(0.99*500)]*1e3:.3f}')" 2>/dev/null)"
    after="$(cost "$pid")"
    recs="$(sed -n 's/.* n=\([0-9]*\).*/\1/p' <<<"$line")"
    per="$(awk -v b="$before" -v a="$after" -v n="${recs:-0}" -v hz="$(getconf CLK_TCK)" 'BEGIN {
        split(b, x); split(a, y)
        if (n > 0) printf "ctxsw_per_record=%.2f cpu_us_per_record=%.1f", (y[1] - x[1]) / n, (y[2] - x[2]) / hz * 1e6 / n }')"
    echo "round $round $name acks=${ACKS:-all} $line $fsync $probe $per"
    # A run with no result: say why (a broker that did not start, e.g. a
    # port taken between picking and binding, shows in its log).
    [ -n "$line" ] || { echo "round $round $name: no result; broker log tail:"; tail -3 "$d/log"; }
    kill "$pid"; wait "$pid" 2>/dev/null; rm -rf "$d"
  done
done
