"""A real single-node Kafka broker in KRaft mode (broker + controller in one JVM), on loopback.

Its configuration, data and logs live under `<state>/kafka`. The log directory is formatted once
with a cluster id kept in the state folder, so restarts keep topics and offsets.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

from cgloop.stack.kafka_install import libs_dir
from cgloop.stack.kafka_security import BrokerSecurity, forget_client_record
from cgloop.stack.processes import ManagedProcess

MAIN_CLASS = "kafka.Kafka"
HEAP = "-Xms256m -Xmx768m"

_LOG4J2 = """\
# Kafka's own log goes to stdout, which cgloop writes to <state>/run/kafka.log.
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.apache.name = org.apache.kafka
logger.apache.level = WARN
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
"""


class KafkaBroker:
    def __init__(
        self,
        state_dir: Path,
        cache_dir: Path,
        host: str,
        port: int,
        controller_port: int,
        security: str = "plaintext",
    ) -> None:
        self.state_dir = state_dir
        self.home = state_dir / "kafka"
        self.cache_dir = cache_dir
        self.host, self.port, self.controller_port = host, port, controller_port
        self.process = ManagedProcess("kafka", state_dir / "run")
        # "sasl_ssl": clients must log in over TLS (kafka_security.py); "plaintext": anyone local.
        self.security = (
            BrokerSecurity(self.home, host, port, controller_port)
            if security == "sasl_ssl"
            else None
        )

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def config_file(self) -> Path:
        return self.home / "server.properties"

    def server_properties(self) -> str:
        h = self.host
        listeners = (
            self.security.server_properties()
            if self.security
            else [
                f"listeners=PLAINTEXT://{h}:{self.port},CONTROLLER://{h}:{self.controller_port}",
                f"advertised.listeners=PLAINTEXT://{h}:{self.port}",
                "inter.broker.listener.name=PLAINTEXT",
                "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            ]
        )
        return "\n".join(
            [
                "# Written by cgloop (stack/kafka_broker.py); regenerated at every start.",
                "process.roles=broker,controller",
                "node.id=1",
                f"controller.quorum.voters=1@{h}:{self.controller_port}",
                "controller.listener.names=CONTROLLER",
                *listeners,
                f"log.dirs={self.home / 'data'}",
                "num.partitions=1",
                "auto.create.topics.enable=false",  # topics are created with explicit settings
                "offsets.topic.replication.factor=1",
                "offsets.topic.num.partitions=6",
                "transaction.state.log.replication.factor=1",
                "transaction.state.log.min.isr=1",
                "share.coordinator.state.topic.replication.factor=1",
                "share.coordinator.state.topic.min.isr=1",
                "group.initial.rebalance.delay.ms=0",
                "log.retention.check.interval.ms=60000",
                "",
            ]
        )

    def _java(self) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise RuntimeError(
                "Java is missing: Kafka needs a Java 17+ runtime (openjdk-17-jre-headless)"
            )
        return [
            java,
            *HEAP.split(),
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.home / 'logs'}",
            "-cp",
            f"{libs_dir(self.cache_dir)}/*",
        ]

    def _format(self) -> None:
        """Format the KRaft log dir once (a restart keeps the data)."""
        if (self.home / "data" / "meta.properties").is_file():
            return
        cluster_id_file = self.home / "cluster.id"
        if not cluster_id_file.is_file():
            # Kafka cluster ids are 16 random bytes in URL-safe base64 without padding.
            import base64

            cluster_id_file.write_text(
                base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            )
        cmd = [
            *self._java(),
            "kafka.tools.StorageTool",
            "format",
            "--ignore-formatted",
            # One argument: an id may start with "-" (URL-safe base64), which a separate argument
            # would make the tool's parser read as an option.
            f"--cluster-id={cluster_id_file.read_text().strip()}",
            "-c",
            str(self.config_file),
        ]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(
                f"formatting the Kafka log dir failed:\n{result.stdout}{result.stderr}"
            )

    def start(self) -> int:
        if (pid := self.process.pid()) is not None:
            return pid
        for sub in ("data", "logs"):
            (self.home / sub).mkdir(parents=True, exist_ok=True)
        if self.security:
            self.security.ensure()
        else:
            forget_client_record(self.state_dir)
        # 0600 from creation: with security on, the file holds the broker's passwords.
        self.config_file.unlink(missing_ok=True)
        fd = os.open(self.config_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.server_properties())
        (self.home / "log4j2.properties").write_text(_LOG4J2)
        self._format()
        return self.process.start([*self._java(), MAIN_CLASS, str(self.config_file)])

    def stop(self) -> bool:
        return self.process.stop(timeout_s=30)
