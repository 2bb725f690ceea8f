#!/usr/bin/env python3
"""Idempotent vs plain produce with the same client behaviour (broker cost).

librdkafka keeps one request in flight per partition when idempotent (it
counts in-flight *messages* against its limit of 5 *requests*), so
`rdkafka_performance` compares two different clients, not the broker's
sequence checks (BENCHMARKS.md). This sends the same pipeline both ways on
one connection: `--inflight` Produce v3 requests in flight (acks=all), each
one batch of `--records` records of `--size` bytes to partition 0; the
idempotent batches carry a producer id from InitProducerId and consecutive
sequences, the plain ones none. Rounds alternate the order (plain first,
then idempotent first). Batches are built before the clock starts (the CRC
is pure Python). Every answer must be NONE.

Usage: bench/idem_wire.py --bootstrap 127.0.0.1:9092 --topic t
       [--batches 2000] [--records 100] [--size 100] [--inflight 5] [--rounds 5]
Prints per run records/s, then the medians and idempotent/plain.
Loopback only; each run is bounded by the socket timeout.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
import kafka_wire as kw  # noqa: E402


def run(addr, topic, frames, inflight):
    """Send `frames` with `inflight` outstanding; records/s is the caller's."""
    with kw.connect(addr, timeout=60) as s:
        sent = done = 0
        t0 = time.monotonic()
        while done < len(frames):
            while sent < len(frames) and sent - done < inflight:
                s.sendall(frames[sent])
                sent += 1
            cid, results = kw.parse_produce_response_v3(kw.recv_frame(s))
            assert cid == done, (cid, done)
            assert results[0].error_code == 0, results
            done += 1
        return time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--records", type=int, default=100)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--inflight", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    host, port = a.bootstrap.rsplit(":", 1)
    addr = (host, int(port))
    err, pid, epoch = kw.init_producer_id(addr)
    assert err == 0, err
    recs = [kw.Rec(b"x" * a.size) for _ in range(a.records)]

    def frames(batches):
        return [kw.frame(kw.produce_request_v3(i, a.topic, 0, b, acks=-1))
                for i, b in enumerate(batches)]

    plain = frames([kw.record_batch_v2(recs)] * a.batches)
    seq = 0
    results = {"plain": [], "idempotent": []}
    for rnd in range(a.rounds):
        idem = []
        for _ in range(a.batches):
            idem.append(kw.record_batch_v2(recs, producer_id=pid, producer_epoch=epoch,
                                           base_sequence=seq))
            seq += a.records
        idem = frames(idem)
        order = [("plain", plain), ("idempotent", idem)]
        if rnd % 2:
            order.reverse()
        for name, fr in order:
            secs = run(addr, a.topic, fr, a.inflight)
            rate = a.batches * a.records / secs
            results[name].append(rate)
            print(f"round={rnd} {name}: {rate:.0f} records/s "
                  f"({a.batches / secs:.0f} batches/s)", flush=True)
    p = statistics.median(results["plain"])
    i = statistics.median(results["idempotent"])
    print(f"IDEM plain_median={p:.0f} idempotent_median={i:.0f} ratio={i / p:.3f} "
          f"rounds={a.rounds} batches={a.batches} records={a.records} inflight={a.inflight}")


if __name__ == "__main__":
    main()
