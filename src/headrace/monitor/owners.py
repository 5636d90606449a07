"""Who a store's computations and streams belong to, and which codec their state is in: checked
when a run starts, before it writes anything (docs/architecture.md §3.6).

A topology is known to the store by its name (its recorded graph, ``graph.py``); a computation's
codec by its fingerprint (``codecs.fingerprint``, in the ``meta`` row ``names.meta.codec``).
Two topologies that share a computation or a stream on one store would fence each other's
writers and mix each other's records; a computation whose codec changed would fail on (or
dead-letter) every key it already holds. Both are refused at start; ``recode_state`` moves a
computation's state from one codec to another.
"""

from __future__ import annotations

from ..codecs import Codec, codec_named, fingerprint
from ..errors import OptionError
from ..names import meta
from ..store import Store, open_store
from ..topology import Topology
from .graph import recorded_graphs

__all__ = ["check_owners", "record_codecs", "recode_state"]


def check_owners(store: Store, topology: Topology) -> None:
    """Refuse to run ``topology`` on ``store`` if another topology recorded there owns one of its
    computations or streams, or if one of its computations holds state in another codec."""
    computations, streams = set(topology.computations), topology.streams()
    for graph in recorded_graphs(store):
        if graph["name"] == topology.name:
            continue
        shared = [f"computation {c!r}" for c in sorted(computations & set(graph["computations"]))]
        shared += [f"stream {s!r}" for s in sorted(streams & set(graph["bus"]))]
        if shared:
            raise OptionError(f"Topology {topology.name!r} cannot run on {store.shown_url}: topology "
                              f"{graph['name']!r} owns its {', '.join(shared)}", got=topology.name,
                              hint=f"rename them in one of the two, or run {topology.name!r} on a store of its own; "
                                   f"if {graph['name']!r} is this topology under an old name, delete the store's meta "
                                   f"row {meta.topology(graph['name'])!r}")
    recorded = store.metas_of([meta.codec(c) for c in computations])
    for name, spec in sorted(topology.computations.items()):
        was, now = recorded.get(meta.codec(name)), fingerprint(spec.options.codec)
        if was is not None and was != now and store.state_keys(name, 1):
            raise OptionError(f"Computation {name!r} holds state in codec {was!r} on {store.shown_url}, and this run "
                              f"gives it codec {now!r}", got=now,
                              hint=f"add it with the codec its state is in, or, with the topology stopped, migrate "
                                   f"its state: headrace.monitor.recode_state(store, {name!r}, old=<codec {was!r}>, "
                                   f"new=<codec {now!r}>)")


def record_codecs(store: Store, topology: Topology) -> None:
    """Remember the codec of each computation's state (after ``check_owners`` let the run start)."""
    for name, spec in topology.computations.items():
        store.put_meta(meta.codec(name), fingerprint(spec.options.codec))


def recode_state(store: str, computation: str, old: str | Codec, new: str | Codec) -> int:
    """Re-encode every key's state of ``computation`` from codec ``old`` to codec ``new``, in one
    transaction, and record ``new`` as its codec; how many keys. Run it while the topology is
    stopped (a running writer's next commit would write its keys in the old codec). ``old`` must
    be the codec the store recorded: decoding with it may run code (pickle: docs/security.md)."""
    was, now = codec_named(old), codec_named(new)
    db = open_store(store)
    try:
        recorded = db.get_meta(meta.codec(computation))
        if recorded is not None and recorded != fingerprint(was):
            raise OptionError(f"Computation {computation!r} holds state in codec {recorded!r}, not the old codec given",
                              got=fingerprint(was), hint=f"pass old= the codec {recorded!r}")
        count = db.recode_state(computation, lambda raw: now.encode(was.decode(raw)))
        db.put_meta(meta.codec(computation), fingerprint(now))
        return count
    finally:
        db.close()
