"""Synthetic events for the trending example (Facebook paper, section 3, Figure 3).

Each event mentions a dimension id (a page, a hashtag); the dimension table maps it to a topic
and a language. Some events are of types or languages the application filters out. Arrival is
out of order by up to ``disorder_ms``.
"""

from __future__ import annotations

import random
from typing import Any

START = 1_767_225_600_000  # 2026-01-01T00:00:00Z
TOPICS = ["sports", "music", "politics", "science"]

# dimension id -> (topic, language): the table the Joiner looks up
DIMENSIONS: dict[str, tuple[str, str]] = {
    f"dim-{i}": (TOPICS[i % len(TOPICS)], "en" if i % 5 else "fr") for i in range(20)
}


def generate(n: int = 6_000, minutes: int = 30, events: int = 40, disorder_ms: int = 20_000,
             seed: int = 3) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    span = minutes * 60_000
    weights = [1 / (i + 1) ** 0.8 for i in range(events)]
    hot = {f"event-{rng.randrange(events)}": (rng.randrange(span), rng.randrange(span)) for _ in range(5)}
    out: list[dict[str, Any]] = []
    for i in range(n):
        event = f"event-{rng.choices(range(events), weights)[0]}"
        ts = START + rng.randrange(span)
        if event in hot and rng.random() < 0.3:  # bursts make some events trend in some windows
            lo, hi = sorted(hot[event])
            ts = START + lo + rng.randrange(max(1, min(hi - lo, 300_000)))
        out.append({
            "id": f"e{i}",
            "event": event,
            "dim": f"dim-{(int(event.split('-')[1]) * 7 + rng.randrange(3)) % len(DIMENSIONS)}",
            "type": rng.choices(["post", "share", "like", "spam"], [5, 3, 2, 1])[0],
            "ts": ts,
        })
    out.sort(key=lambda e: e["ts"] + rng.randrange(disorder_ms))
    return out
