"""The Kafka sink's writer against a real broker: exactly once through restarts, its ledger in the
Kafka transaction, and a zombie writer (paused past its lease, then resumed) that cannot commit."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from headrace.errors import FencedWriterError, HeadraceError, OptionError
from headrace.names import meta
from headrace.spark.kafka_lanes import decode_ledger, transient
from headrace.spark.kafka_sink import KafkaSinkWriter
from headrace.store import open_store

from .sink_writer import STREAM, TOPOLOGY, spec
from .sinks import exactly_once, publish, read_topic

WRITER = Path(__file__).with_name("sink_writer.py")


def writer(store_url: str, topic: str, broker: Any, lease_ms: int = 1_000) -> KafkaSinkWriter:
    return KafkaSinkWriter(TOPOLOGY, spec(topic, broker.bootstrap_servers, lease_ms), store_url)


def opened(w: KafkaSinkWriter) -> KafkaSinkWriter:
    """``w.open()``, tried again as the driver's sink thread does while a fresh broker's group
    coordinator loads (test_the_driver_thread_waits_for_a_broker_that_cannot_read_its_ledger_yet)."""
    from headrace.spark.kafka_sink import KafkaCommitError

    for _ in range(20):
        try:
            return w.reopen() if w.broken else w.open()
        except KafkaCommitError:
            w.broken = True
            time.sleep(0.5)
    return w.reopen()


def drain(w: KafkaSinkWriter) -> None:
    while w.write_once(refresh=True):
        pass


def test_records_reach_a_read_committed_consumer_once_with_their_ids(kafka_broker: Any, tmp_path: Path) -> None:
    store_url, topic = f"sqlite:///{tmp_path}/store.db", kafka_broker.create_topic(partitions=3)
    ids = publish(store_url, STREAM, range(1, 4), per_batch=20)
    w = writer(store_url, topic, kafka_broker).open()
    drain(w)
    assert w.positions == {"inject:things": 3}
    messages = read_topic(kafka_broker.bootstrap_servers, topic)
    assert exactly_once(messages, ids) is None
    assert all(m.key == m.headers["headrace.id"] for m in messages)  # key='id': the record id
    assert sorted(json.loads(m.value)["n"] for m in messages) == list(range(20, 80))
    assert {m.partition for m in messages} == {0, 1, 2}
    # the writer goes away without a word (as a SIGKILL would); the next resumes from the ledger in Kafka
    ids += publish(store_url, STREAM, range(4, 6), per_batch=20)
    w2 = writer(store_url, topic, kafka_broker).open()
    assert w2.positions == {"inject:things": 3} and w2.sequence == w.sequence
    drain(w2)
    assert exactly_once(read_topic(kafka_broker.bootstrap_servers, topic), ids) is None
    w2.close()
    w.close()


@pytest.mark.parametrize("lane", [0, 1])
def test_a_writer_killed_inside_its_commit_leaves_nothing_or_everything(kafka_broker: Any, tmp_path: Path,
                                                                        lane: int) -> None:
    """SIGKILL at the sink_commit failpoint (records and ledger sent, not committed), on either
    lane: the next writer aborts that transaction (init_transactions) and writes the batches
    again, once."""
    store_url, topic = f"sqlite:///{tmp_path}/store.db", kafka_broker.create_topic(partitions=2)
    ids = publish(store_url, STREAM, range(1, 2), per_batch=10)
    if lane:  # a writer that committed one transaction, on lane 0: the killed one's is on lane 1
        before = writer(store_url, topic, kafka_broker).open()
        before.write_once(refresh=True)
        before.close()
    ids += publish(store_url, STREAM, range(2, 3), per_batch=10)
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = start_writer(store_url, topic, kafka_broker, lease_ms=500, failpoint=f"sink_commit=sleep:30000:{marks}")
    wait_for(lambda: any(marks.iterdir()), "the writer inside its commit")
    proc.kill()
    proc.wait()
    w = writer(store_url, topic, kafka_broker).open()
    assert w.positions == ({"inject:things": 1} if lane else {})  # the killed transaction's ledger never committed
    assert w.sequence == lane
    drain(w)
    assert exactly_once(read_topic(kafka_broker.bootstrap_servers, topic), ids) is None
    w.close()


def test_its_two_producers_take_turns_and_the_latest_ledger_is_its_position(kafka_broker: Any,
                                                                           tmp_path: Path) -> None:
    store_url, topic = f"sqlite:///{tmp_path}/store.db", kafka_broker.create_topic(partitions=3)
    w, ids = writer(store_url, topic, kafka_broker).open(), []
    for b in range(1, 6):  # a transaction a batch: lane 0 writes batches 1, 3 and 5, lane 1 batches 2 and 4
        ids += publish(store_url, STREAM, range(b, b + 1), per_batch=12)
        assert w.write_once(refresh=True) == 12
    assert [lane.txn_id for lane in w.lanes] == [f"headrace:{TOPOLOGY}:out", f"headrace:{TOPOLOGY}:out#1"]
    assert [lane.ledger(topic)[:2] for lane in w.lanes] == [({"inject:things": 5}, 5), ({"inject:things": 4}, 4)]
    messages = read_topic(kafka_broker.bootstrap_servers, topic)
    assert exactly_once(messages, ids) is None
    for partition in range(3):  # the lanes' transactions commit one after the other: batch order holds
        batches = [int(m.headers["headrace.id"].split(b":")[2]) for m in messages if m.partition == partition]
        assert batches == sorted(batches) and batches
    w.close()
    successor = writer(store_url, topic, kafka_broker).open()
    assert successor.positions == {"inject:things": 5} and successor.sequence == 5
    ids += publish(store_url, STREAM, range(6, 7), per_batch=12)
    drain(successor)
    assert [lane.ledger(topic)[1] for lane in successor.lanes] == [5, 6]
    assert exactly_once(read_topic(kafka_broker.bootstrap_servers, topic), ids) is None
    successor.close()
    third = writer(store_url, topic, kafka_broker).open()  # the latest ledger is lane 1's now
    assert third.positions == {"inject:things": 6} and third.sequence == 6
    third.close()


@pytest.mark.parametrize("lane", [0, 1])
def test_a_zombie_writer_paused_past_its_lease_cannot_commit(kafka_broker: Any, tmp_path: Path, lane: int) -> None:
    store_url, topic = f"sqlite:///{tmp_path}/store.db", kafka_broker.create_topic(partitions=2)
    ids = publish(store_url, STREAM, range(1, 2), per_batch=10)
    if lane:  # a writer that committed one transaction, on lane 0: the zombie's is on lane 1
        before = writer(store_url, topic, kafka_broker).open()
        before.write_once(refresh=True)
        before.close()
    ids += publish(store_url, STREAM, range(2, 4), per_batch=10)
    marks = tmp_path / "marks"
    marks.mkdir()
    zombie = start_writer(store_url, topic, kafka_broker, lease_ms=1_000,
                          failpoint=f"sink_commit=sleep:2000:{marks}")
    wait_for(lambda: any(marks.iterdir()), "the first writer inside its commit")
    zombie.send_signal(signal.SIGSTOP)  # its transaction holds what it had not written, uncommitted
    try:
        store = open_store(store_url)
        lease = json.loads(store.get_meta(meta.sink_lease(TOPOLOGY, "out")) or "{}")
        wait_for(lambda: store.now() > lease["until"], "the paused writer's lease to run out")
        store.close()
        ids += publish(store_url, STREAM, range(4, 6), per_batch=10)
        successor = writer(store_url, topic, kafka_broker).open()  # takes the lease, fences the zombie's epoch
        assert successor.owner != lease["owner"]
        drain(successor)
    finally:
        zombie.send_signal(signal.SIGCONT)
    _, err = zombie.communicate(timeout=60)
    assert zombie.returncode == 3, err
    assert f"Kafka fenced the writer of sink 'out': a newer writer took its transactional.id " \
           f"'headrace:{TOPOLOGY}:out{'#1' if lane else ''}'" in err
    assert exactly_once(read_topic(kafka_broker.bootstrap_servers, topic), ids) is None
    assert successor.ledger()[0] == {"inject:things": 5}
    successor.close()


def test_a_transaction_older_than_its_timeout_is_written_again_by_the_same_writer(kafka_broker: Any,
                                                                                   tmp_path: Path) -> None:
    """The broker aborts a transaction older than ``transaction.timeout.ms`` and librdkafka reports
    the producer fenced; the writer still holds its lease, so it starts its producers again."""
    from headrace.spark.kafka_sink import SINK_COMMIT, KafkaCommitError

    store_url, topic = f"sqlite:///{tmp_path}/store.db", kafka_broker.create_topic(partitions=2)
    ids = publish(store_url, STREAM, range(1, 3), per_batch=10)
    # the sink owns transaction.timeout.ms (librdkafka's 60 s, past its calls' 31 s: a driver paused a minute
    # outlives it); 2 s here, so that the test need not wait a minute
    sink = spec(topic, kafka_broker.bootstrap_servers, 60_000)
    assert sink.kafka is not None
    sink = replace(sink, kafka=replace(sink.kafka, config={"transaction.timeout.ms": 2_000}))
    w = opened(KafkaSinkWriter(TOPOLOGY, sink, store_url))
    held: list[str] = []

    def hold_once(step: str) -> None:  # the tests' broker looks for timed-out transactions every 2 s
        if step == SINK_COMMIT and not held:
            held.append(step)
            time.sleep(6.5)

    w.failpoint = hold_once
    with pytest.raises(KafkaCommitError, match=r"^Kafka fenced the transactional producer 'headrace:sinktest:out' of "
                                               r"sink 'out', and the sink's lease is still its own \(got .+\)\. "
                                               r"Hint: the broker aborted a transaction older than its "
                                               r"transaction\.timeout\.ms \(a driver paused that long\); nothing of "
                                               r"it was committed"):
        w.write_once(refresh=True)
    assert held and w.broken and w.positions == {}
    assert read_topic(kafka_broker.bootstrap_servers, topic) == []
    ids += publish(store_url, STREAM, range(3, 5), per_batch=10)
    for _ in range(3):  # starts its producers again first
        try:
            drain(w)
            break
        except KafkaCommitError:  # a commit slower than this test's 2 s on a busy machine: it goes again
            pass
    assert not w.broken and w.positions == {"inject:things": 4}
    assert exactly_once(read_topic(kafka_broker.bootstrap_servers, topic), ids) is None
    w.close()


def test_a_fence_stops_a_writer_without_its_lease_or_fenced_a_fourth_time_in_ten_minutes(tmp_path: Path) -> None:
    """No broker: ``_fenced`` weighs a fence against the store's lease and the writer's budget."""
    from confluent_kafka import KafkaError

    from headrace.errors import HeadraceError
    from headrace.spark.kafka_sink import KafkaCommitError

    w = KafkaSinkWriter(TOPOLOGY, spec("out-topic", "127.0.0.1:9", 60_000), f"sqlite:///{tmp_path}/store.db")
    fence = KafkaError(KafkaError._FENCED, "This instance has been fenced by a newer instance", fatal=True)
    assert isinstance(w._fenced(w.lanes[0], fence), FencedWriterError)  # no lease: another writer took and left it
    w._put_lease(w.store.now())
    assert [type(w._fenced(w.lanes[0], fence)) for _ in range(3)] == [KafkaCommitError] * 3
    fourth = w._fenced(w.lanes[1], fence)
    assert type(fourth) is HeadraceError
    assert str(fourth).startswith("Kafka fenced the writer of sink 'out' 4 times in 10 minutes with its lease its own "
                                 "(got 'This instance has been fenced by a newer instance'). Hint: its transactions "
                                 "outlive the producers' transaction.timeout.ms, or a driver on another store runs a "
                                 "topology of the same name")
    other = KafkaSinkWriter(TOPOLOGY, spec("out-topic", "127.0.0.1:9", 60_000), f"sqlite:///{tmp_path}/store.db")
    other._put_lease(other.store.now())
    assert isinstance(w._fenced(w.lanes[0], fence), FencedWriterError)
    w.close()
    other.close()


def test_a_topic_that_does_not_exist_is_named_before_anything_is_fenced(kafka_broker: Any, tmp_path: Path) -> None:
    w = writer(f"sqlite:///{tmp_path}/store.db", "no-such-topic", kafka_broker)
    with pytest.raises(OptionError, match=r"^Kafka topic 'no-such-topic' of sink 'out' was not found .*"
                                          r"create the topic first"):
        w.open()
    assert all(lane.group is None for lane in w.lanes)  # no lane got as far as init_transactions
    w.close()


def test_a_live_writer_holds_its_lease_against_a_second(kafka_broker: Any, tmp_path: Path) -> None:
    store_url, topic = f"sqlite:///{tmp_path}/store.db", kafka_broker.create_topic()
    first = writer(store_url, topic, kafka_broker, lease_ms=60_000).open()
    second = writer(store_url, topic, kafka_broker, lease_ms=60_000)
    second._put_lease(second.store.now())  # a writer that took the lease without waiting (a race)
    with pytest.raises(FencedWriterError, match="The Kafka sink 'out' lost its lease to another writer"):
        first.lease_until = 0  # due for renewal
        first.write_once()
    first.close()
    second.close()


def test_the_ledger_round_trips_with_its_store_and_reads_one_from_before_it_named_it() -> None:
    import base64
    import zlib

    from headrace.spark.kafka_lanes import encode_ledger, ledger_store

    positions = {f"Stage/{i}": i * 7 for i in range(64)}
    assert decode_ledger(encode_ledger(positions, "s1")) == positions and decode_ledger(None) == {}
    assert ledger_store(encode_ledger(positions, "s1")) == "s1" and ledger_store(None) is None
    older = base64.b64encode(zlib.compress(json.dumps(positions).encode())).decode()
    assert decode_ledger(older) == positions and ledger_store(older) is None


def refusal(ids: str, got: str, nothing: str = "fenced or written") -> str:
    return re.escape(f"The ledger of Kafka sink 'out' in Kafka is another store's (got {got}). Hint: give this "
                     f"topology another name (the sink's transactional ids {ids} are made of the topology's and the "
                     f"sink's names); or, if this store replaced the one that wrote the topic, delete the consumer "
                     f"groups {ids} (kafka-consumer-groups --delete --group ID) to start the ledger over; nothing was "
                     f"{nothing}")


IDS = "'headrace:sinktest:out', 'headrace:sinktest:out#1'"


def test_a_ledger_of_another_store_is_refused_before_anything_is_fenced(kafka_broker: Any, tmp_path: Path) -> None:
    """Two stores running a topology of the same name into one cluster share the sink's
    transactional ids: the second fenced the first, and read its ledger as its own positions (and
    skipped as many of its own batches). Now it refuses, and the first writes on."""
    topic = kafka_broker.create_topic()
    staging, production = f"sqlite:///{tmp_path}/staging.db", f"sqlite:///{tmp_path}/production.db"
    ids = publish(production, STREAM, range(1, 3), per_batch=5)
    first = opened(writer(production, topic, kafka_broker))
    drain(first)
    second = writer(staging, topic, kafka_broker)
    with pytest.raises(HeadraceError, match="^" + refusal(IDS, f"a ledger of store {first.store_id}; this store is "
                                                               f"{second.store_id}") + "$"):
        second.open()
    assert all(lane.group is None for lane in second.lanes)  # a lane's group is made once it fenced
    second.close()
    for b in (3, 4):  # on both lanes: neither was fenced
        ids += publish(production, STREAM, range(b, b + 1), per_batch=5)
        assert first.write_once() == 5
    assert exactly_once(read_topic(kafka_broker.bootstrap_servers, topic), ids) is None
    first.close()


def test_a_ledger_from_before_ledgers_named_their_store_is_this_stores_if_it_journaled_its_batches(
        kafka_broker: Any, tmp_path: Path, monkeypatch: Any) -> None:
    import base64
    import zlib

    from headrace.spark import kafka_sink

    def older(positions: dict[str, int], store: str) -> str:  # the ledger as headrace wrote it before
        return base64.b64encode(zlib.compress(json.dumps(positions).encode())).decode()

    topic = kafka_broker.create_topic()
    staging, production = f"sqlite:///{tmp_path}/staging.db", f"sqlite:///{tmp_path}/production.db"
    ids = publish(production, STREAM, range(1, 4), per_batch=5)
    publish(staging, STREAM, range(1, 2), per_batch=5)
    with monkeypatch.context() as patched:
        patched.setattr(kafka_sink, "encode_ledger", older)
        first = opened(writer(production, topic, kafka_broker))
        drain(first)
        first.close()
    with pytest.raises(HeadraceError, match="^" + refusal(IDS, "a ledger at batch 3 of 'inject:things', which this "
                                                               "store journaled to batch 1") + "$"):
        refused = writer(staging, topic, kafka_broker)
        refused.open()
    refused.close()
    again = opened(writer(production, topic, kafka_broker))  # its own: it journaled those batches
    assert again.positions == {"inject:things": 3}
    ids += publish(production, STREAM, range(4, 5), per_batch=5)
    drain(again)
    again.close()
    assert exactly_once(read_topic(kafka_broker.bootstrap_servers, topic), ids) is None


def start_writer(store_url: str, topic: str, broker: Any, lease_ms: int, failpoint: str) -> subprocess.Popen[str]:
    env = {**os.environ, "HEADRACE_FAILPOINTS": failpoint}
    return subprocess.Popen([sys.executable, str(WRITER), store_url, topic, broker.bootstrap_servers, str(lease_ms)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_for(condition: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}"
        time.sleep(0.01)


def test_the_driver_thread_flushes_reports_its_positions_and_releases_its_lease(kafka_broker: Any,
                                                                              tmp_path: Path) -> None:
    from headrace.spark.kafka_sink import KafkaSink

    store_url, topic = f"sqlite:///{tmp_path}/store.db", kafka_broker.create_topic(partitions=2)
    ids = publish(store_url, STREAM, range(1, 3), per_batch=15)
    sink = KafkaSink(TOPOLOGY, spec(topic, kafka_broker.bootstrap_servers, 60_000), store_url).start()
    ids += publish(store_url, STREAM, range(3, 5), per_batch=15)
    sink.flush()
    assert sink.written() == {"inject:things": 4}
    sink.check()
    sink.stop()
    assert exactly_once(read_topic(kafka_broker.bootstrap_servers, topic), ids) is None
    store = open_store(store_url)
    assert store.get_meta(meta.sink_lease(TOPOLOGY, "out")) is None  # released: the next writer need not wait 60 s
    store.close()
    began = time.monotonic()
    nxt = writer(store_url, topic, kafka_broker, lease_ms=60_000).open()
    assert time.monotonic() - began < 30 and nxt.positions == {"inject:things": 4}
    nxt.close()


def test_the_driver_thread_waits_for_a_broker_that_cannot_read_its_ledger_yet(kafka_broker: Any, tmp_path: Path,
                                                                             capfd: Any) -> None:
    """A broker just started answered the ledger's read NOT_COORDINATOR (its offsets' coordinator
    still loading) in one start of three here: the sink's start is tried again, not the run failed."""
    from confluent_kafka import KafkaError, KafkaException

    from headrace.spark.kafka_sink import KafkaCommitError, KafkaSink

    store_url, topic = f"sqlite:///{tmp_path}/store.db", kafka_broker.create_topic(partitions=2)
    ids = publish(store_url, STREAM, range(1, 3), per_batch=15)
    sink = KafkaSink(TOPOLOGY, spec(topic, kafka_broker.bootstrap_servers, 60_000), store_url)
    start_lanes, refused = sink.writer._start_lanes, []

    def not_served_yet() -> KafkaSinkWriter:
        if not refused:
            refused.append(True)
            raise KafkaCommitError("Kafka sink 'out' could not reach its brokers",
                                   got="Failed to get committed offsets: Broker: Not coordinator",
                                   hint="check the brokers; nothing was written") from KafkaException(
                KafkaError(KafkaError.NOT_COORDINATOR, "Failed to get committed offsets: Broker: Not coordinator"))
        return start_lanes()

    sink.writer._start_lanes = not_served_yet  # type: ignore[method-assign]
    sink.start()
    sink.flush()
    sink.check()
    assert refused and sink.written() == {"inject:things": 2}
    sink.stop()
    assert exactly_once(read_topic(kafka_broker.bootstrap_servers, topic), ids) is None
    assert ("headrace: Kafka sink 'out' could not reach its brokers (got 'Failed to get committed offsets: Broker: "
            "Not coordinator'). Hint: check the brokers; nothing was written; the Kafka sink starts its producers "
            "again in 0.5 s") in capfd.readouterr().err


def test_the_driver_thread_fails_the_run_when_its_start_meets_a_broker_away(kafka_broker: Any,
                                                                            tmp_path: Path) -> None:
    """A broker away at the start (a wrong address, say: the topic's metadata not read in 30 s) is
    not waited for: the run stops, saying why."""
    from confluent_kafka import KafkaError, KafkaException

    from headrace.spark.kafka_sink import KafkaCommitError, KafkaSink

    store_url, topic = f"sqlite:///{tmp_path}/store.db", kafka_broker.create_topic()
    sink = KafkaSink(TOPOLOGY, spec(topic, kafka_broker.bootstrap_servers, 60_000), store_url)

    def away() -> KafkaSinkWriter:
        raise KafkaCommitError("Kafka sink 'out' could not reach its brokers", got="Local: Timed out",
                               hint="check the brokers; nothing was written") from KafkaException(
            KafkaError(KafkaError._TIMED_OUT, "Local: Timed out"))

    sink.writer._start_lanes = away  # type: ignore[method-assign]
    sink.start()
    with pytest.raises(KafkaCommitError, match=r"^Kafka sink 'out' could not reach its brokers \(got 'Local: Timed "
                                               r"out'\)\. Hint: check the brokers; nothing was written$"):
        sink.flush()
    assert sink.written() is None
    sink.stop()


def test_a_broker_away_is_transient_and_a_refusal_or_a_fence_is_not() -> None:
    """``KafkaSink`` starts its producers again after a transient error; a fence is weighed against
    the sink's lease (``_fenced``, above); anything else stops the run."""
    from confluent_kafka import KafkaError

    for code in (KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
                 KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS):
        assert transient(KafkaError(code)), code
    for code in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                 KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.PRODUCER_FENCED):
        assert not transient(KafkaError(code)), code
    assert not transient(KafkaError(KafkaError._TIMED_OUT, fatal=True))


def test_a_sink_on_a_listener_that_asks_for_sasl_reads_its_ledgers_with_its_config(kafka_broker: Any,
                                                                                  tmp_path: Path) -> None:
    """The sink's ``config=`` (here SASL PLAIN's) reaches the consumers its ledgers are read
    through, not only its producers: they connected without it, and a sink on a cluster that asks
    for SASL (or TLS) never started."""
    from headrace.sinkspec import parse_sink

    if kafka_broker.sasl_servers is None:
        pytest.skip("HEADRACE_TEST_KAFKA names a broker without the tests' SASL listener")
    store_url, topic = f"sqlite:///{tmp_path}/store.db", kafka_broker.create_topic()
    ids = publish(store_url, STREAM, range(1, 3), per_batch=5)
    sink = parse_sink(STREAM, "out", {"kafka": topic, "bootstrap_servers": kafka_broker.sasl_servers,
                                      "config": kafka_broker.sasl_config()})
    w = KafkaSinkWriter(TOPOLOGY, sink, store_url).open()
    drain(w)
    w.close()
    assert exactly_once(read_topic(kafka_broker.bootstrap_servers, topic), ids) is None
