"""Continuous mode's key intervals in the store (docs/architecture.md §4.2): leases, claims and the
watermark authority's read.

Every operation here takes all the intervals it concerns in one statement or one transaction, so
its cost is one round trip plus an index seek per interval: a worker owning 100,000 intervals
claims and renews them in seconds, and the authority reads them all in one query
(bench/authority_scale.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from ..engine.ports import IntervalClaim
from ..errors import StoreError
from ..model import BEGINNING_OF_TIME, END_OF_TIME
from .rescale import fences_of

__all__ = ["IntervalQueries"]


class IntervalQueries:
    """Mixed into ``SQLStore``; uses its query helpers, transactions and sequencer."""

    FOR_UPDATE: str
    shown_url: str

    if TYPE_CHECKING:
        def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...
        def _one(self, sql: str, params: Sequence[Any] = ()) -> Any: ...
        def _x(self, sql: str, params: Sequence[Any] = ()) -> Any: ...
        def _xmany(self, sql: str, rows: list[tuple]) -> None: ...
        def _in_list(self, column: str, values: list[Any]) -> tuple[str, Any]: ...
        def _values(self, column: str, values: list[str]) -> tuple[str, Any]: ...
        def _transaction(self, begin: str | None = None) -> Any: ...
        def _next_sequencer(self, computation: str) -> int: ...

    def claim_intervals(self, computation: str, shards: list[int], owner: str, now: int,
                        lease_until: int) -> dict[int, IntervalClaim]:
        """Take those of ``shards`` that nobody else holds a live lease on, under one new
        sequencer that fences every earlier owner of each. Returns where each taken interval's
        committed state stands; the others are left out."""
        count_row = self._one("SELECT shards FROM computations WHERE name = ?", (computation,))
        if count_row is None:
            return {}
        # a worker of an older, larger layout asks for more: the claims it gets carry the count it checks
        shards = [s for s in shards if s < int(count_row[0])]
        if not shards:
            return {}
        condition, param = self._in_list("shard", sorted(set(shards)))
        free = "(owner IS NULL OR owner = ? OR lease_until < ?)"
        if self._one(f"SELECT 1 FROM shards WHERE computation = ? AND {condition} AND {free} LIMIT 1",
                     (computation, param, owner, now)) is None:
            return {}  # all held by live leases: no write at all (claims are retried every quarter lease)
        with self._transaction():
            sequencer = self._next_sequencer(computation)  # first: every writer locks the computation, then shards
            # in shard order, as commits take them, so that PostgreSQL's row locks cannot deadlock
            rows = self._all(f"SELECT shard, owner, lease_until, version, input_watermark FROM shards "
                             f"WHERE computation = ? AND {condition} ORDER BY shard{self.FOR_UPDATE}",
                             (computation, param))
            missing = sorted(set(shards) - {int(r[0]) for r in rows})
            if missing:
                raise StoreError(f"Shard {missing[0]} of {computation!r} does not exist in {self.shown_url}",
                                 got=missing[0], hint="register the computation with enough shards first")
            taken = {int(s): (int(v), int(w)) for s, o, u, v, w in rows if o is None or o == owner or u < now}
            if not taken:
                return {}
            positions: dict[int, dict[str, int]] = {s: {} for s in taken}
            condition, param = self._in_list("shard", sorted(taken))
            self._x(f"UPDATE shards SET sequencer = ?, owner = ?, lease_until = ? WHERE computation = ? "
                    f"AND {condition}", (sequencer, owner, lease_until, computation, param))
            for s, p, b in self._all(f"SELECT shard, producer, batch FROM positions WHERE computation = ? "
                                     f"AND {condition}", (computation, param)):
                positions[int(s)][str(p)] = int(b)
            # read again under the computation's lock, which a rescaling takes too
            count = int(self._one("SELECT shards FROM computations WHERE name = ?", (computation,))[0])
            fences = fences_of(self, computation)
        return {s: IntervalClaim(sequencer, v, w, positions[s], count, fences) for s, (v, w) in taken.items()}

    def renew_intervals(self, computation: str, sequencers: dict[int, int], owner: str,
                        lease_until: int) -> set[int]:
        """Extend the leases still held under these sequencers; returns the intervals kept."""
        kept: set[int] = set()
        with self._transaction():
            for sequencer, condition, param in self._by_sequencer(sequencers):
                kept.update(int(r[0]) for r in self._all(
                    f"UPDATE shards SET lease_until = ? WHERE computation = ? AND sequencer = ? AND owner = ? "
                    f"AND {condition} RETURNING shard", (lease_until, computation, sequencer, owner, param)))
        return kept

    def release_intervals(self, computation: str, sequencers: dict[int, int]) -> None:
        """Free the intervals still held under these sequencers (a worker on its way out)."""
        with self._transaction():
            for sequencer, condition, param in self._by_sequencer(sequencers):
                self._x(f"UPDATE shards SET owner = NULL, lease_until = 0 WHERE computation = ? AND sequencer = ? "
                        f"AND {condition}", (computation, sequencer, param))

    def _by_sequencer(self, sequencers: dict[int, int]) -> list[tuple[int, str, Any]]:
        """Shards grouped by the sequencer they were claimed under, each group as an IN-list
        condition: one statement per claim round rather than one per interval."""
        groups: dict[int, list[int]] = {}
        for shard, sequencer in sequencers.items():
            groups.setdefault(sequencer, []).append(shard)
        return [(sequencer, *self._in_list("shard", sorted(shards))) for sequencer, shards in sorted(groups.items())]

    def start_interval_at(self, computation: str, shard: int, positions: dict[str, int]) -> None:
        """Where a new interval starts reading (``start="now"`` or a time); refused once it committed."""
        with self._transaction():
            row = self._one("SELECT version FROM shards WHERE computation = ? AND shard = ?", (computation, shard))
            if row is None or row[0] != 0:
                return
            self._xmany("INSERT INTO positions VALUES (?, ?, ?, ?) ON CONFLICT(computation, shard, producer) "
                        "DO UPDATE SET batch = excluded.batch",
                        [(computation, shard, p, b) for p, b in sorted(positions.items())])

    def interval_owners(self, computation: str) -> dict[int, tuple[str | None, int, int]]:
        """Per interval: (owner, lease_until, sequencer)."""
        return {int(s): (o, int(u), int(q)) for s, o, u, q in self._all(
            "SELECT shard, owner, lease_until, sequencer FROM shards WHERE computation = ? ORDER BY shard",
            (computation,))}

    def low_watermarks(self, producers: list[str]) -> tuple[int, int]:
        """The minimum over ``producers`` of the input and output watermarks each journaled with
        its latest batch, in one query; a producer that journaled nothing holds both at the
        beginning of time, and no producers hold nothing back (the end of time)."""
        wanted = sorted(set(producers))
        if not wanted:
            return END_OF_TIME, END_OF_TIME
        values, param = self._values("p", wanted)
        found, inp, out = self._one(
            f"SELECT COUNT(*), MIN(b.input_watermark), MIN(b.output_watermark) FROM {values} "
            "JOIN batches b ON b.producer = p AND b.batch = (SELECT MAX(batch) FROM batches WHERE producer = p)",
            (param,))
        if int(found) < len(wanted):
            return BEGINNING_OF_TIME, BEGINNING_OF_TIME
        return int(inp), int(out)
