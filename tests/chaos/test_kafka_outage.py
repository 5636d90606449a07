"""Kafka in, Kafka out, while the broker goes away: it stops answering (SIGSTOP, a host that
stalls) or it restarts (SIGKILL, then started again on its port from its logs, a host that
rebooted), with records on their way through the pipeline. The pipeline (``kafka_topology.py``:
a topic of three partitions -> two keyed stages -> a Kafka sink, continuous mode) must ride it
out without a restart of its own: once the broker is back, a ``read_committed`` consumer of the
output sees every input record exactly once, and the driver is still the one that started.
Each outage falls on an open transaction of the sink (held 300 ms at its ``sink_commit`` failpoint),
and the driver must say it gave one up. Before the sink started its producers again
(``KafkaSink._loop``), the restart left its writer waiting inside librdkafka's
``send_offsets_to_transaction`` for good (the test failed; py-spy found the sink's thread still in
that call minutes after the broker was back).

The broker is this test's own, not the session's, since it is stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest

from ..kafka.sinks import read_topic
from ..kafka_broker import KafkaBroker
from .kafka_topology import USERS

SCRIPT = Path(__file__).with_name("kafka_topology.py")
PER_WAVE = 600
# how long the broker stops answering: past the sink's wait for a transactional call (TIMEOUT_S + 1
# s), which it then gives up, and the injector's look for new partitions (LIST_TIMEOUT_S, 10 s)
PAUSE_S = 35.0
RETRIED = "the Kafka sink starts its producers again"  # what the driver prints when it gives a transaction up


@pytest.fixture
def broker() -> Iterator[KafkaBroker]:
    b = KafkaBroker().start()
    yield b
    b.stop()


def produce(broker: KafkaBroker, topic: str, ns: range) -> None:
    from confluent_kafka import Producer

    failed: list[Any] = []
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "enable.idempotence": True})
    for n in ns:
        value = json.dumps({"user": USERS[n % len(USERS)], "n": n, "ts": 1_700_000_000_000 + n * 5}).encode()
        producer.produce(topic, value, key=USERS[n % len(USERS)].encode(),
                         on_delivery=lambda err, _: failed.append(err) if err is not None else None)
        producer.poll(0)
    assert producer.flush(60) == 0 and failed == [], f"the input was not all delivered: {failed[:1]}"


def wait_for_output(broker: KafkaBroker, topic: str, expected: int, driver: subprocess.Popen[str],
                    log: Path, timeout_s: float = 180.0) -> Counter[int]:
    """The output's n, counted, once it holds ``expected`` distinct ones (the driver must stay up)."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert driver.poll() is None, f"the driver exited ({driver.returncode}):\n{log.read_text()[-3000:]}"
        seen = Counter(json.loads(m.value)["n"] for m in read_topic(broker.bootstrap_servers, topic, timeout_s=60))
        if len(seen) >= expected:
            return seen
        assert time.monotonic() < deadline, (f"{len(seen)} of {expected} records out after {timeout_s:.0f} s:\n"
                                             f"{log.read_text()[-3000:]}")
        time.sleep(0.5)  # polling the output for a state


@pytest.mark.parametrize("outage", [pytest.param("paused", marks=pytest.mark.slow), "restarted"])  # a 35 s pause
def test_kafka_to_kafka_rides_out_a_broker_outage_and_holds_every_record_once(broker: KafkaBroker, tmp_path: Path,
                                                                              outage: str) -> None:
    source, out = broker.create_topic(partitions=3), broker.create_topic(partitions=2)
    log, marks = tmp_path / "driver.log", tmp_path / "marks"
    marks.mkdir()
    # the sink's commits wait 300 ms at sink_commit, records and ledger sent, a mark file present meanwhile:
    # the broker goes while a transaction is open
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "HEADRACE_FAILPOINTS": f"sink_commit=sleep:300:{marks}"}
    with log.open("w") as written:
        driver = subprocess.Popen([sys.executable, str(SCRIPT), f"sqlite:///{tmp_path}/store.db", "continuous",
                                   broker.bootstrap_servers, source, f"kafka={out}"],
                                  env=env, stdout=written, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        produce(broker, source, range(0, PER_WAVE))
        wait_for_output(broker, out, PER_WAVE, driver, log)
        produce(broker, source, range(PER_WAVE, 2 * PER_WAVE))  # on their way when the broker goes
        deadline = time.monotonic() + 60
        while not any(marks.iterdir()):  # a transaction open, about to commit
            assert time.monotonic() < deadline, "the sink never committed the second wave"
            time.sleep(0.005)
        assert broker.process is not None
        if outage == "paused":
            os.killpg(broker.process.pid, signal.SIGSTOP)
            try:
                time.sleep(PAUSE_S)  # the outage's length, not an ordering
            finally:
                os.killpg(broker.process.pid, signal.SIGCONT)
        else:
            broker.restart()
        produce(broker, source, range(2 * PER_WAVE, 3 * PER_WAVE))
        wait_for_output(broker, out, 3 * PER_WAVE, driver, log)
        seen = wait_for_output(broker, out, 3 * PER_WAVE, driver, log)  # read again: a late duplicate shows
        assert set(seen) == set(range(3 * PER_WAVE)), sorted(set(seen) ^ set(range(3 * PER_WAVE)))[:10]
        doubled = {n: c for n, c in seen.items() if c > 1}
        assert doubled == {}, f"{len(doubled)} records out more than once, e.g. {list(doubled.items())[:5]}"
        assert RETRIED in log.read_text(), "the outage never failed a transaction: the test did not test"
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
