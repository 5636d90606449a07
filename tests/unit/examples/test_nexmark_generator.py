"""The Nexmark generator: deterministic from its seed, Nexmark's proportions and id rules, and an
injector whose watermark no record falls behind."""

from __future__ import annotations

from collections import Counter

from examples.nexmark.generator import BASE_TIME, count_by_kind, event, events, source
from examples.nexmark.queries import inject
from headrace import Topology


def test_the_same_seed_makes_the_same_events_and_any_event_can_be_made_alone() -> None:
    first = list(events(3_000, seed=4, out_of_order=100))
    assert first == list(events(3_000, seed=4, out_of_order=100))
    assert first != list(events(3_000, seed=5, out_of_order=100))
    assert all(event(i, 4, 100) == first[i] for i in (0, 1, 777, 2_999))


def test_one_person_three_auctions_and_forty_six_bids_in_fifty_with_nexmarks_ids() -> None:
    assert count_by_kind(50_000) == {"persons": 1_000, "auctions": 3_000, "bids": 46_000}
    made = list(events(50_000))
    persons = [v for k, v in made if k == "persons"]
    auctions = [v for k, v in made if k == "auctions"]
    bids = [v for k, v in made if k == "bids"]
    assert [p["id"] for p in persons] == list(range(1_000, 2_000))
    assert [a["id"] for a in auctions] == list(range(1_000, 4_000))
    assert all(1_000 <= a["seller"] <= 2_010 and 10 <= a["category"] <= 14 and a["expires"] > a["dateTime"]
               for a in auctions)
    hot = Counter(b["auction"] for b in bids).most_common(1)[0][1]
    assert hot > len(bids) / 100  # half the bids go to the hot auction of their moment
    assert made[0][1]["dateTime"] == BASE_TIME and made[-1][1]["dateTime"] == BASE_TIME + 4_999  # 10,000/s
    sizes = {k: sum(len(str(v)) for kk, v in made if kk == k) / n for k, n in count_by_kind(50_000).items()}
    assert 150 < sizes["bids"] < 200 and sizes["persons"] > sizes["bids"] and sizes["auctions"] > sizes["persons"]


def test_out_of_order_events_never_fall_behind_the_injectors_watermark() -> None:
    t = Topology("nexmark_gen")
    inject(t, 20_000, seed=2, out_of_order=500, batch_size=700)
    for kind in ("persons", "auctions", "bids"):
        watermark = None
        stamps: list[int] = []
        for batch in t.injections[kind].source.batches(None):
            stamps += [ts for _, ts, _ in batch.records]
            if watermark is not None:
                assert all(ts >= watermark for _, ts, _ in batch.records), kind
            watermark = batch.watermark
        assert stamps != sorted(stamps), f"{kind} came in order: nothing out of order was tested"
        assert len(stamps) == count_by_kind(20_000, 500)[kind]
        assert list(source(kind, 20_000, 2, 500)()) == list(source(kind, 20_000, 2, 500)())  # a restart regenerates it
