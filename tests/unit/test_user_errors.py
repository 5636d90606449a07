"""A wrong topology, a bad option or a bad key is refused where it is written, with a message
that says what, what was received, and how to fix it (matched word for word)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from headrace import Computation, Topology, key_by
from headrace.codecs import codec_named
from headrace.errors import InvalidKeyError, OptionError, TopologyError, UnknownStreamError, UserCodeError
from headrace.testing import Harness


class Echo(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.produce("out", record.value)


class NoHooks(Computation):
    pass


def topology() -> Topology:
    t = Topology("demo")
    t.inject("words", [{"w": "a"}])
    return t


def exact(message: str) -> str:
    return "^" + re.escape(message) + "$"


def test_unknown_stream() -> None:
    with pytest.raises(TopologyError, match=exact(
            "Computation 'Echo' subscribes to unknown stream 'wrods' (got 'wrods'). "
            "Hint: known streams are ['words']; inject it, or add its producer first")):
        topology().add(Echo, inputs={"wrods": key_by("w")}, outputs=["out"])


def test_a_computation_with_no_hooks() -> None:
    with pytest.raises(TopologyError, match=exact(
            "Computation 'NoHooks' defines neither process_record nor process_timer "
            f"(got {NoHooks!r}). Hint: override process_record(self, ctx, record) and/or "
            "process_timer(self, ctx, timer)")):
        topology().add(NoHooks, inputs={"words": key_by("w")})


def test_a_duplicate_name() -> None:
    t = topology()
    t.add(Echo, inputs={"words": key_by("w")}, outputs=["out"])
    with pytest.raises(TopologyError, match=exact(
            f"Topology 'demo' already has a computation named 'Echo' (got {Echo!r}). "
            "Hint: pass a distinct name: topology.add(cls, name='...')")):
        t.add(Echo, inputs={"words": key_by("w")}, outputs=["out2"])


def test_a_key_extractor_that_is_not_callable() -> None:
    with pytest.raises(TopologyError, match=exact(
            "Computation 'Echo' subscribes to 'words' with a key extractor that is not callable "
            "(got 42 of type int). Hint: use key_by('field') or key_by(lambda value: ...)")):
        topology().add(Echo, inputs={"words": 42}, outputs=["out"])  # type: ignore[dict-item]


def test_a_cycle() -> None:
    t = topology()

    class Back(Computation):
        def process_record(self, ctx: Any, record: Any) -> None:
            ctx.produce("words", record.value)

    t.add(Echo, inputs={"words": key_by("w")}, outputs=["out"])
    with pytest.raises(TopologyError, match=exact(
            "Adding 'Back' would make a cycle through stream 'out' (got ['words']). Hint: low watermarks "
            "cannot advance around a cycle; send feedback through a new injected stream")):
        t.add(Back, inputs={"out": key_by("w")}, outputs=["words"])


def test_an_unknown_option_and_a_bad_choice() -> None:
    with pytest.raises(OptionError, match=exact(
            "Computation 'Echo' got unknown option 'lateness' (got 'drop'). Hint: valid options are "
            "['alert_lag_ms', 'codec', 'dedup', 'dedup_slack_ms', 'late', 'on_error', 'output_semantics', 'process_timeout_s', 'productions', "
            "'semantics', 'shards', 'state_semantics', 'state_ttl_domain', 'state_ttl_ms', 'watermark_percentile']")):
        topology().add(Echo, inputs={"words": key_by("w")}, lateness="drop")
    with pytest.raises(OptionError, match=exact(
            "Computation 'Echo' option 'late' must be one of ['drop', 'deliver'] (got 'keep'). "
            "Hint: write late='drop'")):
        topology().add(Echo, inputs={"words": key_by("w")}, late="keep")
    with pytest.raises(OptionError, match=exact(
            "Unknown state codec (got 'yaml'). Hint: use one of ['bytes', 'json', 'msgpack', 'pickle'] "
            "or a headrace.codecs.Codec(name, encode, decode)")):
        codec_named("yaml")


def test_a_combination_of_semantics_the_paper_rules_out_is_refused_with_the_reason() -> None:
    with pytest.raises(OptionError, match=exact(
            "Computation 'Echo' cannot have at_most_once state with exactly_once output: at-most-once state saves "
            "the input offset before the state, so a crash loses the input's output along with its effect on the "
            "state: its output can only be at_most_once (got ('at_most_once', 'exactly_once')). Hint: "
            "state_semantics='at_most_once', output_semantics='at_most_once', or exactly_once state with any output "
            "semantics")):
        topology().add(Echo, inputs={"words": key_by("w")}, state_semantics="at_most_once",
                       output_semantics="exactly_once")
    with pytest.raises(OptionError, match=exact(
            "Computation 'Echo' cannot have at_least_once state with at_most_once output: at-least-once state re-runs "
            "user code on a retry, so the output of the retried input goes out again: its output can only be "
            "at_least_once (got ('at_least_once', 'at_most_once')). Hint: state_semantics='at_least_once', "
            "output_semantics='at_least_once', or exactly_once state with any output semantics")):
        topology().add(Echo, inputs={"words": key_by("w")}, state_semantics="at_least_once",
                       output_semantics="at_most_once")
    with pytest.raises(OptionError, match=exact(
            "Computation 'Echo' got productions='weak' and output_semantics='at_most_once' (got 'weak'). "
            "Hint: give output_semantics alone (productions is its older name)")):
        topology().add(Echo, inputs={"words": key_by("w")}, productions="weak", output_semantics="at_most_once")


@pytest.mark.parametrize("given, state, output", [
    ({}, "exactly_once", "exactly_once"),
    ({"productions": "weak"}, "exactly_once", "at_least_once"),
    ({"semantics": "at_least_once"}, "at_least_once", "at_least_once"),
    ({"semantics": "at_least_once", "productions": "weak"}, "at_least_once", "at_least_once"),
    ({"state_semantics": "at_most_once"}, "at_most_once", "at_most_once"),
    ({"output_semantics": "at_most_once"}, "exactly_once", "at_most_once"),
])
def test_the_older_semantics_options_map_onto_state_and_output_semantics(given: dict, state: str,
                                                                         output: str) -> None:
    options = topology().add(Echo, inputs={"words": key_by("w")}, **given).options
    assert (options.state_semantics, options.output_semantics) == (state, output)
    assert options.dedup is (state == "exactly_once")


def test_a_key_that_is_not_a_str() -> None:
    extractor = key_by(lambda v: v["id"])
    with pytest.raises(InvalidKeyError, match=re.escape(
            "must return a str (got 7 of type int). Hint: convert it in the extractor, "
            "e.g. key_by(lambda v: str(v['user_id']))")):
        extractor({"id": 7})
    with pytest.raises(InvalidKeyError, match=exact(
            "key_by('user') found no field 'user' in the record (got {'id': 7}). "
            "Hint: check the field name, or pass a function: key_by(lambda v: ...)")):
        key_by("user")({"id": 7})


def test_producing_to_an_undeclared_stream_names_it() -> None:
    h = Harness(Echo, outputs=["elsewhere"])
    with pytest.raises(UserCodeError, match=exact(
            "Computation 'Echo' failed on key 'k' at record 'r1' (timestamp 5): Computation 'Echo' produced "
            "to undeclared stream 'out' (got 'out'). Hint: declare it: topology.add(..., outputs=['elsewhere', "
            "'out']); the batch was not committed and will be retried from its committed point")):
        h.process("k", "v", 5, id="r1")
    assert isinstance(UnknownStreamError("x"), KeyError)


class Unpicklable(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = {"callback": lambda: record.value}


def test_state_the_codec_cannot_save_names_the_computation_the_key_and_the_codec() -> None:
    h = Harness(Unpicklable)
    with pytest.raises(UserCodeError, match=exact(
            "Computation 'Unpicklable' cannot save the state of key 'k' with the 'pickle' codec (got dict value: "
            "AttributeError: Can't pickle local object "
            "'Unpicklable.process_record.<locals>.<lambda>'). Hint: keep state to plain data (dicts, lists, "
            "numbers, strings) or objects the codec can serialize (no open files, locks, lambdas or generators), "
            "or pick another codec=")):
        h.process("k", "v", 5)
    assert h.state("k") is None and h.counters.get("records", 0) == 0  # nothing of the batch was committed


class Unbuildable(Echo):
    def __init__(self) -> None:
        raise ValueError("no model file")


def test_a_computation_whose_constructor_raises_is_named_on_the_harness_as_in_each_mode() -> None:
    """The message the modes give (tests/spark/test_query_restarts.py), word for word."""
    with pytest.raises(UserCodeError, match=exact(
            "Computation 'Unbuildable' could not be created: Unbuildable() raised (got ValueError: no model file). "
            "Hint: fix its __init__ (it runs in every worker, with no argument) and run again; nothing of it was "
            "committed")):
        Harness(Unbuildable)


class FakeStreamingDataFrame:
    """Only what ``Topology.inject`` looks at to tell a streaming DataFrame: ``isStreaming`` and ``columns``."""

    isStreaming = True
    columns = ["query", "ts"]


def test_an_unknown_injector_option_is_refused() -> None:
    with pytest.raises(OptionError, match=exact(
            "Stream 'more': unknown injector option 'delivary' (got 'at_least_once'). Hint: valid options are "
            "['delivery']; ['timestamp', 'max_delay_ms', 'id', 'bounded'] apply to a streaming DataFrame only")):
        topology().inject("more", [{"w": "a"}], delivary="at_least_once")
    with pytest.raises(OptionError, match=exact(
            "Stream 'more': unknown injector option 'max_delay_ms' (got 5). Hint: valid options are "
            "['delivery']; ['timestamp', 'max_delay_ms', 'id', 'bounded'] apply to a streaming DataFrame only")):
        topology().inject("more", [{"w": "a"}], max_delay_ms=5)
    with pytest.raises(OptionError, match=exact(
            "Stream 'more': option 'delivery' must be one of ['exactly_once', 'at_least_once'] (got 'twice'). "
            "Hint: write delivery='at_least_once' for a source that may repeat records")):
        topology().inject("more", [{"w": "a"}], delivery="twice")


def test_streaming_dataframe_injector_options_are_checked_where_they_are_written() -> None:
    df = FakeStreamingDataFrame()
    with pytest.raises(OptionError, match=exact(
            "Stream 'more': unknown injector option 'watermark' (got 5). Hint: valid options are "
            "['delivery', 'timestamp', 'max_delay_ms', 'id', 'bounded']")):
        topology().inject("more", df, timestamp="ts", watermark=5)
    with pytest.raises(OptionError, match=exact(
            "Stream 'more' needs a column of the DataFrame as timestamp= (got 'time'). "
            "Hint: the columns are ['query', 'ts']")):
        topology().inject("more", df, timestamp="time")
    with pytest.raises(OptionError, match=exact(
            "Stream 'more': option 'max_delay_ms' must be an integer >= 0 (got -1). Hint: e.g. max_delay_ms=5000")):
        topology().inject("more", df, timestamp="ts", max_delay_ms=-1)
    t = topology()
    t.inject("more", df, timestamp="ts", max_delay_ms=2_000, delivery="at_least_once")
    assert t.injections["more"].options.max_delay_ms == 2_000


def test_dedup_applies_to_the_streams_injected_at_least_once() -> None:
    t = Topology("dedup")
    t.inject("once", [{"w": "a"}])
    t.inject("maybe_twice", [{"w": "a"}], delivery="at_least_once")
    t.add(Echo, inputs={"once": key_by("w"), "maybe_twice": key_by("w")}, outputs=["out"])
    assert t.dedup_streams("Echo") == frozenset({"maybe_twice"})


def test_reading_a_stream_nobody_produces_lists_the_known_streams(tmp_path: Any) -> None:
    from headrace import read
    from headrace.errors import StoreError, UnknownStreamError
    from headrace.store import open_store

    url = f"sqlite:///{tmp_path}/s.db"
    with pytest.raises(StoreError, match=exact(
            f"No store at {tmp_path}/s.db (got '{url}'). Hint: check --store (sqlite:///relative/file.db or "
            "sqlite:////absolute/file.db): a run creates its store, the tools only read one")):
        read("wrods", url)  # a mistyped path is not a new, empty store
    open_store(url).close()
    with pytest.raises(UnknownStreamError, match=exact(
            f"No producer writes stream 'wrods' in sqlite:///{tmp_path}/s.db (got 'wrods'). Hint: nothing has run "
            "on this store yet: run the topology first, or check store=")):
        read("wrods", url)
    store = open_store(url)
    store.declare_stream("words", "inject:words")
    store.declare_stream("counts", "Counter")
    store.close()
    with pytest.raises(UnknownStreamError, match=exact(
            f"No producer writes stream 'wrods' in sqlite:///{tmp_path}/s.db (got 'wrods'). Hint: known streams "
            "are ['counts', 'words']")):
        read("wrods", url)
    assert list(read("words", url)) == []  # declared, nothing produced yet: empty, not an error
    with pytest.raises(OptionError, match=exact(
            "read(limit=...) must be an integer >= 0 or None (got -1). Hint: e.g. read('counts', store=..., limit=10)")):
        read("words", url, limit=-1)


def test_a_watermark_percentile_must_name_an_input_and_lie_in_0_to_100() -> None:
    with pytest.raises(OptionError, match=exact(
            "Computation 'Echo' option 'watermark_percentile' maps input streams to a percentile in (0, 100] "
            "(got {'words': 150}). Hint: e.g. watermark_percentile={'clicks': 99}")):
        topology().add(Echo, inputs={"words": key_by("w")}, watermark_percentile={"words": 150})
    with pytest.raises(OptionError, match=exact(
            "Computation 'Echo' sets a watermark percentile for 'wrods', which it does not subscribe to "
            "(got 'wrods'). Hint: its inputs are ['words']")):
        topology().add(Echo, inputs={"words": key_by("w")}, watermark_percentile={"wrods": 99})
    spec = topology().add(Echo, inputs={"words": key_by("w")}, watermark_percentile={"words": 99})
    assert spec.options.percentile("words") == 99.0


@pytest.mark.parametrize("extractor", [key_by("w"), key_by(lambda v: v["w"])], ids=["field", "callable"])
def test_keys_of_many_values_at_once_or_none_when_one_has_no_key(extractor: Any) -> None:
    """``many`` is how readers key a segment; None sends them back to one value at a time, where
    the culprit's error is raised or dead-lettered."""
    assert extractor.many([{"w": "a"}, {"w": "b"}, {"w": "a"}]) == ["a", "b", "a"]
    assert extractor.many([]) == []
    assert extractor.many([{"w": "a"}, {"x": "b"}]) is None  # a missing field
    assert extractor.many([{"w": "a"}, {"w": 7}]) is None  # a key that is not a str
    assert extractor.many([{"w": "a"}, None]) is None  # a value that is not a mapping
