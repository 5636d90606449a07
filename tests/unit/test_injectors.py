from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from headrace import injectors
from headrace.errors import OptionError
from headrace.model import END_OF_TIME

NOW = 1_700_000_000_000  # the injected clock's reading, ms since the epoch


def clock() -> int:
    return NOW


def drain(injector: injectors.Injector, resume: str | None = None) -> list[injectors.InjectedBatch]:
    return list(injector.batches(resume))


def test_a_list_gets_an_exact_low_watermark_the_oldest_timestamp_not_yet_injected() -> None:
    values = [{"ts": t} for t in (50, 10, 40, 30, 20, 60)]
    batches = drain(injectors.records(values, timestamp="ts", batch_size=2))
    assert [[ts for _, ts, _ in b.records] for b in batches] == [[50, 10], [40, 30], [20, 60], []]
    assert [b.watermark for b in batches] == [20, 20, END_OF_TIME, END_OF_TIME]
    for b, nxt in zip(batches, batches[1:]):
        assert all(ts >= b.watermark for _, ts, _ in nxt.records), "a later record is behind a published watermark"


def test_an_iterator_promises_only_max_delay_behind_the_newest_record() -> None:
    values = [{"ts": t} for t in (100, 90, 300, 250, 120)]
    batches = drain(injectors.records(lambda: iter(values), timestamp="ts", batch_size=2, max_delay_ms=60))
    assert [b.watermark for b in batches] == [40, 240, END_OF_TIME]


def test_resuming_from_a_checkpoint_skips_what_was_published() -> None:
    values = [{"ts": t} for t in range(10)]
    first = drain(injectors.records(values, timestamp="ts", batch_size=4))
    resumed = drain(injectors.records(values, timestamp="ts", batch_size=4), resume=first[0].checkpoint)
    assert [ts for b in resumed for _, ts, _ in b.records] == list(range(4, 10))


def test_generator_is_a_function_of_the_index_and_bounded_by_count() -> None:
    gen = injectors.generator(lambda i: {"n": i, "ts": 1000 + i}, count=5, timestamp="ts", batch_size=2)
    batches = drain(gen)
    assert [v["n"] for b in batches for v, _, _ in b.records] == [0, 1, 2, 3, 4]
    assert batches[-1].watermark == END_OF_TIME
    again = drain(injectors.generator(lambda i: {"n": i, "ts": 1000 + i}, count=5, timestamp="ts", batch_size=2),
                  resume=batches[0].checkpoint)
    assert [v["n"] for b in again for v, _, _ in b.records] == [2, 3, 4]


def test_without_a_timestamp_a_record_gets_the_clock_reading_when_it_is_injected() -> None:
    now = 5_000  # read by the clocks below when called: moved on after each batch

    def at_now() -> int:
        return now

    for injector in (injectors.records(["a", "b", "c"], batch_size=2, clock=at_now),
                     injectors.generator(lambda i: i, count=3, batch_size=2, clock=at_now)):
        now = 5_000
        stamps: list[list[int]] = []
        for batch in injector.batches(None):
            stamps.append([ts for _, ts, _ in batch.records])
            now += 1_000
        assert stamps == [[5_000, 5_000], [6_000]]


def test_a_record_without_its_timestamp_field_is_refused_with_the_record_named() -> None:
    with pytest.raises(OptionError, match=re.escape(
            "Injected record has no timestamp field 'ts' (got {'when': 5}). "
            "Hint: fix the record, or pass timestamp=<field name or function>")):
        drain(injectors.records([{"when": 5}], timestamp="ts"))


def test_bad_batch_size_and_format_are_refused() -> None:
    with pytest.raises(OptionError, match=re.escape(
            "An injector's batch_size must be at least 1 (got 0). Hint: e.g. batch_size=1000")):
        injectors.records([], batch_size=0)
    with pytest.raises(OptionError, match=re.escape(
            "Unknown file format (got 'xml'). Hint: use format='jsonl', 'csv' or 'text'")):
        injectors.files("/tmp", format="xml")


def test_files_watermark_is_the_oldest_creation_time_among_unfinished_files(tmp_path: Path) -> None:
    stamps = {"a.jsonl": 1_000, "b.jsonl": 2_000, "c.jsonl": 3_000}
    for name, mtime in stamps.items():
        (tmp_path / name).write_text("\n".join(json.dumps({"file": name, "ts": mtime + i}) for i in range(3)))
        os.utime(tmp_path / name, (mtime, mtime))
    batches = drain(injectors.files(str(tmp_path), timestamp="ts", bounded=True, clock=clock))
    assert [b.records[0][0]["file"] for b in batches[:3]] == ["a.jsonl", "b.jsonl", "c.jsonl"]
    # after a.jsonl, b.jsonl (created at 2,000 s) is the oldest unfinished file
    assert batches[0].watermark == 2_000_000 and batches[1].watermark == 3_000_000
    assert batches[2].watermark == NOW  # none left: the clock
    assert batches[-1].watermark == END_OF_TIME and batches[-1].records == []
    assert batches[0].records[1][2] == "a.jsonl:1"  # ids are stable: file and line
    resumed = drain(injectors.files(str(tmp_path), timestamp="ts", bounded=True, clock=clock),
                    resume=batches[1].checkpoint)
    assert [b.records[0][0]["file"] for b in resumed if b.records] == ["c.jsonl"]


def test_csv_and_text_files(tmp_path: Path) -> None:
    (tmp_path / "x.csv").write_text("q,ts\ncats,5\ndogs,7\n")
    (tmp_path / "y.txt").write_text("cats\n\ndogs\n")
    csv_batches = drain(injectors.files(str(tmp_path), format="csv", timestamp=lambda v: int(v["ts"]), bounded=True,
                                        pattern="*.csv", clock=clock))
    assert [(v["q"], ts) for v, ts, _ in csv_batches[0].records] == [("cats", 5), ("dogs", 7)]
    assert csv_batches[0].watermark == NOW  # no file left: the clock
    text_batches = drain(injectors.files(str(tmp_path), format="text", bounded=True, pattern="*.txt", clock=clock))
    assert text_batches[0].records == [("cats", NOW, "y.txt:0"), ("dogs", NOW, "y.txt:1")]  # no timestamp: the clock


def test_a_stream_is_replayable_from_a_batch_or_a_time_and_trimmed_by_retention(tmp_path: Path) -> None:
    from headrace import read
    from headrace.engine import Production
    from headrace.store import open_store

    url = f"sqlite:///{tmp_path}/bus.db"
    now = {"ms": 0}
    store = open_store(url, clock=lambda: now["ms"])  # the store's clock, set for each batch
    for batch in (1, 2, 3):
        now["ms"] = batch * 1_000
        store.publish("inject:s", batch, {"s": [Production("s", None, {"b": batch}, batch, f"id{batch}")]}, batch)
    assert [b.completed_at for b in store.batches("inject:s")] == [1_000, 2_000, 3_000]
    assert [r.value["b"] for r in read("s", url)] == [1, 2, 3]
    assert [r.value["b"] for r in read("s", url, from_batch=1)] == [2, 3]
    assert [r.value["b"] for r in read("s", url, since_ms=2_000)] == [2, 3]  # completed at or after
    assert [r.value["b"] for r in read("s", url, since_ms=2_001)] == [3]
    records = read("s", url, limit=2)
    assert not isinstance(records, list) and [r.value["b"] for r in records] == [1, 2]  # an iterator, cut at limit
    assert next(read("s", url, from_batch=2)).value == {"b": 3}
    assert store.trim_segments(2_001) == 2
    assert [r.value["b"] for r in read("s", url)] == [3]


def test_a_missing_files_directory_is_an_error_not_an_empty_stream(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-dir")
    with pytest.raises(OptionError, match=r"files\(\) reads a directory that does not exist \(got '.*no-such-dir'\)\. "
                                          r"Hint: create it first, or fix the path"):
        next(iter(injectors.files(missing, bounded=True).batches(None)))
