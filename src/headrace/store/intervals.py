"""Continuous mode's key intervals in the store (docs/architecture.md §4.2): leases, claims and the
watermark authority's read.

Every operation here takes all the intervals it concerns in one statement or one transaction, so
its cost is one round trip plus an index seek per interval: a worker owning 100,000 intervals
claims and renews them in seconds, and the authority reads them all in one query
(bench/authority_scale.py).
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from ..engine.batch import QuietReport
from ..engine.ports import Head, IntervalClaim
from ..errors import StoreError
from ..model import BEGINNING_OF_TIME, END_OF_TIME
from ..names import interval, parse_producer
from .bus import BusQueries, head_of
from .rescale import Rescaling

__all__ = ["IntervalQueries"]


class IntervalQueries(Rescaling, BusQueries):
    """Claims, leases, quiet intervals and the watermarks consumers and the authority read."""

    def computation_modes(self, computations: list[str]) -> dict[str, str]:
        """The mode each of these registered computations runs in (absent: not registered)."""
        if not computations:
            return {}
        condition, param = self._in_list("name", sorted(set(computations)))
        return {str(n): str(m) for n, m in self._all(f"SELECT name, mode FROM computations WHERE {condition}",
                                                     (param,))}

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
            rows = self._all(f"SELECT shard, owner, lease_until, version, input_watermark, EXISTS (SELECT 1 FROM "
                             "timers t WHERE t.computation = shards.computation AND t.shard = shards.shard) "
                             f"FROM shards WHERE computation = ? AND {condition} ORDER BY shard{self.FOR_UPDATE}",
                             (computation, param))
            missing = sorted(set(shards) - {int(r[0]) for r in rows})
            if missing:
                raise StoreError(f"Shard {missing[0]} of {computation!r} does not exist in {self.shown_url}",
                                 got=missing[0], hint="register the computation with enough shards first")
            taken = {int(s): (int(v), int(w)) for s, o, u, v, w, _ in rows if o is None or o == owner or u < now}
            timed = {int(r[0]) for r in rows if r[5]}
            if not taken:
                return {}
            condition, param = self._in_list("shard", sorted(taken))
            # where each stands: its own commits, or further where its last owner reported it quiet
            quiet = self._quiet_marks(computation, condition, param)
            for s, (_, inp, _) in quiet.items():
                if s in taken:
                    taken[s] = (taken[s][0], max(taken[s][1], inp))
            positions = {s: dict(quiet[s][0]) if s in quiet else {} for s in taken}
            for s, p, b in self._all(f"SELECT shard, producer, batch FROM positions WHERE computation = ? "
                                     f"AND {condition}", (computation, param)):
                own = positions[int(s)]
                own[str(p)] = max(own.get(str(p), 0), int(b))
            self._x(f"UPDATE shards SET sequencer = ?, owner = ?, lease_until = ? WHERE computation = ? "
                    f"AND {condition}", (sequencer, owner, lease_until, computation, param))
            # read again under the computation's lock, which a rescaling takes too
            count = int(self._one("SELECT shards FROM computations WHERE name = ?", (computation,))[0])
            fences = self.fences_of(computation)
        return {s: IntervalClaim(sequencer, v, w, positions[s], count, fences, s in timed)
                for s, (v, w) in taken.items()}

    def renew_leases(self, owner: str, lease_until: int) -> dict[tuple[str, int], int]:
        """Extend every lease ``owner`` still holds, in one statement; returns each kept interval's
        sequencer by (computation, interval): one taken by another owner since is not among them."""
        return {(str(c), int(s)): int(q) for c, s, q in self._all(
            "UPDATE shards SET lease_until = ? WHERE owner = ? RETURNING computation, shard, sequencer",
            (lease_until, owner))}

    def claimable(self, computations: list[str], owner: str, now: int) -> dict[str, list[int]]:
        """Per computation, the intervals nobody holds a live lease on (free, released, lapsed), in
        one statement: an index range over the lapsed leases, however many intervals there are."""
        if not computations:
            return {}
        condition, param = self._in_list("computation", sorted(set(computations)))
        out: dict[str, list[int]] = {}
        for c, s in self._all(f"SELECT computation, shard FROM shards WHERE lease_until < ? AND {condition} "
                              "ORDER BY computation, shard", (now, param)):
            out.setdefault(str(c), []).append(int(s))
        return out

    def reassign(self, computation: str, shard: int, owner: str, lease_until: int) -> int:
        """Give interval ``shard`` to ``owner`` (live rebalancing, the driver's move) under a new
        sequencer, whoever holds it: its holder's next commit is refused and its next renewal drops
        it, and ``owner`` finds it among its renewed leases and takes it. Returns the sequencer."""
        with self._transaction():
            sequencer = self._next_sequencer(computation)
            self._x("UPDATE shards SET sequencer = ?, owner = ?, lease_until = ? WHERE computation = ? AND shard = ?",
                    (sequencer, owner, lease_until, computation, shard))
        return sequencer

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

    def _quiet_marks(self, computation: str, condition: str, param: Any) -> dict[int, tuple[dict[str, int], int, int]]:
        """Per interval (of those ``condition`` selects) whose current sequencer has a quiet report:
        (positions, input watermark, output watermark) reported."""
        return {int(s): ({str(p): int(b) for p, b in json.loads(text).items()}, int(i), int(o))
                for s, text, i, o in self._all(
                    f"SELECT s.shard, g.positions, g.input_watermark, g.output_watermark FROM shards s "
                    f"JOIN interval_groups g ON g.computation = s.computation AND g.sequencer = s.sequencer "
                    f"WHERE s.computation = ? AND s.{condition}", (computation, param))}

    def _quiet_outputs_query(self, wanted: Mapping[str, list[int]]) -> tuple[str, list[Any]] | None:
        """The output watermark a quiet report of its current sequencer gives each (computation,
        shard) of ``wanted``, where there is one, as rows ``('q', computation, shard, output
        watermark, NULL, NULL)``: one statement for every computation (None: nothing wanted)."""
        conditions, params = [], []
        for computation, shards in sorted(wanted.items()):
            condition, param = self._in_list("s.shard", sorted(set(shards)))
            conditions.append(f"(s.computation = ? AND {condition})")
            params += [computation, param]
        if not conditions:
            return None
        return ("SELECT 'q', s.computation, s.shard, g.output_watermark, NULL, NULL FROM shards s JOIN interval_groups g "
                f"ON g.computation = s.computation AND g.sequencer = s.sequencer WHERE {' OR '.join(conditions)}", params)

    def report_quiet(self, reports: Sequence[QuietReport]) -> None:
        """For each report: every interval of its computation held under its sequencer that
        committed nothing since has read its input up to its positions and found nothing of its
        own, and its watermarks stand at the report's. One statement for all of them, however many
        intervals and reports (docs/architecture.md §4.2, "Quiet intervals"). Monotonic: a report
        never moves a position or a watermark back. At most one report per computation and
        sequencer."""
        g = self.GREATEST
        self._xmany(f"INSERT INTO interval_groups VALUES (?, ?, ?, ?, ?) ON CONFLICT(computation, sequencer) DO UPDATE "
                    f"SET positions = excluded.positions, input_watermark = {g}(interval_groups.input_watermark, "
                    f"excluded.input_watermark), output_watermark = {g}(interval_groups.output_watermark, "
                    f"excluded.output_watermark)",
                    [(r.computation, r.sequencer, json.dumps(dict(sorted(r.positions.items()))), r.input_watermark,
                      r.output_watermark) for r in reports])

    def producer_heads(self, producers: list[str]) -> dict[str, Head]:
        """Each producer's last journaled batch, its routing plan and its output watermark: for a
        key interval, raised to its quiet report's when it committed nothing since (the report then
        speaks for the same batch; an interval quiet since it began is at batch 0). Absent: nothing
        journaled or reported yet.

        The reports and the journal are read in one statement, so from one snapshot: a producer
        commits its batches and its reports in one transaction, and a head never pairs a batch with
        a watermark reported after a later batch was journaled (its consumers would take the
        records of the batches in between for late). One round trip a pass, not two."""
        if not producers:
            return {}
        by_computation: dict[str, list[int]] = {}
        for p in producers:
            parsed = parse_producer(p)
            if parsed.kind == "interval":
                by_computation.setdefault(parsed.name, []).append(int(parsed.part))  # type: ignore[arg-type]
        sql, params = self._journal_heads_query(producers)
        quiet = self._quiet_outputs_query(by_computation)
        if quiet is not None:
            sql, params = f"{sql} UNION ALL {quiet[0]}", params + quiet[1]
        heads: dict[str, Head] = {}
        reported: dict[str, int] = {}
        for kind, name, batch, out, plan, since in self._all(sql, params):
            if kind == "j":
                heads[str(name)] = head_of(batch, out, plan, since)
            else:
                reported[interval(str(name), int(batch))] = int(out)
        for name, out in reported.items():
            head = heads.get(name, Head(0, out))
            heads[name] = head._replace(output_watermark=max(out, head.output_watermark))
        return heads

    def low_watermarks(self, computation: str) -> tuple[int, int]:
        """The minimum over the key intervals of ``computation`` of the input and output watermarks
        each journaled with its latest batch, or reported quiet since, in one query; an interval
        that did neither holds both at the beginning of time (the authority's read, §4.2)."""
        g = self.GREATEST
        latest = self._latest_batch("s.computation || '/' || CAST(s.shard AS TEXT)", "b", "LEFT JOIN")
        shards, missing, inp, out = self._one(
            f"SELECT COUNT(*), SUM(CASE WHEN b.batch IS NULL AND q.sequencer IS NULL THEN 1 ELSE 0 END), "
            f"MIN({g}(COALESCE(b.input_watermark, q.input_watermark), COALESCE(q.input_watermark, b.input_watermark))), "
            f"MIN({g}(COALESCE(b.output_watermark, q.output_watermark), "
            f"COALESCE(q.output_watermark, b.output_watermark))) "
            f"FROM shards s {latest} "
            "LEFT JOIN interval_groups q ON q.computation = s.computation "
            "AND q.sequencer = s.sequencer WHERE s.computation = ?", (computation,))
        if int(shards) == 0:
            return END_OF_TIME, END_OF_TIME
        if int(missing or 0) > 0:
            return BEGINNING_OF_TIME, BEGINNING_OF_TIME
        return int(inp), int(out)
