"""The monoid the tests' monoid computations build on: integers under addition."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from headrace import MonoidComputation
from headrace.engine.batch import InputRecord, Partial
from headrace.engine.monoid import Folder
from headrace.engine.shard import ValueCheck


class Adding(MonoidComputation):
    """Integers under addition; each record counts 1 unless ``lift`` says otherwise. Subclasses add
    ``emit`` (and ``window``, ``lift`` as they need)."""

    def zero(self) -> int:
        return 0

    def lift(self, record: Any) -> int:
        return 1

    def combine(self, a: int, b: int) -> int:
        return a + b


def preaggregate(monoid: MonoidComputation, name: str, records: Iterable[InputRecord], watermark_before: int,
                 streams: frozenset[str] | None = None,
                 schemas: Mapping[str, ValueCheck] | None = None) -> tuple[list[Partial], list[InputRecord]]:
    """Fold ``records`` of ``streams`` (every stream: None) into partials as one read would
    (``Folder.add_many``); returns them and the records that travel alone (other streams, late
    ones, and those ``Folder.add_many`` refused)."""
    folder = Folder(monoid, name, watermark_before)
    records = list(records)
    columns = ([r.key for r in records], [r.value for r in records], [r.timestamp for r in records],
               [r.id for r in records])
    by_stream: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        if streams is None or r.stream in streams:
            by_stream.setdefault(r.stream, []).append(i)
    folded: set[int] = set()
    for stream, rows in by_stream.items():
        folded.update(set(rows).difference(folder.add_many(*columns, rows, (schemas or {}).get(stream))))
    return folder.partials(), [r for i, r in enumerate(records) if i not in folded]
