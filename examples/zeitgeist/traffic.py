"""Synthetic search traffic for the Zeitgeist demo, with the anomalies it contains as ground truth.

Time is compressed: a simulated "day" lasts ``day_ms`` of event time, so a short demo covers
several daily cycles. Query popularity is Zipf-like; arrival is out of order by up to
``disorder_ms``; a small share of records arrive far later than that (late on purpose); spikes
and dips are injected at recorded times on recorded queries.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

START = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@dataclass(frozen=True)
class Anomaly:
    kind: str  # "spike" or "dip"
    query: str
    start: int  # first affected one-second bucket (ms)
    end: int  # end of the last affected bucket (ms, exclusive)


@dataclass
class Scenario:
    queries: int = 200
    rate_per_s: float = 500.0  # mean searches per second of event time, over all queries
    days: int = 3
    day_ms: int = 60_000
    disorder_ms: int = 2_000
    late_share: float = 0.002
    late_by_ms: int = 15_000
    spikes: int = 6
    dips: int = 6
    anomaly_ms: int = 6_000
    seed: int = 2026
    events: list[dict[str, Any]] = field(default_factory=list, repr=False)
    truth: list[Anomaly] = field(default_factory=list, repr=False)
    late_records: int = 0

    @property
    def duration_ms(self) -> int:
        return self.days * self.day_ms


def _poisson(rng: random.Random, lam: float) -> int:
    if lam > 30:
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def generate(scenario: Scenario) -> Scenario:
    """Fill ``scenario.events`` (in arrival order) and ``scenario.truth``."""
    rng = random.Random(scenario.seed)
    names = [f"query-{i:03d}" for i in range(scenario.queries)]
    harmonic = sum(1 / (i + 1) for i in range(scenario.queries))
    base = [scenario.rate_per_s / harmonic / (i + 1) for i in range(scenario.queries)]

    warmup = scenario.day_ms // 2
    slots = list(range(warmup, scenario.duration_ms - scenario.anomaly_ms - 5_000, scenario.anomaly_ms + 4_000))
    rng.shuffle(slots)
    truth: list[Anomaly] = []
    for kind, count, pool in (("spike", scenario.spikes, range(10, 30)), ("dip", scenario.dips, range(0, 6))):
        for _ in range(count):
            start = START + slots.pop()
            truth.append(Anomaly(kind, names[rng.choice(list(pool))], start, start + scenario.anomaly_ms))
    effects = {(a.query, sec): a.kind for a in truth for sec in range(a.start, a.end, 1000)}

    timed: list[tuple[int, dict[str, Any]]] = []
    late = 0
    for second in range(scenario.duration_ms // 1000):
        bucket = START + second * 1000
        cycle = 1 + 0.5 * math.sin(2 * math.pi * (second * 1000) / scenario.day_ms)
        for q, name in enumerate(names):
            lam = base[q] * cycle
            effect = effects.get((name, bucket))
            if effect == "spike":
                lam = lam * 6 + 15
            elif effect == "dip":
                lam = 0.0
            for _ in range(_poisson(rng, lam)):
                ts = bucket + rng.randrange(1000)
                arrival = ts + rng.randrange(scenario.disorder_ms)
                if rng.random() < scenario.late_share:
                    arrival += scenario.late_by_ms
                    late += 1
                timed.append((arrival, {"query": name, "ts": ts}))
    timed.sort(key=lambda item: item[0])
    scenario.events = [event for _, event in timed]
    scenario.truth = sorted(truth, key=lambda a: a.start)
    scenario.late_records = late
    return scenario
