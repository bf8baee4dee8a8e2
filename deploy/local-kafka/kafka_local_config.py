"""Files of the local broker: the jars resolved once from Maven, server.properties and log config.

Guarantee: the jar cache is either complete for the current pom.xml or rebuilt under a lock.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger("cairn.local_kafka")

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
POM = HERE / "pom.xml"
DEFAULT_LIB_DIR = HERE / "lib"
DEFAULT_DATA_DIR = REPO_ROOT / ".kafka"


# Internal topics need one replica and an ISR of one, or groups and transactions never come up.
BASE_PROPERTIES: Mapping[str, str] = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
    "num.partitions": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "10",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "10",
    "group.initial.rebalance.delay.ms": "0",
    # Kafka's floor is 6 s; the tests run their services at 3 s, so a killed member's partitions
    # move sooner. A service's own setting (6 s by default) is not changed by it.
    "group.min.session.timeout.ms": "1000",
    # The log cleaner looks for work every second instead of every 15: compaction that a topic's
    # own settings make due happens about when it is due.
    "log.cleaner.backoff.ms": "1000",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "auto.create.topics.enable": "false",
    "delete.topic.enable": "true",
    # After a crash the old registration blocks the restarted node until this session expires.
    "broker.heartbeat.interval.ms": "500",
    "broker.session.timeout.ms": "3000",
}

LOG4J2_XML = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <Console name="stdout" target="SYSTEM_OUT">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </Console>
  </Appenders>
  <Loggers>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Logger name="state.change.logger" level="WARN"/>
    <Logger name="org.apache.kafka.storage.internals.log" level="WARN"/>
    <Logger name="kafka.authorizer.logger" level="{authorizer_level}"/>
    <Root level="INFO"><AppenderRef ref="stdout"/></Root>
  </Loggers>
</Configuration>
"""


class BrokerError(RuntimeError):
    """The broker could not be prepared, started, stopped or reached; the message says why."""


SCRAM_MECHANISM = "SCRAM-SHA-512"
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


@dataclass(frozen=True)
class BrokerSecurity:
    """Authenticated listeners in place of the plaintext one: SASL_PLAINTEXT on the broker's port
    and SASL_SSL on ``ssl_port``, both SCRAM-SHA-512, and SSL with client certificates on
    ``mtls_port`` (the principal is the certificate's CN: ``CN=cairn,...`` is ``User:cairn``),
    with the StandardAuthorizer denying what no ACL allows.

    The broker talks to itself over SASL_PLAINTEXT as ``broker_user``; the controller listener
    stays plaintext on loopback, so its principal ``User:ANONYMOUS`` is a super user (KRaft
    authorizes broker registrations and heartbeats there), like ``broker_user`` and
    ``admin_user``. The SCRAM users (``users``: name -> password) are written into the metadata
    when storage is formatted, so they exist before the first client connects.
    """

    ssl_port: int
    mtls_port: int
    keystore_pem: Path
    """The broker's private key (PKCS#8, unencrypted) followed by its certificate chain."""
    truststore_pem: Path
    """The CA whose client certificates the SSL listener accepts."""
    users: Mapping[str, str]
    broker_user: str = "broker"
    admin_user: str = "admin"
    log_authorizations: bool = False
    """Log every authorization decision (``kafka.authorizer.logger`` at DEBUG: allowed ones
    too), so a test can list what each principal was allowed and denied."""

    def __post_init__(self) -> None:
        for user in (self.broker_user, self.admin_user):
            if user not in self.users:
                raise BrokerError(f"user=<{user}> | needs a SCRAM password in users")

    @property
    def super_users(self) -> str:
        return ";".join(f"User:{u}" for u in ("ANONYMOUS", self.broker_user, self.admin_user))

    def scram_login(self, user: str) -> str:
        password = self.users[user]
        return (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{user}" password="{password}";'
        )

    def admin_client_options(self) -> dict[str, str]:
        """aiokafka options of the admin user on the SASL_PLAINTEXT listener."""
        return {
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": SCRAM_MECHANISM,
            "sasl_plain_username": self.admin_user,
            "sasl_plain_password": self.users[self.admin_user],
        }

    def properties(self, host: str, port: int, controller_port: int) -> dict[str, str]:
        login = self.scram_login(self.broker_user)
        return {
            "listeners": (
                f"SASL_PLAINTEXT://{host}:{port},SASL_SSL://{host}:{self.ssl_port},"
                f"SSL://{host}:{self.mtls_port},CONTROLLER://{host}:{controller_port}"
            ),
            "advertised.listeners": (
                f"SASL_PLAINTEXT://{host}:{port},SASL_SSL://{host}:{self.ssl_port},"
                f"SSL://{host}:{self.mtls_port}"
            ),
            "listener.security.protocol.map": (
                "CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL"
            ),
            "inter.broker.listener.name": "SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
            "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": login,
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": login,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore_pem),
            "ssl.client.auth": "none",
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.truststore_pem),
            "listener.name.ssl.ssl.client.auth": "required",
            "ssl.principal.mapping.rules": "RULE:^CN=([^,]+).*$/$1/,DEFAULT",
            "authorizer.class.name": STANDARD_AUTHORIZER,
            "allow.everyone.if.no.acl.found": "false",
            "super.users": self.super_users,
        }

    def format_arguments(self) -> list[str]:
        """``kafka-storage format`` arguments creating every SCRAM user."""
        arguments: list[str] = []
        for user, password in sorted(self.users.items()):
            arguments += ["--add-scram", f"{SCRAM_MECHANISM}=[name={user},password={password}]"]
        return arguments


@dataclass(frozen=True)
class BrokerConfig:
    """Where one broker keeps its files and which loopback ports it listens on."""

    data_dir: Path = DEFAULT_DATA_DIR
    port: int = 9092
    controller_port: int = 9093
    host: str = "127.0.0.1"
    heap: str = "512m"
    lib_dir: Path = DEFAULT_LIB_DIR
    java: str = "java"
    mvn: str = "mvn"
    die_with_parent: bool = False
    extra_properties: Mapping[str, str] = field(default_factory=dict)
    security: BrokerSecurity | None = None
    """Authenticated listeners and ACLs instead of the plaintext listener (tests only)."""

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def ports(self) -> tuple[int, ...]:
        """Every port the broker binds."""
        security = self.security
        extra = () if security is None else (security.ssl_port, security.mtls_port)
        return (self.port, self.controller_port, *extra)

    @property
    def client_options(self) -> dict[str, str]:
        """aiokafka connection options (beyond the bootstrap) of a client allowed everything."""
        return {} if self.security is None else self.security.admin_client_options()

    def log4j_xml(self) -> str:
        audit = self.security is not None and self.security.log_authorizations
        return LOG4J2_XML.replace("{authorizer_level}", "DEBUG" if audit else "INFO")

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "kafka.pid"

    @property
    def output_file(self) -> Path:
        return self.data_dir / "kafka.out"

    @property
    def properties_file(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def log4j_file(self) -> Path:
        return self.data_dir / "log4j2.xml"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "log"

    @property
    def formatted_for_file(self) -> Path:
        return self.data_dir / "formatted-for"

    def properties(self) -> dict[str, str]:
        props = dict(BASE_PROPERTIES)
        props.update(
            {
                "listeners": (
                    f"PLAINTEXT://{self.host}:{self.port},"
                    f"CONTROLLER://{self.host}:{self.controller_port}"
                ),
                "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
                "controller.quorum.bootstrap.servers": f"{self.host}:{self.controller_port}",
                "log.dirs": str(self.log_dir),
            }
        )
        if self.security is not None:
            props.update(self.security.properties(self.host, self.port, self.controller_port))
        props.update(self.extra_properties)
        return props


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


def ensure_jars(lib_dir: Path = DEFAULT_LIB_DIR, *, mvn: str = "mvn") -> Path:
    """Copies the broker's jars from Maven once; concurrent callers wait for the first one."""
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()
    marker = lib_dir / ".complete"
    if read_text(marker) == digest:
        return lib_dir
    work_dir = HERE / "target"
    with file_lock(work_dir / "lib.lock"):
        if read_text(marker) == digest:
            return lib_dir
        if shutil.which(mvn) is None:
            raise BrokerError(f"maven=<{mvn}> | not found: install Maven to fetch the Kafka jars")
        staging = work_dir / f"lib.partial-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        logger.info("pom=<%s> | resolving kafka jars with maven", POM)
        command = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(POM),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}",
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not any(staging.glob("kafka_2.13-*.jar")):
            tail = (done.stdout + done.stderr).strip().splitlines()[-20:]
            raise BrokerError("maven could not resolve the kafka jars:\n" + "\n".join(tail))
        shutil.rmtree(lib_dir, ignore_errors=True)
        lib_dir.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(lib_dir)
        marker.write_text(digest)
        logger.info("lib_dir=<%s> | kafka jars ready", lib_dir)
    return lib_dir


def new_cluster_id() -> str:
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id
