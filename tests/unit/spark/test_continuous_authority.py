"""spark/continuous.py's watermark authority without a SparkSession (``refresh_watermarks`` needs
only the store): it journals under ``C`` the minimum of the watermarks each interval journaled with
its latest commit, only when that pair moved (docs/architecture.md §4.2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from headrace import Computation, Topology, injectors, key_by
from headrace.model import BEGINNING_OF_TIME
from headrace.names import meta
from headrace.spark.continuous import ContinuousRunner

SHARDS = 3


class Noop(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        pass


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[ContinuousRunner]:
    t = Topology("authority")
    t.inject("in", injectors.records([], timestamp="ts"))
    t.add(Noop, inputs={"in": key_by("k")}, shards=SHARDS)
    r = ContinuousRunner(t, f"sqlite:///{tmp_path}/store.db", ui=False)
    r.store.register("Noop", SHARDS, "continuous")
    r.store.put_meta(meta.driver(t.name), r.driver_id)
    yield r
    r.store.close()


def journal(r: ContinuousRunner) -> list[tuple[int, int, int]]:
    return [(b.batch, b.input_watermark, b.output_watermark) for b in r.store.batches("Noop")]


def test_the_authority_journals_the_minimum_over_every_intervals_latest_commit(runner: ContinuousRunner) -> None:
    store = runner.store
    store.complete_batch("Noop/0", 1, 50, 40)
    store.complete_batch("Noop/1", 1, 70, 60)
    assert runner.refresh_watermarks() == {"Noop": (BEGINNING_OF_TIME, BEGINNING_OF_TIME)}  # Noop/2: no commit yet
    store.complete_batch("Noop/2", 1, 30, 20)
    store.complete_batch("Noop/2", 2, 90, 80)  # only its latest commit counts
    assert runner.refresh_watermarks() == {"Noop": (50, 40)}
    runner.refresh_watermarks()  # nothing moved: nothing journaled
    store.complete_batch("Noop/0", 2, 75, 65)
    assert runner.refresh_watermarks() == {"Noop": (70, 60)}
    assert journal(runner) == [(1, BEGINNING_OF_TIME, BEGINNING_OF_TIME), (2, 50, 40), (3, 70, 60)]
