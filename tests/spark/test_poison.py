"""Poison records on Spark (issue 23): a JSON-lines file with a lone-surrogate key and a malformed
line, user code that produces what no store can hold or never returns; under
on_error="dead_letter" each goes to a dead-letter stream naming where it came from, and the run
completes with every other record counted, in both modes."""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from headrace import Computation, Topology, injectors, key_by, read, run

GOOD = [{"user": f"u{i % 3}", "n": i, "ts": 1_000 + i} for i in range(20)]


class Poisoned(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        n = record.value["n"]
        if n == 5:
            while True:  # never returns: the watchdog stops it
                pass
        ctx.state = (ctx.state or 0) + 1
        if n == 6:
            ctx.produce("counts", threading.Lock())
        if n == 7:
            ctx.produce("counts", {"n": n}, timestamp=2 ** 70)
        ctx.set_timer("end", 10_000)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.produce("counts", {"user": ctx.key, "n": ctx.state})


def test_poison_records_and_a_runaway_record_are_dead_lettered_and_the_run_completes(
        spark: Any, store_url: str, mode: str, tmp_path: Path) -> None:
    folder = tmp_path / "in"
    (folder / "a").mkdir(parents=True)
    lines = [json.dumps(e) for e in GOOD[:10]] + ['{"user": "x\\udc80", "n": 100, "ts": 1050}', "{oops"]
    (folder / "a" / "1.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "b").mkdir()
    (folder / "b" / "1.jsonl").write_text("\n".join(json.dumps(e) for e in GOOD[10:]) + "\n")
    t = Topology("poison")
    t.inject("events", injectors.files(str(folder), timestamp="ts", pattern="*/*.jsonl", bounded=True))
    t.add(Poisoned, name="Counter", inputs={"events": key_by("user")}, outputs=["counts"], on_error="dead_letter",
          process_timeout_s=2)
    run(t, store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode)
    letters = {r.value["record_id"]: r.value["error"] for r in read("Counter.dead_letter", store_url)}
    assert letters["a/1.jsonl:5"].startswith("ProcessTimeoutError: process_record ran longer than process_timeout_s=2")
    assert letters["a/1.jsonl:6"].startswith("OptionError: A value produced to 'counts' cannot be pickled")
    assert letters["a/1.jsonl:7"].startswith("OptionError: A production timestamp must fit in 64 bits")
    assert "returned text UTF-8 cannot hold" in letters["a/1.jsonl:10"]
    assert len(letters) == 4
    [bad_line] = [r.value for r in read("events.dead_letter", store_url)]
    assert (bad_line["file"], bad_line["line"], bad_line["text"]) == ("a/1.jsonl", 12, b"{oops")
    survivors = [e for e in GOOD if e["n"] not in (5, 6, 7)]
    assert {r.value["user"]: r.value["n"] for r in read("counts", store_url)} == dict(Counter(e["user"] for e in survivors))
