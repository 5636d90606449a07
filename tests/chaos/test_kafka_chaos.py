"""Kafka in, Kafka and Delta out, under chaos: a topic of 3 partitions (a 4th added while it runs,
which must be read from its first offset) -> two keyed stages -> a Kafka sink and a Delta sink, in
both modes, with the driver and the workers SIGKILLed again and again, some of the kills inside a
sink's commit: the Kafka sink's transaction (the ``sink_commit`` failpoint: records and ledger
sent, not committed) or the Delta sink's write (``lake_commit``: data files being written, no
version committed). The input is fed until the last kill, so that a kill inside a commit always
has a commit to come. A ``read_committed`` consumer of the output topic and the Delta table (read
with ``deltalake``, and by Spark alone from the files its log lists) must each hold every input
record exactly once, and each producer's Delta application transaction must be the last of its
batches the table holds.

CI runs three kills (one inside each sink's commit, one worker) in continuous mode; ``scripts/test
--long tests/chaos`` runs three in micro-batch mode too, and twelve a mode (four inside a sink
commit). Another sink joins by an entry in ``kafka_topology.SINKS``, one in ``READERS`` below, and,
for kills inside its commit, one in ``COMMIT_STEPS``.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from headrace.lake import batches_of
from headrace.monitor.status import status
from headrace.names import lake_app_id

from ..ci import long_only
from ..kafka.sinks import read_topic
from .kafka_topology import USERS
from .test_chaos import kill_a_worker

SCRIPT = Path(__file__).with_name("kafka_topology.py")


def delta_ns(broker: Any, path: str) -> list[int]:
    """Every row's n in the Delta table (its value column: the record's value, pickled)."""
    try:
        table = DeltaTable(path)
    except TableNotFoundError:  # no write yet
        return []
    return [pickle.loads(v)["n"] for v in table.to_pyarrow_table(columns=["value"])["value"].to_pylist()]


def stage_summary(store: str) -> dict[str, dict[str, Any]]:
    """Each stage's watermark and late and dead-letter counts, for a failure's message."""
    keys = ("input_watermark", "output_watermark", "records", "late_dropped", "late_delivered", "dead_letters",
            "backlog_records")
    try:
        stages = status(store)["stages"]
    except Exception as exc:  # the message must not hide the failure it describes
        return {"status failed": {"error": repr(exc)}}
    return {name: {k: stage.get(k) for k in keys} for name, stage in stages.items()}


# how to read back what each sink of kafka_topology.SINKS holds: the n of every record, with repeats
READERS: dict[str, Callable[[Any, str], list[int]]] = {
    "kafka": lambda broker, topic: [json.loads(m.value)["n"] for m in read_topic(broker.bootstrap_servers, topic)],
    "delta": delta_ns,
}
# the failpoint inside each sink's commit (store/failpoints.py), which is also a kind of kill
COMMIT_STEPS = {"kafka": "sink_commit", "delta": "lake_commit"}


class Feeder(threading.Thread):
    """Produces at least ``n`` events to the input topic at ``rate`` a second, and goes on until
    ``done`` is set (a kill inside a sink's commit needs a commit to come: a pipeline that had caught
    up with a finished feed would never commit again); at event ``n // 2`` it adds a partition and
    sends every fifth event after that to it. ``sent`` is how many it produced, every one
    acknowledged by the broker (else ``error`` says how many were not)."""

    def __init__(self, broker: Any, topic: str, n: int, rate: float, partitions: int):
        super().__init__(daemon=True)
        self.broker, self.topic, self.n, self.rate, self.partitions = broker, topic, n, rate, partitions
        self.error: BaseException | None = None
        self.added = threading.Event()
        self.done = threading.Event()
        self.sent = 0
        self.failed: list[Any] = []  # delivery errors the producer reported

    def _flush(self, producer: Any) -> None:
        left = producer.flush(30)
        if left or self.failed:
            raise RuntimeError(f"the feeder's events were not all delivered: {len(self.failed)} failed (first: "
                               f"{self.failed[:1]}), {left} still queued after 30 s")

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.failed.append(err)

    def run(self) -> None:
        from confluent_kafka import Producer

        try:
            config = {"bootstrap.servers": self.broker.bootstrap_servers, "enable.idempotence": True}
            producer = Producer(config)
            started = time.monotonic()
            i = 0
            while i < self.n or not self.done.is_set():
                if i == self.n // 2:
                    self._flush(producer)
                    self.broker.add_partitions(self.topic, self.partitions + 1)
                    self.added.set()
                    producer = Producer(config)  # one that knows the new partition
                value = json.dumps({"user": USERS[i % len(USERS)], "n": i, "ts": 1_700_000_000_000 + i * 5}).encode()
                extra = {"partition": self.partitions} if self.added.is_set() and i % 5 == 0 else {}
                producer.produce(self.topic, value, key=USERS[i % len(USERS)].encode(), on_delivery=self._delivered,
                                 **extra)
                producer.poll(0)
                i += 1
                ahead = i / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)  # pacing the load, not ordering anything
            self._flush(producer)
            self.sent = i
        except BaseException as exc:
            self.error = exc


class KafkaMonkey:
    def __init__(self, tmp: Path, broker: Any, mode: str, sinks: dict[str, str], seed: int):
        self.broker, self.mode, self.sinks = broker, mode, sinks
        self.store = f"sqlite:///{tmp}/store.db"
        self.input = broker.create_topic(partitions=3)
        # a mark directory per step: both sinks' writers sleep in the driver, and a marker is named by pid
        self.marks = {COMMIT_STEPS[kind]: tmp / "marks" / kind for kind in sinks}
        for folder in self.marks.values():
            folder.mkdir(parents=True)
        self.rng = random.Random(seed)
        self.kills: Counter[str] = Counter()
        self.driver: subprocess.Popen[str] | None = None
        self.log = open(tmp / "drivers.log", "a")
        self.began = time.monotonic()
        self.times: list[str] = []  # when each kill happened (s since the start), for the summary

    def start(self) -> None:
        failpoints = ";".join(f"{step}=sleep:100:{folder}" for step, folder in self.marks.items())
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "HEADRACE_FAILPOINTS": failpoints}
        sinks = [f"{kind}={arg}" for kind, arg in self.sinks.items()]
        self.driver = subprocess.Popen([sys.executable, str(SCRIPT), self.store, self.mode,
                                        self.broker.bootstrap_servers, self.input, *sinks],
                                       env=env, stdout=self.log, stderr=self.log, text=True, start_new_session=True)

    def alive(self) -> bool:
        return self.driver is not None and self.driver.poll() is None

    def kill_driver(self, kind: str = "driver") -> None:
        assert self.driver is not None
        os.killpg(self.driver.pid, signal.SIGKILL)
        self.driver.wait()
        for folder in self.marks.values():
            for mark in folder.iterdir():
                mark.unlink(missing_ok=True)
        self.kills[kind] += 1
        self.times.append(f"{kind} {time.monotonic() - self.began:.0f}s")
        self.start()

    def kill_worker(self) -> bool:
        assert self.driver is not None
        if not kill_a_worker(self.store, self.driver.pid, self.mode, self.rng):
            return False
        self.kills["worker"] += 1
        self.times.append(f"worker {time.monotonic() - self.began:.0f}s")
        return True

    def kill_in_commit(self, step: str, wait_s: float = 60.0) -> bool:
        """SIGKILL the driver while a sink's writer sleeps at ``step``, inside its commit."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and self.alive():
            if any(self.marks[step].iterdir()):
                self.kill_driver(step)
                return True
            time.sleep(0.005)
        return False

    def run(self, kills: int, kinds: tuple[str, ...], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        self.start()
        while sum(self.kills.values()) < kills:
            assert time.monotonic() < deadline, (
                f"chaos ran out of time after {dict(self.kills)} ({', '.join(self.times)}); stages: "
                f"{stage_summary(self.store)}; drivers' log: {Path(self.log.name).read_text()[-3000:]}")
            if not self.alive():  # a worker kill must not bring it down (micro-batch: its query starts again)
                raise AssertionError(f"a driver exited: {Path(self.log.name).read_text()[-3000:]}")
            missing = [k for k in kinds if self.kills[k] < kinds.count(k)]
            kind = missing[0] if missing else self.rng.choice(kinds)
            if kind in self.marks:
                self.kill_in_commit(kind)
            elif kind == "worker":
                self._when_running()
                self.kill_worker()
                time.sleep(self.rng.uniform(0.5, 2))
            else:
                time.sleep(self.rng.uniform(2, 6))
                self.kill_driver()
        print(f"kafka chaos: survived {dict(self.kills)}: {', '.join(self.times)}")

    def _when_running(self, wait_s: float = 60.0) -> None:
        """Wait until the pipeline runs again: its sink has committed since the last restart."""
        deadline = time.monotonic() + wait_s
        while (time.monotonic() < deadline and self.alive()
               and not any(any(folder.iterdir()) for folder in self.marks.values())):
            time.sleep(0.01)

    def stop(self) -> None:
        if self.alive():
            assert self.driver is not None
            os.killpg(self.driver.pid, signal.SIGKILL)
            self.driver.wait()


def kafka_chaos(broker: Any, spark: Any, tmp_path: Path, mode: str, kills: int, kinds: tuple[str, ...], n: int,
                rate: float, timeout_s: float) -> None:
    sinks = {"kafka": broker.create_topic(partitions=3), "delta": str(tmp_path / "delta")}
    monkey = KafkaMonkey(tmp_path, broker, mode, sinks, seed=kills)
    feeder = Feeder(broker, monkey.input, n, rate, partitions=3)
    try:
        feeder.start()
        try:
            monkey.run(kills, kinds, timeout_s)
        finally:
            feeder.done.set()
        feeder.join(timeout=timeout_s)
        assert feeder.error is None and feeder.added.is_set() and feeder.sent >= n, (feeder.error, feeder.sent)
        n = feeder.sent
        deadline = time.monotonic() + timeout_s
        while True:  # no more kills: let it write everything
            held = {kind: READERS[kind](broker, arg) for kind, arg in sinks.items()}
            if all(len(set(ns)) >= n for ns in held.values()):
                break
            assert time.monotonic() < deadline, (
                f"the sinks never held all {n}: {[len(set(v)) for v in held.values()]}, missing "
                f"{ {kind: sorted(set(range(n)) - set(ns))[:20] for kind, ns in held.items()} }; stages: "
                f"{stage_summary(monkey.store)}; drivers' log: "
                f"{Path(monkey.log.name).read_text()[-3000:]}")
            assert monkey.alive(), f"a driver exited: {Path(monkey.log.name).read_text()[-3000:]}"
            time.sleep(1)
        time.sleep(1)  # a last look for copies written after the last record
        held = {kind: READERS[kind](broker, arg) for kind, arg in sinks.items()}
        print(f"kafka chaos: every record out after {time.monotonic() - monkey.began:.0f}s")
    finally:
        monkey.stop()
    for kind, ns in held.items():
        doubled = sorted(x for x, c in Counter(ns).items() if c > 1)
        assert sorted(set(ns)) == list(range(n)) and not doubled, (kind, doubled[:10], sorted(set(range(n)) - set(ns))[:10])
    # Spark alone, reading the files the Delta log lists, sees the same rows
    table = DeltaTable(sinks["delta"])
    rows = spark.read.option("basePath", sinks["delta"]).parquet(*table.file_uris()).select("value").collect()
    assert sorted(pickle.loads(r.value)["n"] for r in rows) == list(range(n))
    # the Delta sink's application transaction of each producer is the last of its batches the table holds
    last = batches_of(table.to_pyarrow_table(columns=["producer", "batch"]))
    assert last and {p: table.transaction_version(lake_app_id("delta-out", p)) for p in last} == last
    late = [m for m in read_topic(broker.bootstrap_servers, monkey.input) if m.partition == 3]
    assert late, "nothing was sent to the partition added mid-run"  # and the oracle above holds its records
    assert sum(monkey.kills.values()) >= kills, monkey.kills
    assert all(monkey.kills[step] >= kinds.count(step) for step in COMMIT_STEPS.values()), monkey.kills


@pytest.mark.parametrize("mode", ["continuous", "microbatch"])
def test_kafka_to_kafka_and_delta_holds_every_record_once_after_three_kills(kafka_broker: Any, spark: Any,
                                                                            tmp_path: Path, mode: str) -> None:
    if mode == "microbatch":  # with the Delta sink too: 54 s and 58 s in two runs here
        long_only("the micro-batch Kafka chaos", covered_by="the continuous one (32-34 s here)")
    kafka_chaos(kafka_broker, spark, tmp_path, mode, kills=3, kinds=("sink_commit", "worker", "lake_commit"), n=3_000,
                rate=150, timeout_s=240)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["continuous", "microbatch"])
def test_kafka_to_kafka_and_delta_holds_every_record_once_after_twelve_kills(kafka_broker: Any, spark: Any,
                                                                             tmp_path: Path, mode: str) -> None:
    kafka_chaos(kafka_broker, spark, tmp_path, mode, kills=12,
                kinds=("sink_commit", "lake_commit", "driver", "worker", "sink_commit", "lake_commit", "worker",
                       "driver"),
                n=15_000, rate=120, timeout_s=900)
