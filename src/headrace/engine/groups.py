"""A continuous worker's soft state of the intervals it owns, kept so that a pass costs what its
active intervals cost: intervals that have read their input up to the same positions form a
*group*, and a quiet interval (nothing of its own, no due timer) is touched only through its
group's positions and watermark. Valid for as long as the worker holds the leases (MillWheel §6.2).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator

from .ports import IntervalClaim

__all__ = ["OwnedInterval", "Group", "Groups"]


@dataclass
class OwnedInterval:
    """One interval this worker owns: its claim (sequencer, version, input watermark as of its last
    commit here) and the first batch it committed here (every later one follows this worker's plan)."""

    shard: int
    claim: IntervalClaim
    since: int | None = None

    @property
    def version(self) -> int:
        return self.claim.version


@dataclass
class Group:
    """Intervals that have read every producer up to ``positions``: their input watermark is at
    least ``watermark`` (the group's, moved once a pass), and at most ``top`` (the highest one an
    interval of it committed or was claimed with)."""

    positions: dict[str, int]
    watermark: int
    top: int
    shards: set[int] = field(default_factory=set)
    sequencers: Counter[int] = field(default_factory=Counter)  # its intervals' sequencers, how many each

    def before(self, owned: OwnedInterval) -> int:
        """An interval's input watermark: its own, or its group's when that moved further."""
        return max(owned.claim.input_watermark, self.watermark)


class Groups:
    """The intervals of one computation this worker owns, by group."""

    def __init__(self) -> None:
        self.owned: dict[int, OwnedInterval] = {}
        self._groups: list[Group] = []
        self._of: dict[int, Group] = {}

    def __len__(self) -> int:
        return len(self.owned)

    def __iter__(self) -> Iterator[Group]:
        return iter(list(self._groups))

    def add(self, owned: OwnedInterval, positions: dict[str, int]) -> None:
        self.discard(owned.shard)
        group = self._at(positions, owned.claim.input_watermark)
        group.shards.add(owned.shard)
        group.sequencers[owned.claim.sequencer] += 1
        group.top = max(group.top, owned.claim.input_watermark)
        self.owned[owned.shard] = owned
        self._of[owned.shard] = group

    def discard(self, shard: int) -> None:
        owned = self.owned.pop(shard, None)
        group = self._of.pop(shard, None)
        if group is not None and owned is not None:
            group.shards.discard(shard)
            group.sequencers[owned.claim.sequencer] -= 1
            group.sequencers += Counter()  # drops the sequencers no interval holds any more
            if not group.shards:
                self._groups.remove(group)

    def moved(self, group: Group, positions: dict[str, int], watermark: int) -> None:
        """After a pass: every interval of ``group`` has read up to ``positions`` (the quiet ones
        found nothing of their own), and its input watermark is at least ``watermark``."""
        group.positions = positions
        group.watermark = max(group.watermark, watermark)
        group.top = max(group.top, group.watermark)
        twin = next((g for g in self._groups if g is not group and g.positions == positions), None)
        if twin is not None:  # intervals claimed at other positions caught up: one group again
            twin.shards |= group.shards
            twin.sequencers += group.sequencers
            twin.watermark = min(twin.watermark, group.watermark)
            twin.top = max(twin.top, group.top)
            for shard in group.shards:
                self._of[shard] = twin
            self._groups.remove(group)

    def group_of(self, shard: int) -> Group:
        return self._of[shard]

    def _at(self, positions: dict[str, int], watermark: int) -> Group:
        found = next((g for g in self._groups if g.positions == positions), None)
        if found is None:
            found = Group(dict(positions), watermark, watermark)
            self._groups.append(found)
        return found
