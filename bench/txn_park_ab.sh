#!/bin/bash
# A/B of the coordinator's wait for a previous transaction's completion
# (BENCHMARKS.md, Transactions): /tmp/kaas-variant is a release build with
# `txn::coordinator::PARK_ADDS_FOR` set to 0 (CONCURRENT_TRANSACTIONS at
# once, as before), /tmp/kaas-new the unchanged release build. Alternates
# them, three rounds, a fresh broker and data dir per run.
cd "$(dirname "$0")/.."
for round in 1 2 3; do
  for bin in variant new; do
    D=$(mktemp -d /tmp/txnab.XXXX)
    /tmp/kaas-$bin broker --data-dir $D --listen 127.0.0.1:19392 --metrics-listen 127.0.0.1:19393 --broker-id 0 > $D.log 2>&1 &
    pid=$!
    sleep 3
    T=tab-$round-$bin
    ${PYTHON:-python3} -c "
from confluent_kafka.admin import AdminClient, NewTopic
a=AdminClient({'bootstrap.servers':'127.0.0.1:19392','broker.address.family':'v4'})
a.create_topics([NewTopic('$T',1,1)])['$T'].result(30)"
    out=$(${PYTHON:-python3} bench/transactions.py --bootstrap 127.0.0.1:19392 --topic $T --txns 2000 --producers 8 2>&1 | tail -1)
    adds=$(curl -s 127.0.0.1:19393/metrics | grep -i 'api="AddPartitionsToTxn"' | grep -i request | head -2 | tr '\n' ' ')
    echo "$bin round=$round $out load=$(cut -d' ' -f1 /proc/loadavg) $adds"
    kill $pid; wait $pid 2>/dev/null
    rm -rf $D $D.log
  done
done
