"""Injectors in the driver: a thread per part of a source, a Spark query per streaming DataFrame,
both publishing through ``engine.publish.publish_injected``."""

from __future__ import annotations

import threading
from typing import Any, Callable

from ..engine.publish import publish_injected
from ..engine.routing import RoutingPlan
from ..errors import OptionError
from ..injectors import Injector, RecordsInjector, Several
from ..model import BEGINNING_OF_TIME, END_OF_TIME
from ..schema import StreamSchema
from ..store import open_store
from ..topology import Injection, Topology
from .inject import DataFrameInjector, is_streaming_dataframe

__all__ = ["InjectorThread", "start_injectors"]

RoutingFor = Callable[[frozenset[str]], RoutingPlan]


def _injectors(injection: Injection) -> list[Injector]:
    source = injection.source
    if isinstance(source, Several):
        return source.parts
    if isinstance(source, Injector):
        return [source]
    if isinstance(source, (list, tuple)):
        return [RecordsInjector(list(source))]
    raise OptionError(f"Stream {injection.stream!r} has a source headrace cannot inject", got=source,
                      hint="use a list, injectors.records(...), .generator(...), .files(...), .several(...) "
                           "or a streaming DataFrame")


class InjectorThread(threading.Thread):
    def __init__(self, stream: str, producer: str, injector: Injector, url: str,
                 on_error: Callable[[BaseException], None], schema: StreamSchema | None, plan: RoutingPlan):
        super().__init__(name=f"headrace-{producer}", daemon=True)
        self.stream, self.injector, self.url, self.on_error = stream, injector, url, on_error
        self.schema, self.plan, self.producer = schema, plan, producer
        self.finished = threading.Event()
        self.stopping = threading.Event()
        self.watermark = BEGINNING_OF_TIME
        self.published = 0

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        try:
            store = open_store(self.url)
        except BaseException as exc:  # a store it cannot reach fails the run, as anything after does
            self.on_error(exc)
            return
        try:
            last = store.latest_batch(self.producer)
            batch = last.batch if last else 0
            if last is not None and last.output_watermark == END_OF_TIME:
                self.watermark = END_OF_TIME
                self.finished.set()
                return
            since, plan = batch + 1, None
            resume = store.checkpoint(self.producer)
            journaled = (last.output_watermark if last else BEGINNING_OF_TIME, resume)  # what a batch would change
            for injected in self.injector.batches(resume):
                if self.stopping.is_set():
                    return  # the generator is closed here, on its own thread: its finally releases its part
                if not injected.records and not injected.dead_letters and \
                        (injected.watermark, injected.checkpoint) == journaled:
                    continue  # nothing new (a quiet part shows it is alive): no consumer to wake for it
                batch += 1
                if plan is not self.plan:  # the first batch, or a plan the driver changed (a rescale)
                    plan, since = self.plan, batch
                    if plan.subscribers:
                        store.register_plan(plan.id, plan.routes)
                self.published += publish_injected(store, self.producer, batch, self.stream, injected.records,
                                                   injected.watermark, injected.checkpoint, self.schema, plan,
                                                   since, injected.dead_letters)
                self.watermark = max(self.watermark, injected.watermark)
                journaled = (injected.watermark, injected.checkpoint)
            self.finished.set()
        except BaseException as exc:  # surfaced by the runner's wait loop
            self.on_error(exc)
        finally:
            store.close()


def start_injectors(topology: Topology, url: str, checkpoint_dir: str, trigger_ms: int,
                    on_error: Callable[[BaseException], None],
                    routing: RoutingFor) -> dict[str, "InjectorThread | DataFrameInjector"]:
    """Start every injector of ``topology``: a thread per part, a Spark query per streaming DataFrame."""
    started: dict[str, InjectorThread | DataFrameInjector] = {}
    for stream, injection in topology.injections.items():
        plan = routing(frozenset({stream}))
        if is_streaming_dataframe(injection.source):
            producer = injection.producers[0]
            df_injector = DataFrameInjector(injection, producer, url, checkpoint_dir, trigger_ms,
                                            topology.schemas.get(stream), plan)
            started[producer] = df_injector
            df_injector.start()
            continue
        for producer, injector in zip(injection.producers, _injectors(injection)):
            thread = InjectorThread(stream, producer, injector, url, on_error, topology.schemas.get(stream), plan)
            started[producer] = thread
            thread.start()
    return started
