"""A Kafka sink's lane (spark/kafka_lanes.py) leaves its librdkafka handles to its own thread: the
writer that closes it must never run their destroy, which may wait on a broker."""

from __future__ import annotations

import gc
import queue
import threading
from typing import Iterator

import pytest

from headrace.spark.kafka_lanes import Lane

THREAD = "headrace-kafka-topology.sink.0"


class Handle(dict[str, str]):
    """Stands in for a librdkafka handle: notes the thread its last reference went on, where
    confluent-kafka runs ``rd_kafka_destroy``. A dict, so that its ``pop`` fails in C, as
    confluent-kafka's calls do (a Python method's frame in the traceback would hold it)."""

    def __init__(self, gone: "queue.SimpleQueue[str]"):
        super().__init__()
        self.gone = gone

    def close(self) -> None:
        pass

    def __del__(self) -> None:
        self.gone.put(threading.current_thread().name)


@pytest.fixture
def no_collector() -> Iterator[None]:
    """Only reference counts free objects: one kept by a cycle would stay."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_closed_lane_destroys_its_handles_on_its_own_thread_after_the_call_stuck_there() -> None:
    gone: queue.SimpleQueue[str] = queue.SimpleQueue()
    lane = Lane("topology.sink.0")
    lane.producer, lane.group = Handle(gone), Handle(gone)
    started, release = threading.Event(), threading.Event()

    def stuck() -> None:  # a transactional call that does not return while the broker is away
        started.set()
        release.wait()

    caller = threading.Thread(target=lane.within, args=(stuck,), daemon=True)
    caller.start()
    assert started.wait(10)
    lane.close()  # returns at once: nothing of it waits for the stuck call
    del lane
    assert gone.empty(), "a handle was destroyed while its lane's thread was still inside a call"
    release.set()
    caller.join(10)
    assert [gone.get(timeout=10), gone.get(timeout=10)] == [THREAD] * 2


def test_a_failed_call_leaves_no_cycle_holding_the_producer(no_collector: None) -> None:
    """A failed transactional call's traceback (kept with its future, in a cycle) held the frames
    that held the producer: the collector then destroyed it on whatever thread it ran."""
    gone: queue.SimpleQueue[str] = queue.SimpleQueue()
    lane = Lane("topology.sink.0")
    lane.producer, lane.group = Handle(gone), Handle(gone)
    with pytest.raises(KeyError):
        lane.within(lane.producer.pop, "no such key")
    lane.close()
    del lane
    assert [gone.get(timeout=10), gone.get(timeout=10)] == [THREAD] * 2


def test_an_idle_lane_thread_holds_no_handle_and_ends_with_a_lane_dropped_unclosed(no_collector: None) -> None:
    """A writer that dies without closing its lanes (a test's stand-in for a SIGKILL) left each
    lane's thread waiting for good with its last call, and so its producer, in hand."""
    gone: queue.SimpleQueue[str] = queue.SimpleQueue()
    lane = Lane("idle.sink.0")
    lane.producer = Handle(gone)
    assert lane.within(lane.producer.get, "no such key") is None
    lane.within(int)  # once its thread took this call, it let the one before go
    thread = next(t for t in threading.enumerate() if t.name == "headrace-kafka-idle.sink.0")
    lane.producer = None
    assert gone.get_nowait() == "MainThread"  # its only reference was the lane's
    del lane
    thread.join(10)
    assert not thread.is_alive()
