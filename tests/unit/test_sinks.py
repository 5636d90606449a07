"""``Topology.sink`` checks its options where they are written."""

from __future__ import annotations

import re
from typing import Any

import pytest

from headrace import Computation, Topology, key_by
from headrace.errors import OptionError, TopologyError


def exact(text: str) -> str:
    return "^" + re.escape(text) + "$"


class Echo(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.produce("out", record.value)


def topology() -> Topology:
    t = Topology("sinks")
    t.inject("words", [{"w": "a"}])
    t.add(Echo, inputs={"words": key_by("w")}, outputs=["out"])
    return t


def test_each_kind_of_sink_is_declared_with_its_own_options() -> None:
    t = topology()
    assert t.sink("out", format="parquet", path="/tmp/x").kind == "file"
    spec = t.sink("out", jdbc="jdbc:postgresql://h:5432/db", table="t", properties={"user": "u"})
    assert (spec.name, spec.kind, dict(spec.properties)) == ("out-jdbc", "jdbc", {"user": "u"})
    assert t.sink("words", name="show", foreach_batch=lambda df, batch_id: None).name == "show"
    assert (t.sink("out", delta="/tmp/d").kind, t.sink("out", iceberg="ns.t", warehouse="/tmp/w").kind) == \
        ("delta", "iceberg")
    assert sorted(t.sinks) == ["out-delta", "out-file", "out-iceberg", "out-jdbc", "show"]


def test_a_lakehouse_sink_is_refused_word_for_word() -> None:
    t = topology()
    with pytest.raises(OptionError, match=exact(
            "Sink of stream 'out' needs option 'iceberg' (got ['warehouse']). Hint: a iceberg sink takes "
            "['iceberg', 'warehouse']")):
        t.sink("out", warehouse="/tmp/w")
    with pytest.raises(OptionError, match=exact(
            "Sink of stream 'out': an Iceberg table is named namespace.table (got 'anomalies'). Hint: "
            "iceberg='analytics.anomalies'")):
        t.sink("out", iceberg="anomalies", warehouse="/tmp/w")


def test_a_bad_sink_is_refused_word_for_word() -> None:
    t = topology()
    with pytest.raises(OptionError, match=exact(
            "Sink of stream 'out': unknown option 'paht' (got '/tmp/x'). Hint: valid options are ['format', 'path', "
            "'jdbc', 'table', 'properties', 'foreach_batch', 'delta', 'iceberg', 'warehouse', 'kafka', "
            "'bootstrap_servers', 'key', 'serializer', 'config', 'lease_ms']")):
        t.sink("out", format="parquet", paht="/tmp/x")
    with pytest.raises(OptionError, match=exact(
            "Sink of stream 'out' needs one target (got ['foreach_batch', 'path']). Hint: pass format= and path= "
            "(a file sink), jdbc=, table= and properties= (a JDBC table), delta=path (a Delta table), "
            "iceberg='namespace.table' and warehouse=path (an Iceberg table), kafka='topic' and bootstrap_servers= "
            "(a Kafka topic), or foreach_batch=fn")):
        t.sink("out", path="/tmp/x", foreach_batch=print)
    with pytest.raises(OptionError, match=exact(
            "Sink of stream 'out' needs option 'format' (got ['path']). Hint: a file sink takes ['format', 'path']")):
        t.sink("out", path="/tmp/x")
    with pytest.raises(OptionError, match=exact(
            "Sink of stream 'out': format must be one of ['parquet', 'json'] (got 'csv'). Hint: format='parquet'")):
        t.sink("out", format="csv", path="/tmp/x")
    with pytest.raises(TopologyError, match=exact(
            "Topology 'sinks' cannot sink stream 'cuonts': nothing produces it (got 'cuonts'). Hint: known streams "
            "are ['out', 'words']")):
        t.sink("cuonts", format="json", path="/tmp/x")
    t.sink("out", format="json", path="/tmp/x")
    with pytest.raises(TopologyError, match=exact(
            "Topology 'sinks' already has a sink named 'out-file' (got 'out-file'). Hint: pass a distinct name: "
            "topology.sink(stream, name='...', ...)")):
        t.sink("out", format="parquet", path="/tmp/y")


def test_a_jdbc_url_becomes_a_libpq_url_with_its_credentials() -> None:
    from headrace.sinkspec import libpq_url

    assert libpq_url("jdbc:postgresql://127.0.0.1:5432/db?user=ann", {"password": "p w"}) == \
        "postgresql://ann:p%20w@127.0.0.1:5432/db"
    with pytest.raises(OptionError, match=exact(
            "A JDBC sink writes to PostgreSQL (got 'jdbc:mysql://h/db'). Hint: jdbc='jdbc:postgresql://host:5432/db'")):
        topology().sink("out", jdbc="jdbc:mysql://h/db", table="t")
