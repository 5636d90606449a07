"""Live rebalancing's decisions (docs/architecture.md §4.2, "Rebalancing"), as pure functions of
the load the workers report: MillWheel's master moves intervals from a busy process to an idle
one, splits a hot interval and merges cold neighbours (§6). Here:

- a *move* hands one interval from the busiest worker to the idlest, when the busiest carries
  more than twice the idlest's load and the move makes the two closer;
- a *split* doubles a computation's intervals when one of them alone carries more than a worker's
  fair share (so no move can spread it) and more than one key (a single key cannot be split);
- a *merge* halves them, back towards the count the topology declared, when every interval of the
  computation has been cold.

A decision is made only when the same imbalance was seen in ``patience`` rounds in a row, so a
burst moves nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, NamedTuple

__all__ = ["IntervalLoad", "Move", "Rescale", "Balancer"]


class IntervalLoad(NamedTuple):
    """One interval's load in the last round: records per second, and whether more than one key
    made it (only then can a split spread it)."""

    rate: float
    keys: int


class Move(NamedTuple):
    computation: str
    shard: int
    source: str
    target: str


class Rescale(NamedTuple):
    computation: str
    old: int
    new: int


@dataclass
class Balancer:
    """Decides, once a round, from ``{owner: {(computation, shard): IntervalLoad}}``."""

    patience: int = 2  # rounds an imbalance must last before anything is done about it
    floor: float = 50.0  # records/s below which a worker's load is noise
    max_split: int = 64  # a computation is never split past this many intervals
    cold: float = 5.0  # records/s under which an interval is cold
    _streak: dict[str, int] = field(default_factory=dict)

    def decide(self, loads: Mapping[str, Mapping[tuple[str, int], IntervalLoad]], counts: Mapping[str, int],
               declared: Mapping[str, int]) -> list[Move | Rescale]:
        """What to do this round: at most one rescale (then nothing else), or the moves."""
        rescale = self._rescale(loads, counts, declared)
        if rescale is not None:
            return [rescale]
        moves: list[Move | Rescale] = [*self._moves(loads)]
        return moves

    def _persists(self, what: str, now: bool) -> bool:
        self._streak[what] = self._streak.get(what, 0) + 1 if now else 0
        if self._streak[what] >= self.patience:
            self._streak[what] = 0
            return True
        return False

    def _rescale(self, loads: Mapping[str, Mapping[tuple[str, int], IntervalLoad]], counts: Mapping[str, int],
                 declared: Mapping[str, int]) -> Rescale | None:
        workers = len(loads)
        per_interval: dict[tuple[str, int], IntervalLoad] = {k: v for held in loads.values() for k, v in held.items()}
        total = sum(load.rate for load in per_interval.values())
        for computation, count in sorted(counts.items()):
            mine = {s: per_interval.get((computation, s), IntervalLoad(0.0, 0)) for s in range(count)}
            hottest = max(mine.values(), key=lambda load: load.rate, default=IntervalLoad(0.0, 0))
            hot = (workers > 1 and total > self.floor and hottest.keys > 1 and hottest.rate > 1.5 * total / workers
                   and count * 2 <= self.max_split)
            if self._persists(f"split:{computation}", hot):
                return Rescale(computation, count, count * 2)
            cold = count > declared.get(computation, count) and all(load.rate < self.cold for load in mine.values())
            if self._persists(f"merge:{computation}", cold):
                return Rescale(computation, count, max(declared.get(computation, 1), count // 2))
        return None

    def _moves(self, loads: Mapping[str, Mapping[tuple[str, int], IntervalLoad]]) -> list[Move]:
        work = {owner: {k: v.rate for k, v in held.items()} for owner, held in loads.items()}

        def load(owner: str) -> float:
            return sum(work[owner].values())

        if len(work) < 2:
            self._persists("moves", False)
            return []
        busiest, idlest = max(work, key=load), min(work, key=load)
        uneven = load(busiest) > self.floor and load(busiest) > 2 * load(idlest)
        if not self._persists("moves", uneven):
            return []
        moves: list[Move] = []
        for _ in range(len(work[busiest])):
            busiest, idlest = max(work, key=load), min(work, key=load)
            gap = load(busiest) - load(idlest)
            if load(busiest) <= self.floor or load(busiest) <= 2 * load(idlest):
                break
            # the interval whose move brings the two closest: its rate nearest half the gap, and below the gap
            candidates = [(abs(rate - gap / 2), key) for key, rate in work[busiest].items() if 0 < rate < gap]
            if not candidates:
                break
            _, key = min(candidates)
            work[idlest][key] = work[busiest].pop(key)
            moves.append(Move(key[0], key[1], busiest, idlest))
        return moves
