"""Throughput of keyed count -> Delta on the machine's 2 cores: how much the Delta sink costs a
topology, against the same topology without a sink and with Spark's own Parquet file sink, all in
the same run and SparkSession.

    .venv/bin/python bench/delta_sink.py                 # 200,000 records over 10,000 keys, both modes
    .venv/bin/python bench/delta_sink.py --quick         # 20,000 over 1,000, continuous mode only
    .venv/bin/python bench/delta_sink.py --source kafka  # Kafka -> keyed count -> Delta, beside the bus input

The work: ``Count`` (a per-key count in keyed state) produces each key's new count for every
record to the typed stream ``counts`` (``word STRING, count BIGINT``); the sink, if any, writes
that stream. The input is published to the bus first (untimed, as bench/spark_keyed_count.py
does); the clock runs from ``run`` until it returns, which is once the computation has drained
and every sink has written everything journaled. Each variant's output is checked after the
clock: the Delta table (read with deltalake), the Parquet files (read with Spark) and, with no
sink, the stream (``headrace.read``) hold one row per record, and each key's highest count equals
a plain-Python Counter of the input; a failed check exits before any number is printed.

``--source kafka`` (issue 24: the throughput of Kafka -> keyed count -> Delta) runs, beside the bus
input with no sink and with the Delta sink, the same two with a real Kafka topic as the input: a
broker (KRaft, one node on 127.0.0.1, started here from scripts/ensure-kafka's jars, as the tests
start it), a topic of 3 partitions filled with the same records (JSON, keyed by the record's key)
and flushed before the clock starts, read by ``injectors.kafka(..., timestamp="ts", bounded=True)``
so ``run`` returns once the topic is drained and every sink has written everything. The clock then
includes reading Kafka and journaling the input, which the bus variants did before theirs started.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.kafka_broker, for --source kafka

from headrace import Computation, Topology, injectors, key_by, read, run  # noqa: E402
from headrace.injectors import Injector, Several  # noqa: E402
from headrace.spark.session import spark_session  # noqa: E402


class Count(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1
        ctx.produce("counts", {"word": ctx.key, "count": ctx.state})


def records(n: int, keys: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"key": f"key-{rng.randrange(keys)}", "ts": 1_000_000 + i} for i in range(n)]


def topology(source: Injector | Several, shards: int, sink: str, folder: str) -> Topology:
    t = Topology("keyed_count_sink")
    t.inject("events", source)
    t.add(Count, inputs={"events": key_by("key")}, outputs=["counts"], shards=shards)
    t.stream("counts", schema="word STRING, count BIGINT")
    if sink == "delta":
        t.sink("counts", delta=os.path.join(folder, "delta"))
    elif sink == "parquet":
        t.sink("counts", format="parquet", path=os.path.join(folder, "parquet"))
    return t


def fill(broker: Any, data: list[dict[str, Any]]) -> str:
    """A new topic of 3 partitions holding ``data`` (JSON, keyed by the record's key), flushed."""
    from confluent_kafka import Producer

    topic = broker.create_topic(partitions=3)
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "enable.idempotence": True,
                         "linger.ms": 20, "queue.buffering.max.messages": 1_000_000})
    for r in data:
        producer.produce(topic, json.dumps(r).encode(), key=r["key"].encode())
        producer.poll(0)
    left = producer.flush(120)
    if left:
        sys.exit(f"the input topic did not take every record: {left} of {len(data)} not delivered")
    return topic


def measure(spark: Any, data: list[dict[str, Any]], batch: int, shards: int, source: str, sink: str, mode: str,
            broker: Any = None) -> float:
    folder = tempfile.mkdtemp(prefix=f"headrace-delta-bench-{source}-{sink}-")
    url = f"sqlite:///{folder}/store.db"
    options: dict[str, Any] = {"trigger_ms": 100} if mode == "microbatch" else {}
    inject: Injector | Several
    if source == "kafka":
        inject = injectors.kafka(fill(broker, data), broker.bootstrap_servers, timestamp="ts", batch_size=batch,
                                 bounded=True)
    else:
        # the same name and mode as the run timed below: a store refuses a second owner of a stream,
        # and a topology keeps one mode per store
        bus = Topology("keyed_count_sink")
        bus.inject("events", injectors.records(data, timestamp="ts", batch_size=batch))
        run(bus, store=url, spark=spark, progress=None, mode=mode, **options)
        inject = injectors.records(data, timestamp="ts", batch_size=batch)  # published already: nothing to do
    start = time.perf_counter()
    run(topology(inject, shards, sink, folder), store=url, spark=spark, progress=None, mode=mode, **options)
    elapsed = time.perf_counter() - start
    check(spark, data, source, sink, folder, url)
    return elapsed


def check(spark: Any, data: list[dict[str, Any]], source: str, sink: str, folder: str, url: str) -> None:
    if sink == "none":
        got = [(r.value["word"], r.value["count"]) for r in read("counts", url)]
    elif sink == "delta":
        from deltalake import DeltaTable

        rows = DeltaTable(os.path.join(folder, "delta")).to_pyarrow_table(columns=["word", "count"]).to_pylist()
        got = [(r["word"], r["count"]) for r in rows]
    else:
        got = [(r.value.word, r.value["count"]) for r in spark.read.parquet(os.path.join(folder, "parquet")).collect()]
    highest: dict[str, int] = {}
    for key, count in got:
        highest[key] = max(highest.get(key, 0), count)
    expected = Counter(r["key"] for r in data)
    if len(got) != len(data) or highest != expected:
        sys.exit(f"{source} -> {sink}: {len(got)} rows for {len(data)} records, counts equal: {highest == expected}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=20_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--modes", default="continuous,microbatch")
    parser.add_argument("--source", choices=("bus", "kafka"), default="bus",
                        help="kafka: Kafka -> keyed count -> (no sink, Delta) beside the bus input")
    parser.add_argument("--quick", action="store_true", help="20,000 records over 1,000 keys, continuous mode")
    args = parser.parse_args()
    if args.quick:
        args.records, args.keys, args.batch, args.modes = 20_000, 1_000, 5_000, "continuous"
    variants = ([("bus", "none"), ("bus", "delta"), ("kafka", "none"), ("kafka", "delta")] if args.source == "kafka"
                else [("bus", "none"), ("bus", "parquet"), ("bus", "delta")])
    data = records(args.records, args.keys)
    broker = None
    if args.source == "kafka":
        from tests.kafka_broker import KafkaBroker

        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        broker = KafkaBroker().start()
    spark = spark_session(args.master, conf={"spark.sql.shuffle.partitions": str(args.shards)}, ui=False)
    print(f"keyed count -> sink: {args.records:,} records over {args.keys:,} keys, {args.shards} shards, "
          f"{args.master} on {os.cpu_count()} cores ({platform.machine()}), SQLite store"
          + (", Kafka 3 partitions on 127.0.0.1" if broker else ""))
    try:
        for mode in args.modes.split(","):
            small = records(2_000, 100, seed=1)
            for source, sink in variants:  # warm-up: the session, the Python workers, the libraries
                measure(spark, small, 1_000, args.shards, source, sink, mode, broker)
            seconds = {(source, sink): measure(spark, data, args.batch, args.shards, source, sink, mode, broker)
                       for source, sink in variants}
            report(mode, args.records, seconds)
    finally:
        spark.stop()
        if broker is not None:
            broker.stop()


def report(mode: str, n: int, seconds: dict[tuple[str, str], float]) -> None:
    print(f"\n{mode} mode")
    print(f"{'source':<7} {'sink':<10} {'seconds':>8} {'records/s':>10} {'vs no sink':>11}")
    for (source, sink), s in seconds.items():
        print(f"{source:<7} {sink:<10} {s:>8.2f} {n / s:>10,.0f} {seconds[(source, 'none')] / s:>10.2f}x")
    if ("bus", "parquet") in seconds:
        print(f"delta vs Spark's parquet file sink: {seconds[('bus', 'parquet')] / seconds[('bus', 'delta')]:.2f}x")
    if ("kafka", "delta") in seconds:
        print(f"kafka -> delta vs bus -> delta: {seconds[('bus', 'delta')] / seconds[('kafka', 'delta')]:.2f}x "
              "the records/s (the kafka variants' clock includes reading the topic and journaling the input)")


if __name__ == "__main__":
    main()
