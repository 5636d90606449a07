"""A topology's sinks: the options of ``Topology.sink``, checked when the topology is built."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping
from urllib.parse import parse_qsl, quote, urlsplit

from .errors import OptionError
from .kafka_target import KAFKA_SINK_OPTIONS, KafkaTarget, kafka_target
from .names import check_name

__all__ = ["SinkSpec", "parse_sink", "libpq_url", "FILE_FORMATS"]

FILE_FORMATS = ("parquet", "json")


@dataclass(frozen=True)
class SinkSpec:
    """Where ``Topology.sink`` sends a stream's committed records: a file sink (``format``,
    ``path``), a JDBC table (``jdbc``, ``table``, ``properties``), a Delta table (``delta``: its
    path), an Iceberg table (``iceberg``: ``namespace.table``, ``warehouse``), a Kafka topic
    (``kafka``) or ``foreach_batch(df, batch_id)``."""

    name: str
    stream: str
    kind: str  # "file", "jdbc", "delta", "iceberg", "kafka" or "foreach_batch"
    format: str | None = None
    path: str | None = None
    jdbc: str | None = None
    table: str | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    foreach_batch: Callable[[Any, int], None] | None = None
    delta: str | None = None
    iceberg: str | None = None
    warehouse: str | None = None
    kafka: KafkaTarget | None = None  # a Kafka topic, written by a transactional producer (kafka_target.py)


def libpq_url(jdbc: str, properties: dict[str, str] | Any) -> str:
    """``jdbc:postgresql://host:port/db?user=...`` (and ``properties``) as a libpq URL."""
    if not jdbc.startswith("jdbc:postgresql://"):
        raise OptionError("A JDBC sink writes to PostgreSQL", got=jdbc, hint="jdbc='jdbc:postgresql://host:5432/db'")
    parts = urlsplit(jdbc[len("jdbc:"):])
    params = {**dict(parse_qsl(parts.query)), **dict(properties)}
    user, password = params.pop("user", None), params.pop("password", None)
    auth = f"{quote(user, safe='')}{':' + quote(password, safe='') if password else ''}@" if user else ""
    return f"postgresql://{auth}{parts.netloc}{parts.path}"


def parse_sink(stream: str, name: str | None, options: Mapping[str, Any]) -> SinkSpec:
    kinds = {"file": ("format", "path"), "jdbc": ("jdbc", "table", "properties"), "foreach_batch": ("foreach_batch",),
             "delta": ("delta",), "iceberg": ("iceberg", "warehouse"), "kafka": KAFKA_SINK_OPTIONS}
    valid = [o for names in kinds.values() for o in names]
    for option, value in options.items():
        if option not in valid:
            raise OptionError(f"Sink of stream {stream!r}: unknown option {option!r}", got=value,
                              hint=f"valid options are {valid}")
    chosen = [k for k, names in kinds.items() if any(n in options for n in names)]
    if len(chosen) != 1:
        raise OptionError(f"Sink of stream {stream!r} needs one target", got=sorted(options),
                          hint="pass format= and path= (a file sink), jdbc=, table= and properties= (a JDBC table), "
                               "delta=path (a Delta table), iceberg='namespace.table' and warehouse=path (an Iceberg "
                               "table), kafka='topic' and bootstrap_servers= (a Kafka topic), or foreach_batch=fn")
    kind = chosen[0]
    missing = [n for n in kinds[kind][:2] if n not in options and n != "properties"]
    if missing:
        raise OptionError(f"Sink of stream {stream!r} needs option {missing[0]!r}", got=sorted(options),
                          hint=f"a {kind} sink takes {list(kinds[kind])}")
    if kind == "file" and options["format"] not in FILE_FORMATS:
        raise OptionError(f"Sink of stream {stream!r}: format must be one of {list(FILE_FORMATS)}",
                          got=options["format"], hint="format='parquet'")
    if kind == "foreach_batch" and not callable(options["foreach_batch"]):
        raise OptionError(f"Sink of stream {stream!r}: foreach_batch must be a function (df, batch_id)",
                          got=options["foreach_batch"], hint="foreach_batch=lambda df, batch_id: df.show()")
    if kind == "iceberg" and "." not in str(options["iceberg"]).strip("."):
        raise OptionError(f"Sink of stream {stream!r}: an Iceberg table is named namespace.table",
                          got=options["iceberg"], hint="iceberg='analytics.anomalies'")
    if kind == "jdbc":
        libpq_url(options["jdbc"], options.get("properties") or {})  # refuses a URL that is not PostgreSQL's
    label = check_name("sink", name if name is not None else f"{stream}-{kind}")
    if kind == "kafka":
        return SinkSpec(label, stream, kind, kafka=kafka_target(stream, options))
    return SinkSpec(label, stream, kind, **{k: v for k, v in options.items() if k != "properties"},
                    properties=dict(options.get("properties") or {}))
