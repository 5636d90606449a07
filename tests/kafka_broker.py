"""A real Apache Kafka broker for the tests: one KRaft node (broker and controller) on 127.0.0.1,
started from the jars ``scripts/ensure-kafka`` caches, one per test session, in a temporary
directory. ``HEADRACE_TEST_KAFKA=host:port`` uses a broker that is already running instead.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

__all__ = ["KafkaBroker", "kafka_jars"]

_REPO = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kafka_jars() -> Path:
    """The directory of the broker's jars (``scripts/ensure-kafka`` fetches them once, then caches)."""
    done = subprocess.run([str(_REPO / "scripts" / "ensure-kafka")], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/ensure-kafka failed: {done.stderr.strip()}")
    return Path(done.stdout.strip().splitlines()[-1])


_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:{cport}
listeners=PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{sport},CONTROLLER://127.0.0.1:{cport}
advertised.listeners=PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{sport}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT
sasl.enabled.mechanisms=PLAIN
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule \
  required username="{user}" password="{password}" user_{user}="{password}";
inter.broker.listener.name=PLAINTEXT
log.dirs={logs}
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=3
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
transaction.abort.timed.out.transaction.cleanup.interval.ms=2000
transaction.remove.expired.transaction.cleanup.interval.ms=5000
"""


SASL_USER, SASL_PASSWORD = "headrace", "headrace-secret"


class KafkaBroker:
    """One broker; ``bootstrap_servers`` once started, and ``sasl_servers``, a listener that asks
    clients for SASL PLAIN (``sasl_config()``; None for a broker this process did not start)."""

    def __init__(self, bootstrap_servers: str | None = None):
        self.bootstrap_servers = bootstrap_servers
        self.sasl_servers: str | None = None
        self.folder: str | None = None
        self.jars: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 90.0) -> "KafkaBroker":
        if self.bootstrap_servers:
            return self
        if shutil.which("java") is None:
            raise RuntimeError("Java was not found; the Kafka broker needs Java 17+: apt-get install -y openjdk-17-jre-headless")
        self.jars = jars = kafka_jars()
        self.folder = tempfile.mkdtemp(prefix="headrace-kafka-")
        port, sport, cport = _free_port(), _free_port(), _free_port()
        config = Path(self.folder) / "server.properties"
        config.write_text(_PROPERTIES.format(port=port, sport=sport, cport=cport, logs=f"{self.folder}/logs",
                                             user=SASL_USER, password=SASL_PASSWORD))
        classpath = f"{jars}/*"
        subprocess.run(["java", "-cp", classpath, "kafka.tools.StorageTool", "format", "--standalone",
                        "-t", _cluster_id(), "-c", str(config)], check=True, capture_output=True)
        self._launch()
        self.bootstrap_servers, self.sasl_servers = f"127.0.0.1:{port}", f"127.0.0.1:{sport}"
        self._wait(timeout)
        self._offsets_ready(timeout)
        return self

    def _offsets_ready(self, timeout: float) -> None:
        """Have the broker create its consumer offsets' topic, which it does at the first group's
        first question, answering NOT_COORDINATOR meanwhile (as a cluster in use never does; the
        sink's start waiting for that is tested on its own)."""
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        deadline = time.monotonic() + timeout
        consumer = Consumer({"bootstrap.servers": self.bootstrap_servers, "group.id": "headrace-test-warmup"})
        try:
            while True:
                try:
                    consumer.committed([TopicPartition("headrace-test-warmup", 0)], timeout=10)
                    return
                except KafkaException:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)  # polling the broker for a state
        finally:
            consumer.close()

    @staticmethod
    def sasl_config() -> dict[str, str]:
        """What a client of ``sasl_servers`` sets."""
        return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": SASL_USER,
                "sasl.password": SASL_PASSWORD}

    def _launch(self) -> None:
        assert self.folder is not None
        with open(f"{self.folder}/server.log", "ab") as log:  # the broker keeps its own copy of the handle
            self.process = subprocess.Popen(
                ["java", "-Xmx512m", "-Xms128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                 "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", f"{self.jars}/*", "kafka.Kafka",
                 f"{self.folder}/server.properties"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def restart(self, timeout: float = 90.0) -> None:
        """SIGKILL the broker, then start it again on its port, from its logs (a broker's host rebooted)."""
        assert self.process is not None, "only a broker this process started can be restarted"
        self.process.kill()
        self.process.wait()
        self._launch()
        self._wait(timeout)

    def _wait(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"the Kafka broker exited ({self.process.returncode}):\n{self.log.read_text()[-4000:]}")
            try:
                admin.list_topics(timeout=2)
                return
            except Exception:
                time.sleep(0.2)
        raise RuntimeError(f"the Kafka broker did not answer within {timeout:.0f} s:\n{self.log.read_text()[-4000:]}")

    @property
    def log(self) -> Path:
        assert self.folder is not None
        return Path(f"{self.folder}/server.log")

    def create_topic(self, name: str | None = None, partitions: int = 1) -> str:
        """Create a topic (a fresh name unless given); its name."""
        from confluent_kafka.admin import AdminClient, NewTopic

        name = name or f"t-{uuid.uuid4().hex[:10]}"
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
        return name

    def add_partitions(self, topic: str, total: int) -> None:
        from confluent_kafka.admin import AdminClient, NewPartitions

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        admin.create_partitions([NewPartitions(topic, total)])[topic].result(30)
        deadline = time.monotonic() + 30
        while len(admin.list_topics(topic, timeout=10).topics[topic].partitions) < total:  # metadata catches up
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {topic} did not show {total} partitions within 30 s")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


def _cluster_id() -> str:
    """A random KRaft cluster id; never one that starts with '-', which StorageTool's argument
    parser takes for an option (1 in 64 of them: a failed CI run on 2026-11-27)."""
    import base64

    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid
