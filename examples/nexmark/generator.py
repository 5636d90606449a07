"""The Nexmark event generator: persons, auctions and bids, deterministic from a seed.

It follows the published event model of the Nexmark benchmark as Apache Flink's and Beam's
implementations generate it (github.com/nexmark/nexmark, ``nexmark-flink/.../generator``):
- one event in 50 is a person, 3 are auctions and 46 are bids, by event id (``id % 50``);
- a person's id is the number of persons before it plus 1000, an auction's likewise;
- an auction's seller is, 3 times in 4, the first of the last 100 persons (a hot seller), else one
  of the last 1000 persons or up to 10 not yet created; its category one of 5 from 10; its
  initial bid and reserve prices ``round(10 ** (6 u) * 100)``; it expires after a random time of
  twice, on average, the time for 100 more auctions to be created;
- a bid's auction is, 1 time in 2, the first of the last 100 auctions (a hot auction), else one of
  the last 100 or up to 10 not yet created; its bidder is, 3 times in 4, the second of the last 100
  persons, else one of the last 1000 persons or up to 10 ahead; its price as above;
- event ``n`` happens at ``base_time + n // 10`` ms (10,000 events per second of event time, or
  ``rate``, Nexmark's ``firstEventRate``); with
  ``out_of_order=G`` each group of G consecutive events is permuted (``n -> base + 953 n % G``),
  as Nexmark's ``outOfOrderGroupSize`` does, and the watermark is the group's first timestamp;
- records carry an ``extra`` string so that persons, auctions and bids average 200, 500 and 100
  bytes.
Random draws come from a SplitMix64 stream seeded by (seed, event number), so any event can be
made on its own (an injector that restarts regenerates exactly what it lost); strings are slices,
of the model's lengths, of one seeded pool of letters and spaces.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Iterator

__all__ = ["SCHEMAS", "KINDS", "Event", "event", "events", "source", "count_by_kind", "BASE_TIME"]

BASE_TIME = 1_700_000_000_000
PERSON, AUCTION, BID = 1, 3, 46
TOTAL = PERSON + AUCTION + BID
FIRST_ID, FIRST_CATEGORY = 1000, 10
ACTIVE_PEOPLE, IN_FLIGHT_AUCTIONS, ID_LEAD, HOT = 1000, 100, 10, 100
HOT_AUCTIONS, HOT_SELLERS, HOT_BIDDERS = 2, 4, 4
EVENTS_PER_S = 10_000
US_STATES = "AZ,CA,ID,OR,WA,WY".split(",")
US_CITIES = "Phoenix,Los Angeles,San Francisco,Boise,Portland,Bend,Redmond,Seattle,Kent,Cheyenne".split(",")
FIRST_NAMES = "Peter,Paul,Luke,John,Saul,Vicky,Kate,Julie,Sarah,Deiter,Walter".split(",")
LAST_NAMES = "Shultz,Abrams,Spencer,White,Bartels,Walton,Smith,Jones,Noris".split(",")

KINDS = ("persons", "auctions", "bids")
SCHEMAS = {
    "persons": "id BIGINT, name STRING, emailAddress STRING, creditCard STRING, city STRING, state STRING, "
               "dateTime BIGINT, extra STRING",
    "auctions": "id BIGINT, itemName STRING, description STRING, initialBid BIGINT, reserve BIGINT, "
                "dateTime BIGINT, expires BIGINT, seller BIGINT, category BIGINT, extra STRING",
    "bids": "auction BIGINT, bidder BIGINT, price BIGINT, dateTime BIGINT, extra STRING",
}
Event = tuple[str, dict[str, Any]]
MASK = (1 << 64) - 1


class _Draws:
    """SplitMix64: the random draws of one event, from (seed, event number) alone."""

    __slots__ = ("state",)

    def __init__(self, seed: int, number: int):
        self.state = (seed * 0xD1B54A32D192ED03 + number * 0x9E3779B97F4A7C15) & MASK

    def next(self) -> int:
        self.state = z = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        return self.next() % n

    def unit(self) -> float:
        return (self.next() >> 11) / 9007199254740992.0


_POOLS: dict[int, str] = {}


def _pool(seed: int) -> str:
    pool = _POOLS.get(seed)
    if pool is None:
        rng = random.Random(seed)
        pool = _POOLS[seed] = "".join(" " if rng.randrange(13) == 0 else chr(97 + rng.randrange(26))
                                      for _ in range(8192))
    return pool


def _string(d: _Draws, pool: str, longest: int) -> str:
    """A string of 3 to ``longest - 1`` characters (Nexmark's ``nextString``), trimmed."""
    length = 3 + d.below(longest - 3)
    at = d.below(len(pool) - length)
    return pool[at:at + length].strip()


def _extra(d: _Draws, pool: str, size: int, average: int) -> str:
    """Padding so that the record averages ``average`` bytes (Nexmark's ``nextExtra``)."""
    if size > average:
        return ""
    wanted = average - size
    delta = round(wanted * 0.2)
    length = wanted - delta + (d.below(2 * delta) if delta else 0)
    at = d.below(len(pool) - length)
    return pool[at:at + length].replace(" ", "x")


def _price(d: _Draws) -> int:
    return round(10.0 ** (d.unit() * 6.0) * 100.0)


def _timestamp(number: int, rate: int = EVENTS_PER_S) -> int:
    return BASE_TIME + number * 1_000 // rate


def _last_person(event_id: int) -> int:
    epoch, offset = divmod(event_id, TOTAL)
    return epoch * PERSON + min(offset, PERSON - 1)


def _last_auction(event_id: int) -> int:
    epoch, offset = divmod(event_id, TOTAL)
    if offset < PERSON:
        epoch, offset = epoch - 1, AUCTION - 1
    elif offset >= PERSON + AUCTION:
        offset = AUCTION - 1
    else:
        offset -= PERSON
    return epoch * AUCTION + offset


def _some_person(d: _Draws, event_id: int) -> int:
    people = _last_person(event_id) + 1
    active = min(people, ACTIVE_PEOPLE)
    return people - active + d.below(active + ID_LEAD)


def _some_auction(d: _Draws, event_id: int) -> int:
    last = _last_auction(event_id)
    low = max(last - IN_FLIGHT_AUCTIONS, 0)
    return low + d.below(last - low + 1 + ID_LEAD)


def adjusted(i: int, out_of_order: int) -> int:
    """The event number of the ``i``-th event generated: ``i`` permuted within its group."""
    base = i - i % out_of_order
    return base + i * 953 % out_of_order


def event(i: int, seed: int = 1, out_of_order: int = 1, rate: int = EVENTS_PER_S) -> Event:
    """The ``i``-th event generated: its kind (``persons``, ``auctions`` or ``bids``) and value;
    ``rate`` events per second of event time (Nexmark's ``firstEventRate``)."""
    number = adjusted(i, out_of_order)
    ts, d, pool = _timestamp(number, rate), _Draws(seed, number), _pool(seed)
    kind = number % TOTAL
    if kind < PERSON:
        name = f"{FIRST_NAMES[d.below(len(FIRST_NAMES))]} {LAST_NAMES[d.below(len(LAST_NAMES))]}"
        email = f"{_string(d, pool, 7)}@{_string(d, pool, 5)}.com"
        card = " ".join(f"{d.below(10_000):04d}" for _ in range(4))
        city, state = US_CITIES[d.below(len(US_CITIES))], US_STATES[d.below(len(US_STATES))]
        size = 8 + len(name) + len(email) + len(card) + len(city) + len(state)
        return "persons", {"id": _last_person(number) + FIRST_ID, "name": name, "emailAddress": email,
                           "creditCard": card, "city": city, "state": state, "dateTime": ts,
                           "extra": _extra(d, pool, size, 200)}
    if kind < PERSON + AUCTION:
        seller = (_last_person(number) // HOT * HOT if d.below(HOT_SELLERS) > 0 else _some_person(d, number))
        category = FIRST_CATEGORY + d.below(5)
        initial = _price(d)
        horizon = _timestamp(number + IN_FLIGHT_AUCTIONS * TOTAL // AUCTION, rate) - ts
        expires = ts + 1 + d.below(max(horizon * 2, 1))
        item, description = _string(d, pool, 20), _string(d, pool, 100)
        reserve = initial + _price(d)
        size = 8 + len(item) + len(description) + 40
        return "auctions", {"id": _last_auction(number) + FIRST_ID, "itemName": item, "description": description,
                            "initialBid": initial, "reserve": reserve, "dateTime": ts, "expires": expires,
                            "seller": seller + FIRST_ID, "category": category, "extra": _extra(d, pool, size, 500)}
    auction = (_last_auction(number) // HOT * HOT if d.below(HOT_AUCTIONS) > 0 else _some_auction(d, number))
    bidder = (_last_person(number) // HOT * HOT + 1 if d.below(HOT_BIDDERS) > 0 else _some_person(d, number))
    return "bids", {"auction": auction + FIRST_ID, "bidder": bidder + FIRST_ID, "price": _price(d), "dateTime": ts,
                    "extra": _extra(d, pool, 32, 100)}


def events(n: int, seed: int = 1, out_of_order: int = 1, rate: int = EVENTS_PER_S) -> Iterator[Event]:
    """The first ``n`` events, in the order they are generated."""
    for i in range(n):
        yield event(i, seed, out_of_order, rate)


def kind_of(i: int, out_of_order: int) -> str:
    kind = adjusted(i, out_of_order) % TOTAL
    return "persons" if kind < PERSON else "auctions" if kind < PERSON + AUCTION else "bids"


def source(kind: str, n: int, seed: int = 1, out_of_order: int = 1,
           rate: int = EVENTS_PER_S) -> Callable[[], Iterator[dict[str, Any]]]:
    """The values of one kind among the first ``n`` events, in generation order: an injector's
    source (called again, it starts again from the first)."""
    def values() -> Iterator[dict[str, Any]]:
        for i in range(n):
            if kind_of(i, out_of_order) == kind:
                yield event(i, seed, out_of_order, rate)[1]
    return values


def count_by_kind(n: int, out_of_order: int = 1) -> dict[str, int]:
    counts = dict.fromkeys(KINDS, 0)
    for i in range(n):
        counts[kind_of(i, out_of_order)] += 1
    return counts
