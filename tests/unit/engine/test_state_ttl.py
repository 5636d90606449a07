"""State TTL (``state_ttl_ms``): a key's state expires a while after its last use, in event
time or wall-clock time; a framework-owned timer clears it, exactly once, and a record after the
expiry sees no state. On the harness against a plain model, and killed between expiry and commit."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from headrace import Computation
from headrace.errors import OptionError, UserCodeError
from headrace.names import STATE_TTL_TIMER
from headrace.testing import Harness

from ...monoids import Adding

TTL = 1_000


class Visits(Computation):
    """Counts a key's records while its state lives; warns just before it expires."""

    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1
        ctx.produce("seen", {"key": ctx.key, "n": ctx.state})
        ctx.set_timer("warn", ctx.state_expires_at - 1, domain=ctx_domain(ctx))

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.produce("warned", {"key": ctx.key})  # (reading the state here would renew it)


def ctx_domain(ctx: Any) -> str:
    return str(ctx._ttl[1])


def model(events: list[tuple[str, int]], ttl: int) -> tuple[list[tuple[str, int]], int]:
    """What each record sees, and how many times a state expires, when each key's state is gone
    ``ttl`` after its last use (each record uses it): (key, count) per record, in order; expiries to the end of time."""
    state: dict[str, tuple[int, int]] = {}  # key -> (count, expires at)
    seen, expired = [], 0
    for key, at in events:
        count, expiry = state.get(key, (0, 0))
        if key in state and expiry <= at:
            count, expired = 0, expired + 1
        state[key] = (count + 1, at + ttl)
        seen.append((key, count + 1))
    return seen, expired + len(state)


EVENTS = [("a", 0), ("b", 100), ("a", 500), ("a", 1_400), ("b", 1_600), ("a", 2_500), ("b", 2_600),
          ("c", 2_700), ("a", 3_499), ("c", 3_600), ("a", 4_498)]


@pytest.mark.parametrize("domain", ["watermark", "wall"])
def test_state_expires_after_its_last_change_and_a_later_record_sees_none(domain: str) -> None:
    h = Harness(Visits, state_ttl_ms=TTL, state_ttl_domain=domain)
    for key, at in EVENTS:
        if domain == "wall":
            h.advance_wall_clock(at)
        else:
            h.advance_watermark(max(h.low_watermark, at - 200))  # records on time, the watermark behind
        h.process(key, {}, at)
    assert h.timers("a") == [h.timers("a")[0].__class__("warn", 4_498 + TTL - 1, domain),
                             h.timers("a")[0].__class__(STATE_TTL_TIMER, 4_498 + TTL, domain)]
    if domain == "wall":
        h.advance_wall_clock(10**9)
    h.advance_watermark(10**15)
    seen, expired = model(EVENTS, TTL)
    assert [(r.value["key"], r.value["n"]) for r in h.productions("seen")] == seen
    assert h.counters["state_expired"] == expired
    assert all(h.state(k) is None and h.timers(k) == [] for k in "abc"), "expired state is cleared, timers gone"
    assert h.productions("warned"), "a timer of the user's own, set at state_expires_at - 1, fired before expiries"


def test_a_read_renews_the_state_and_clearing_it_drops_the_expiry() -> None:
    class Reader(Computation):
        def process_record(self, ctx: Any, record: Any) -> None:
            if record.value == "set":
                ctx.state = {"v": 1}
            elif record.value == "clear":
                ctx.state = None
            elif record.value == "read":
                ctx.produce("read", {"state": ctx.state})

    h = Harness(Reader, state_ttl_ms=TTL)
    h.process("k", "set", 0)
    h.process("k", "other", 500)  # not a use: the expiry stays at 1,000
    assert [t.timestamp for t in h.timers("k")] == [TTL]
    h.process("k", "read", 900)  # a use: it lives a TTL from here
    assert [t.timestamp for t in h.timers("k")] == [900 + TTL]
    h.process("k", "read", 900 + TTL)
    assert [r.value for r in h.productions("read")] == [{"state": {"v": 1}}, {"state": None}]
    h.process("k", "set", 2_000)
    h.process("k", "clear", 2_100)
    assert h.timers("k") == [] and h.state("k") is None


def test_bad_ttl_options_and_the_reserved_tag_are_refused_with_what_to_do() -> None:
    with pytest.raises(OptionError, match=re.escape(
            "Computation 'Visits' option 'state_ttl_ms' must be a positive number of milliseconds or None "
            "(got -5). Hint: e.g. state_ttl_ms=3_600_000 (state expires an hour after its last change); None "
            "keeps it until user code clears it")):
        Harness(Visits, state_ttl_ms=-5)
    with pytest.raises(OptionError, match=re.escape(
            "Computation 'Visits' option 'state_ttl_domain' must be one of ['watermark', 'wall'] (got 'event')")):
        Harness(Visits, state_ttl_ms=TTL, state_ttl_domain="event")

    class Sum(Adding):
        def emit(self, ctx: Any, timer: Any, aggregate: int) -> None:
            ctx.produce("sums", aggregate)

    with pytest.raises(OptionError, match=re.escape(
            "Monoid computation 'Sum' cannot take state_ttl_ms (got 1000). Hint: a monoid's aggregates go when "
            "their window is emitted: give it a window(), or write it as a Computation to give its state a time "
            "to live")):
        Harness(Sum, state_ttl_ms=TTL)

    class Sneaky(Computation):
        def process_record(self, ctx: Any, record: Any) -> None:
            ctx.set_timer(STATE_TTL_TIMER, 10)
    with pytest.raises(UserCodeError, match=re.escape(
            f"Computation 'Sneaky' failed on key 'k' at record 'r1' (timestamp 0): Timer tag '{STATE_TTL_TIMER}' is "
            f"the framework's own (the state TTL's timer)")):
        Harness(Sneaky).process("k", None, 0, id="r1")


CHILD = """
import os, signal, sys
from headrace.testing import Harness
from tests.unit.engine.test_state_ttl import Visits, TTL
h = Harness(Visits, name="Visits", store=sys.argv[1], state_ttl_ms=TTL)
h.process("k", {}, 100, id="first")
h.advance_watermark(500)
def kill(step):
    if step == sys.argv[2]:
        os.kill(os.getpid(), signal.SIGKILL)
h.store.failpoint = kill
h.advance_watermark(100 + TTL)  # the state expires in this batch: killed around its commit
"""


@pytest.mark.parametrize("step", ["before_commit", "after_commit"])
def test_a_kill_around_an_expirys_commit_neither_loses_nor_resurrects_the_state(tmp_path: Path, step: str) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    root = Path(__file__).parents[3]
    child = subprocess.run([sys.executable, "-c", CHILD, url, step], cwd=root, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(root)}, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    h = Harness(Visits, name="Visits", store=url, state_ttl_ms=TTL)
    if step == "before_commit":  # nothing of the expiry was committed: the state lives until it runs again
        assert h.state("k") == 1 and h.counters.get("state_expired", 0) == 0
    else:
        assert h.state("k") is None and h.counters["state_expired"] == 1
    h.advance_watermark(100 + TTL)
    assert h.state("k") is None and h.counters["state_expired"] == 1, "expired once, whatever was killed"
    h.process("k", {}, 100 + TTL + 50, id="second")
    assert [r.value["n"] for r in h.productions("seen")] == [1, 1], "the state did not come back"
