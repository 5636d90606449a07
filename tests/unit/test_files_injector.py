"""The files injector (issue 23): it tails files, keys them by path, sends a malformed line to the
dead-letter stream naming file and line, and stays exactly-once across restarts. Each test failed
on the old injector (it read a file once, by basename, and stopped at a bad line)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from headrace import injectors, read
from headrace.engine.publish import publish_injected
from headrace.engine.routing import EMPTY_PLAN
from headrace.model import END_OF_TIME
from headrace.names import dead_letter_stream, injector
from headrace.store import open_store

NOW = 1_700_000_000_000
PRODUCER = injector("s")


def clock() -> int:
    return NOW


def line(n: int, tag: str = "") -> str:
    return json.dumps({"n": n, "tag": tag, "ts": 1_000 + n}) + "\n"


def run(url: str, folder: Path, *, idle_passes: int = 1, crash_after: int | None = None, bounded: bool = False) -> None:
    """One life of the injector, as ``spark/injectors.InjectorThread`` runs it: resume from the
    store's checkpoint, publish each batch with its checkpoint; stop after ``idle_passes`` empty
    polls, or die (``crash_after`` batches published, the next one taken and never published)."""
    store = open_store(url)
    last = store.latest_batch(PRODUCER)
    batch = last.batch if last else 0
    published = idle = 0
    inj = injectors.files(str(folder), timestamp="ts", pattern="*/*.jsonl", poll_s=0, clock=clock, bounded=bounded)
    for got in inj.batches(store.checkpoint(PRODUCER)):
        if crash_after is not None and published == crash_after:
            break  # the process died with this batch in hand
        batch += 1
        publish_injected(store, PRODUCER, batch, "s", got.records, got.watermark, got.checkpoint, None, EMPTY_PLAN,
                         batch, got.dead_letters)
        published += 1
        if not got.records and not got.dead_letters:
            idle += 1
            if idle >= idle_passes or got.watermark == END_OF_TIME:
                break
    store.close()


def values(url: str) -> list[Any]:
    return sorted((r.value["tag"], r.value["n"]) for r in read("s", url))


def write(path: Path, text: str, mode: str = "a") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, mode) as f:
        f.write(text)


def test_appended_lines_are_injected_and_same_named_files_in_two_folders_both_are(tmp_path: Path) -> None:
    url, folder = f"sqlite:///{tmp_path}/bus.db", tmp_path / "in"
    write(folder / "a" / "1.jsonl", line(1, "a") + line(2, "a"))
    write(folder / "b" / "1.jsonl", line(1, "b"))
    run(url, folder)
    assert values(url) == [("a", 1), ("a", 2), ("b", 1)]  # the old injector dropped b/1.jsonl (same ids)
    write(folder / "a" / "1.jsonl", line(3, "a") + '{"n": 4, "tag": "a", "ts"')  # the last line is still being written
    run(url, folder)
    assert values(url) == [("a", 1), ("a", 2), ("a", 3), ("b", 1)]
    write(folder / "a" / "1.jsonl", ": 1004}\n")
    run(url, folder)
    assert values(url) == [("a", 1), ("a", 2), ("a", 3), ("a", 4), ("b", 1)]
    ids = sorted(r.id for r in read("s", url))
    assert ids == ["a/1.jsonl:0", "a/1.jsonl:1", "a/1.jsonl:2", "a/1.jsonl:3", "b/1.jsonl:0"]


def test_a_malformed_line_is_dead_lettered_naming_file_and_line_and_the_run_goes_on(tmp_path: Path) -> None:
    url, folder = f"sqlite:///{tmp_path}/bus.db", tmp_path / "in"
    write(folder / "a" / "x.jsonl", line(1, "a") + "{not json\n" + '{"n": 9}\n' + line(2, "a"))
    write(folder / "b" / "y.jsonl", "")
    with open(folder / "b" / "y.jsonl", "wb") as f:
        f.write(b'{"n": 1, "tag": "\xff", "ts": 5}\n' + line(3, "b").encode())
    run(url, folder, bounded=True)
    assert values(url) == [("a", 1), ("a", 2), ("b", 3)]
    dead = sorted(((r.value["file"], r.value["line"]), r.value["error"].split(":")[0]) for r in
                  read(dead_letter_stream("s"), url))
    assert dead == [(("a/x.jsonl", 2), "JSONDecodeError"), (("a/x.jsonl", 3), "OptionError"),
                    (("b/y.jsonl", 1), "UnicodeDecodeError")]
    [no_ts] = [r.value for r in read(dead_letter_stream("s"), url) if r.value["line"] == 3]
    assert no_ts["error"].startswith("OptionError: Injected record has no timestamp field 'ts'")
    assert no_ts["text"] == b'{"n": 9}'


def test_restarts_and_a_crash_between_batches_stay_exactly_once(tmp_path: Path) -> None:
    url, folder = f"sqlite:///{tmp_path}/bus.db", tmp_path / "in"
    write(folder / "a" / "1.jsonl", line(1, "a"))
    write(folder / "b" / "1.jsonl", line(1, "b"))
    run(url, folder, crash_after=1)  # published one file, died holding the other
    write(folder / "a" / "1.jsonl", line(2, "a"))
    run(url, folder, crash_after=0)  # died before publishing anything
    run(url, folder)
    assert values(url) == [("a", 1), ("a", 2), ("b", 1)]
    # b/1.jsonl replaced by a new file under the same name: read from its start, under new ids
    os.remove(folder / "b" / "1.jsonl")
    write(folder / "b" / "1.jsonl", line(7, "b2") + line(8, "b2"), mode="w")
    write(folder / "c" / "1.jsonl", line(1, "c"))
    run(url, folder, crash_after=1)
    run(url, folder)
    assert values(url) == [("a", 1), ("a", 2), ("b", 1), ("b2", 7), ("b2", 8), ("c", 1)]
    ids = [r.id for r in read("s", url)]
    assert len(ids) == len(set(ids)), "a replaced file reused an old file's record ids (dedup would drop them)"


def test_an_old_resume_point_of_basenames_resumes_without_reinjecting(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    write(folder / "a" / "1.jsonl", line(1, "a"))
    write(folder / "a" / "2.jsonl", line(2, "a"))
    inj = injectors.files(str(folder), timestamp="ts", pattern="*/*.jsonl", bounded=True, clock=clock)
    batches = list(inj.batches(json.dumps(["1.jsonl"])))  # the old format: basenames read whole
    assert [v["n"] for b in batches for v, _, _ in b.records] == [2]
    write(folder / "a" / "1.jsonl", line(3, "a"))
    again = list(inj.batches(batches[-1].checkpoint))
    assert [(v["n"], rid) for b in again for v, _, rid in b.records] == [(3, "a/1.jsonl:1")]


def test_a_file_larger_than_one_batch_is_read_in_several_and_every_line_once(tmp_path: Path) -> None:
    from headrace.injectors.tail import MAX_BATCH_BYTES

    folder = tmp_path / "in"
    lines = [line(n, "x" * 200) for n in range(MAX_BATCH_BYTES // 200 * 2)]
    write(folder / "a" / "big.jsonl", "".join(lines))
    inj = injectors.files(str(folder), timestamp="ts", pattern="*/*.jsonl", bounded=True, clock=clock)
    batches = [b for b in inj.batches(None) if b.records]
    assert len(batches) >= 2
    assert [v["n"] for b in batches for v, _, _ in b.records] == list(range(len(lines)))
