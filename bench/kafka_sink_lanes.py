"""Why the Kafka sink has two transactional producers taking turns (docs/architecture.md §3.18):
back-to-back Kafka transactions shaped like the sink's (records, then the ledger's offsets, then
the commit), from one transactional producer or from two in turn, against a real broker.

    .venv/bin/python bench/kafka_sink_lanes.py [--transactions 400] [--records 20] [--turns 5]
                                               [--bootstrap host:port]

Kafka's transaction coordinator refuses an id's next transaction (``CONCURRENT_TRANSACTIONS``,
which librdkafka retries) until the markers of its last one are written. With one producer every
transaction waits for them; with two, each id's last transaction is a cycle older. Prints, per
turn, the cycle's p50 / p90 / p99 in ms, its parts, the transactions a second and, for a broker
started here, the broker's CPU time per transaction (from /proc). The first turn of each warms the
broker's JIT and is printed, not summarized.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.kafka_broker

from percentiles import percentile  # noqa: E402
from tests.kafka_broker import KafkaBroker  # noqa: E402


def ms(values: list[float], q: float) -> float:
    return percentile(values, q) * 1000


def broker_cpu_s(broker: KafkaBroker) -> float | None:
    if broker.process is None:
        return None
    fields = Path(f"/proc/{broker.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def turn(broker: KafkaBroker, lanes: int, transactions: int, records: int) -> dict[str, Any]:
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic, boot = broker.create_topic(partitions=3), broker.bootstrap_servers
    pairs = []
    for _ in range(lanes):  # the sink's producer settings (spark/kafka_sink.py)
        txn_id = f"lanes-{uuid.uuid4().hex[:8]}"
        producer = Producer({"bootstrap.servers": boot, "transactional.id": txn_id, "linger.ms": 1,
                             "retry.backoff.ms": 2, "partitioner": "murmur2_random"})
        producer.init_transactions(30)
        pairs.append((producer, Consumer({"bootstrap.servers": boot, "group.id": txn_id, "enable.auto.commit": False})))
    cycles, offsets, commits = [], [], []
    cpu_before, started = broker_cpu_s(broker), time.monotonic()
    for i in range(transactions):
        producer, group = pairs[i % lanes]
        a = time.perf_counter()
        producer.begin_transaction()
        for r in range(records):
            producer.produce(topic, b"x" * 100, key=f"{i}:{r}".encode())
        b = time.perf_counter()
        producer.send_offsets_to_transaction([TopicPartition(topic, 0, i + 1, metadata="ledger")],
                                             group.consumer_group_metadata(), 30)
        c = time.perf_counter()
        producer.commit_transaction(30)
        d = time.perf_counter()
        cycles.append(d - a)
        offsets.append(c - b)
        commits.append(d - c)
    elapsed, cpu_after = time.monotonic() - started, broker_cpu_s(broker)
    for _, group in pairs:
        group.close()
    return {"lanes": lanes, "p50": ms(cycles, 0.5), "p90": ms(cycles, 0.9),
            "p99": ms(cycles, 0.99), "offsets": ms(offsets, 0.5), "commit": ms(commits, 0.5),
            "rate": transactions / elapsed,
            "cpu_ms": None if cpu_before is None or cpu_after is None else
            (cpu_after - cpu_before) * 1000 / transactions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=400)
    parser.add_argument("--records", type=int, default=20)
    parser.add_argument("--turns", type=int, default=5, help="turns of each, after one warm-up turn of each")
    parser.add_argument("--bootstrap", default=None, help="a running broker (else one is started here)")
    args = parser.parse_args()
    broker = KafkaBroker(args.bootstrap).start()
    results: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    print(f"{args.transactions} transactions of {args.records} records each a turn; cycle ms")
    print(f"{'turn':>6} {'lanes':>5} {'p50':>7} {'p90':>7} {'p99':>7} {'offsets p50':>12} {'commit p50':>11} "
          f"{'txn/s':>7} {'broker CPU ms/txn':>18}")
    try:
        for t in range(args.turns + 1):
            for lanes in (1, 2) if t % 2 == 0 else (2, 1):  # which goes first alternates
                r = turn(broker, lanes, args.transactions, args.records)
                cpu = "" if r["cpu_ms"] is None else f"{r['cpu_ms']:.2f}"
                print(f"{'warm-up' if t == 0 else t:>6} {lanes:>5} {r['p50']:7.2f} {r['p90']:7.2f} {r['p99']:7.2f} "
                      f"{r['offsets']:12.2f} {r['commit']:11.2f} {r['rate']:7.0f} {cpu:>18}")
                if t:
                    results[lanes].append(r)
    finally:
        broker.stop()
    for lanes, rs in results.items():
        print(f"{lanes} lane{'s' if lanes > 1 else ''}: cycle p50 {min(r['p50'] for r in rs):.1f}-"
              f"{max(r['p50'] for r in rs):.1f} ms, p99 {min(r['p99'] for r in rs):.1f}-{max(r['p99'] for r in rs):.1f} ms")


if __name__ == "__main__":
    main()
