"""Every name headrace writes into a store, formatted and parsed in one place: producers on the
bus, record ids, execution modes, dead-letter streams and the keys of ``meta`` rows.

>>> injector("queries"), injector("queries", 2), interval("Counter", 3)
('inject:queries', 'inject:queries/2', 'Counter/3')
>>> parse_producer("inject:queries/2")
Producer(kind='injector', name='queries', part='2')
>>> parse_producer("Counter/3").interval, parse_producer("Counter").kind
(3, 'computation')
>>> id_prefix("Counter", 7, shard=2), id_sequence("Counter:2:7:11")
('Counter:2:7:', 11)
"""

from __future__ import annotations

import re
from typing import NamedTuple

from .errors import TopologyError

__all__ = [
    "check_name",
    "MODES", "MICROBATCH", "CONTINUOUS", "REBALANCED", "Producer", "injector", "interval", "parse_producer", "dead_letter_stream", "sink_reader",
    "lake_app_id", "lake_stamp", "kafka_sink_id",
    "id_prefix", "id_sequence", "meta", "STATE_TTL_TIMER",
]

MICROBATCH, CONTINUOUS = "microbatch", "continuous"
REBALANCED = "rebalanced"  # the kind of the events that record live rebalancing's decisions
STATE_TTL_TIMER = "headrace:state-ttl"  # the tag of the framework's timer that clears a key's expired state
MODES = (MICROBATCH, CONTINUOUS)

_INJECT = "inject:"
_DEAD_LETTER = ".dead_letter"


class Producer(NamedTuple):
    """A producer name taken apart: an injector (``inject:<stream>`` or ``inject:<stream>/<part>``),
    a whole computation (``C``, micro-batch mode) or one key interval of it (``C/<i>``)."""

    kind: str  # "injector", "computation" or "interval"
    name: str  # the stream (an injector's) or the computation
    part: str | None = None  # an injector's part, or an interval's number as text

    @property
    def interval(self) -> int | None:
        return int(self.part) if self.kind == "interval" and self.part is not None else None


def injector(stream: str, part: int | str | None = None) -> str:
    """The producer an injector of ``stream`` publishes as: one per part when it has several."""
    return f"{_INJECT}{stream}" if part is None else f"{_INJECT}{stream}/{part}"


def interval(computation: str, shard: int) -> str:
    """The producer one key interval of a computation writes as in continuous mode."""
    return f"{computation}/{shard}"


def parse_producer(name: str) -> Producer:
    if name.startswith(_INJECT):
        stream, _, part = name[len(_INJECT):].partition("/")
        return Producer("injector", stream, part or None)
    computation, slash, shard = name.rpartition("/")
    if slash and shard.isdigit():
        return Producer("interval", computation, shard)
    return Producer("computation", name)


def sink_reader(sink: str) -> str:
    """The name a sink reads the bus as (where retention finds how far it has written)."""
    return f"sink:{sink}"


def lake_app_id(sink: str, producer: str) -> str:
    """The Delta application transaction id under which a sink records, per producer on the bus,
    the last batch it wrote (``DeltaTable.transaction_version``)."""
    return f"headrace:{sink}:{producer}"


def lake_stamp(sink: str) -> str:
    """The Iceberg snapshot summary property holding a sink's last written batch per producer."""
    return f"headrace.{sink}.batches"


def kafka_sink_id(topology: str, sink: str, lane: int = 0) -> str:
    """The ``transactional.id`` of a Kafka sink's producer ``lane`` (its producers take turns), which is
    also the consumer group that lane's ledger commits under; lane 0's is the sink's own name."""
    return f"headrace:{topology}:{sink}" + (f"#{lane}" if lane else "")


def dead_letter_stream(owner: str) -> str:
    """Where a computation (or an injector of a stream) sends what it could not process."""
    return f"{owner}{_DEAD_LETTER}"


def id_prefix(producer: str, batch: int, shard: int | None = None) -> str:
    """Record ids are ``<prefix><n>`` for the n-th record a producer made in a batch (on a shard):
    unique, because a producer commits each (batch, shard) once, and the same on every retry.
    Injectors have no shards: ``inject:queries:7:0``; computations: ``WindowCounter:2:7:1``."""
    return f"{producer}:{batch}:" if shard is None else f"{producer}:{shard}:{batch}:"


def id_sequence(record_id: str) -> int:
    """The n of an id made by ``id_prefix``: the record's place in its producer's batch."""
    return int(record_id.rsplit(":", 1)[1])


class meta:
    """Keys of ``meta`` rows. Rows of a topology's runs (``stop``, ``worker``) carry the topology
    and the run id, so the next driver of the topology removes those of finished runs; the rest
    live as long as what they describe.

    >>> meta.worker("zeitgeist", "ab12", "host:7:task0.0")
    'worker:zeitgeist:ab12:host:7:task0.0'
    >>> meta.parse_worker("worker:zeitgeist:ab12:host:7:task0.0")
    ('zeitgeist', 'ab12', 'host:7:task0.0')
    """

    INSTANCE = "instance"  # the store's random id, made once (Spark checkpoints carry it)
    SCHEMA_VERSION = "schema_version"
    STOP, WORKER, LOAD = "stop:", "worker:", "load:"  # per run: a stop order; a worker's facts; its load
    RUN_SCOPED = (STOP, WORKER, LOAD)

    @staticmethod
    def mode(topology: str) -> str:
        return f"mode:{topology}"

    @staticmethod
    def driver(topology: str) -> str:
        return f"driver:{topology}"

    @staticmethod
    def sink_lease(topology: str, sink: str) -> str:
        """Who writes a Kafka sink, and until when (JSON ``{"owner", "until"}``)."""
        return f"sinklease:{topology}:{sink}"

    @staticmethod
    def topology(name: str) -> str:
        return f"topology:{name}"

    @staticmethod
    def schema(stream: str) -> str:
        return f"schema:{stream}"

    @staticmethod
    def codec(computation: str) -> str:
        """The fingerprint (``codecs.fingerprint``) of the codec a computation's state is in."""
        return f"codec:{computation}"

    @staticmethod
    def fences(computation: str) -> str:
        return f"fences:{computation}"

    @staticmethod
    def layout(computation: str) -> str:
        """The count of intervals live rebalancing chose for a computation, and the count it was declared with."""
        return f"layout:{computation}"

    @staticmethod
    def sink_writer(sink: str) -> str:
        """The sequencer of a Delta or Iceberg sink's current writer (its driver)."""
        return f"sink_writer:{sink}"

    @staticmethod
    def trimmed(stream: str) -> str:
        """What retention forgot of a stream: its window and, per producer, the batches gone."""
        return f"trimmed:{stream}"

    @staticmethod
    def stop(topology: str, run: str) -> str:
        return f"{meta.STOP}{topology}:{run}"

    @staticmethod
    def worker(topology: str, run: str, owner: str = "") -> str:
        return f"{meta.WORKER}{topology}:{run}:{owner}"

    @staticmethod
    def load(topology: str, run: str, owner: str = "") -> str:
        """A worker's last report of what each of its intervals processed (live rebalancing)."""
        return f"{meta.LOAD}{topology}:{run}:{owner}"

    @staticmethod
    def parse_worker(key: str) -> tuple[str, str, str]:
        """(topology, run, owner) of a ``worker`` key."""
        topology, run, owner = key[len(meta.WORKER):].split(":", 2)
        return topology, run, owner

    @staticmethod
    def runs_of(topology: str) -> tuple[str, ...]:
        """The key prefixes of every run-scoped row of ``topology``."""
        return tuple(f"{prefix}{topology}:" for prefix in meta.RUN_SCOPED)


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,127}")  # fullmatch: "$" would let a trailing newline through


def check_name(kind: str, name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise TopologyError(
            f"A {kind} name must be a short identifier (letters, digits, '_', '.', '-'; starting with a letter or '_')",
            got=name,
            hint=f"rename it, e.g. {'window_counts' if kind == 'stream' else 'WindowCounter'!r}",
        )
    return name
