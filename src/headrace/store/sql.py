"""The store's logic in SQL that SQLite and PostgreSQL both speak, put together from its parts
(``bus.py``, ``shards.py``, ``intervals.py``, ``rescale.py``, ``monitoring.py``, all written
against ``connection.Connection``); each dialect supplies its connection, its schema and the few
phrases that differ. Here: registration and writers, ``meta`` rows, and reading back."""

from __future__ import annotations

import uuid
from typing import Callable

from ..engine.batch import DueTimer
from ..errors import StoreError
from ..model import BEGINNING_OF_TIME
from ..names import MICROBATCH, meta
from .monitoring import MonitorQueries
from .retention import RetentionQueries
from .shards import WEAK_SLOT, ShardQueries
from .versions import Versioned

__all__ = ["SQLStore"]


class SQLStore(ShardQueries, MonitorQueries, RetentionQueries, Versioned):
    """Everything but the dialect. Subclasses set the class attributes and implement the hooks."""

    # -- writers --------------------------------------------------------------------------------
    def register(self, computation: str, shards: int, mode: str = MICROBATCH) -> None:
        """Create ``computation`` with ``shards`` key shards, run in ``mode`` (the mode it was first
        registered in is the one it keeps), or, if it has another count, re-partition its keys to
        ``shards`` in this one transaction (``store/rescale.py``)."""
        if type(shards) is not int or shards < 1 or shards >= WEAK_SLOT:
            raise StoreError(f"Computation {computation!r} needs a whole number of shards from 1 to {WEAK_SLOT - 1}",
                             got=shards, hint="pass shards=N with N >= 1, e.g. shards=4")
        with self._transaction():
            self._x("INSERT INTO computations(name, shards, mode) VALUES (?, ?, ?) ON CONFLICT(name) DO NOTHING",
                    (computation, shards, mode))
            row = self._one(f"SELECT shards, mode FROM computations WHERE name = ?{self.FOR_UPDATE}", (computation,))
            if row[0] != shards:
                self.rescale(computation, int(row[0]), shards, str(row[1]))
                return
            self._xmany("INSERT INTO shards(computation, shard, version, input_watermark, output_watermark) "
                        "VALUES (?, ?, 0, ?, ?) ON CONFLICT(computation, shard) DO NOTHING",
                        [(computation, s, BEGINNING_OF_TIME, BEGINNING_OF_TIME) for s in range(shards)])

    def acquire_writer(self, computation: str) -> int:
        """Become the one writer of ``computation`` and of all its shards: every older writer's
        commits are refused from now on."""
        with self._transaction():
            sequencer = self._next_sequencer(computation)
            self._x("UPDATE shards SET sequencer = ?, owner = NULL, lease_until = 0 WHERE computation = ?",
                    (sequencer, computation))
        return sequencer

    def sequencer(self, computation: str) -> int:
        row = self._one("SELECT sequencer FROM computations WHERE name = ?", (computation,))
        return int(row[0]) if row else 0

    def acquire_sink_writer(self, sink: str) -> int:
        """Become the one writer of ``sink`` (a Delta or Iceberg sink): a new value of its
        sequencer, kept in ``meta``; an older writer's ``sink_writer`` check fails from now on."""
        with self._transaction():
            row = self._one("INSERT INTO meta VALUES (?, '1') ON CONFLICT(name) DO UPDATE "
                            "SET value = CAST(CAST(meta.value AS BIGINT) + 1 AS TEXT) RETURNING value",
                            (meta.sink_writer(sink),))
        return int(row[0])

    def sink_writer(self, sink: str) -> int:
        """The sequencer of the current writer of ``sink`` (0 before the first)."""
        value = self._get_meta(meta.sink_writer(sink))
        return int(value) if value is not None else 0

    def put_meta(self, name: str, value: str) -> None:
        self._put_meta(name, value)

    def get_meta(self, name: str) -> str | None:
        return self._get_meta(name)

    def delete_meta(self, *prefixes: str) -> int:
        """Remove the ``meta`` rows whose names start with any of ``prefixes``; how many went."""
        return sum(int(self._x("DELETE FROM meta WHERE name LIKE ? ESCAPE '\\'", (_like(p),)).rowcount)
                   for p in prefixes)

    def metas(self, prefix: str) -> dict[str, str]:
        return {str(n): str(v) for n, v in self._all("SELECT name, value FROM meta WHERE name LIKE ? ESCAPE '\\' "
                                                     "ORDER BY name", (_like(prefix),))}

    def metas_of(self, names: list[str]) -> dict[str, str]:
        """These ``meta`` rows (absent: no such row), in one statement."""
        condition, param = self._in_list("name", sorted(set(names)))
        return {str(n): str(v) for n, v in self._all(f"SELECT name, value FROM meta WHERE {condition}", (param,))}

    def instance_id(self) -> str:
        """A random id this store's database got when it was created: Spark checkpoints carry it, so
        checkpoints are never resumed against another (or a re-created) database."""
        with self._transaction():
            self._x("INSERT INTO meta VALUES ('instance', ?) ON CONFLICT(name) DO NOTHING", (uuid.uuid4().hex,))
            return str(self._one("SELECT value FROM meta WHERE name = 'instance'")[0])

    def recode_state(self, computation: str, recode: Callable[[bytes], bytes]) -> int:
        """Rewrite every state value of ``computation`` as ``recode`` says, in one transaction; how many."""
        with self._transaction():
            rows = self._all("SELECT key, value FROM state WHERE computation = ?", (computation,))
            self._xmany("UPDATE state SET value = ? WHERE computation = ? AND key = ?",
                        [(recode(bytes(value)), computation, key) for key, value in rows])
        return len(rows)

    # -- reading back -------------------------------------------------------------------------------
    def state(self, computation: str, key: str) -> bytes | None:
        row = self._one("SELECT value FROM state WHERE computation = ? AND key = ?", (computation, key))
        return row[0] if row else None

    def timers(self, computation: str, key: str) -> list[DueTimer]:
        return [DueTimer(*r) for r in self._all(
            "SELECT key, tag, domain, timestamp FROM timers WHERE computation = ? AND key = ? ORDER BY timestamp, tag",
            (computation, key))]

    def counters(self, computation: str) -> dict[str, int]:
        return {k: int(v) for k, v in self._all("SELECT name, value FROM counters WHERE computation = ?", (computation,))}

    def shard_versions(self, computation: str) -> dict[int, int]:
        return {s: int(v) for s, v in self._all("SELECT shard, version FROM shards WHERE computation = ?", (computation,))}


def _like(prefix: str) -> str:
    """A LIKE pattern (escape character ``\\``) for the names that start with ``prefix``."""
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
