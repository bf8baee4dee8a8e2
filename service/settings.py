"""The one settings root of the service (``CAIRN_`` prefix, nested groups joined with ``__``).

Built once at start-up and passed down; this is the only module that reads the environment.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import socket
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_KAFKA_PORT = 9092
"""The port aiokafka connects to for a server given without one."""
_PORT = re.compile(r"[0-9]{1,5}")
_BRACKETED = re.compile(r"\[([^\[\]]*)\](?::(.*))?")
_HOST = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*\.?")
"""A host name (DNS labels; ``_`` as container names have it) or an IPv4 address."""


def bootstrap_problem(servers: str) -> str | None:
    """Why ``servers`` is not a bootstrap list aiokafka can connect to, or None when it is.

    aiokafka parses the list only when it first connects, and a port out of range or not a
    number then ends the process with a traceback from deep in the client, so the list is
    checked here, as aiokafka reads it (``aiokafka.conn.collect_hosts``): comma-separated
    ``HOST:PORT``, ``HOST`` alone (port 9092), ``[IPV6]:PORT`` or ``[IPV6]``. A bare IPv6
    address is refused, though aiokafka takes it: ``::1:9092`` is one, on port 9092. The value
    itself is never quoted (settings errors never echo one).
    """
    entries = servers.strip().split(",")
    for number, entry in enumerate(entries, start=1):
        where = f"server {number} of {len(entries)}" if len(entries) > 1 else "the server"
        problem = _server_problem(entry.strip())
        if problem is not None:
            return f"{where} is not HOST:PORT: {problem}"
    return None


def _server_problem(server: str) -> str | None:
    if not server:
        return "it is empty"
    bracketed = _BRACKETED.fullmatch(server)
    if bracketed is not None:
        host, port = bracketed.groups()
        if not _is_ipv6(host):
            return "the host in brackets is not an IPv6 address"
        return None if port is None else _port_problem(port)
    if "[" in server or "]" in server:
        return "an unclosed or misplaced bracket"
    if _is_ipv6(server):
        return "an IPv6 address goes in brackets, as [::1]:9092"
    host, colon, port = server.rpartition(":")
    if not colon:
        host, port = server, str(DEFAULT_KAFKA_PORT)
    if not host:
        return "the host is empty"
    if not _HOST.fullmatch(host):
        return "the host is not a name or an IPv4 address (letters, digits, '-', '_', '.')"
    return _port_problem(port)


def _port_problem(port: str) -> str | None:
    if not _PORT.fullmatch(port) or not 1 <= int(port) <= 65535:
        return "the port is not a number from 1 to 65535"
    return None


def _is_ipv6(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6, host)
    except (OSError, ValueError):
        return False
    return True


class KafkaSettings(BaseModel):
    """Connection options handed to every aiokafka client unchanged."""

    bootstrap_servers: str = "localhost:9092"
    """Comma-separated ``HOST:PORT`` (see :func:`bootstrap_problem`), checked at start-up."""
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    """Required with a SASL protocol, and so are the user name and password."""
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    client_id: str = "cairn"
    request_timeout_ms: int = Field(default=30_000, gt=0)

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers(cls, value: str) -> str:
        problem = bootstrap_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _security(self) -> KafkaSettings:
        """What aiokafka refuses only as its first client is made, in a traceback (the TLS
        files are checked as a command starts: :func:`tls_files_problem`)."""
        protocol = self.security_protocol
        if protocol.startswith("SASL_"):
            missing = [
                f"CAIRN_KAFKA__{name.upper()}"
                for name in ("sasl_mechanism", "sasl_username", "sasl_password")
                if getattr(self, name) is None
            ]
            if missing:
                raise ValueError(
                    f"{', '.join(missing)} must be set with CAIRN_KAFKA__SECURITY_PROTOCOL="
                    f"{protocol}"
                )
        return self


def tls_files_problem(kafka: KafkaSettings) -> str | None:
    """Why the TLS files set cannot make a client's context (naming the variable), or None.
    Checked as a command starts, not with the settings, since the files are the machine's: a
    file aiokafka cannot load fails every connection, taken for an unreachable broker."""
    if kafka.security_protocol not in ("SSL", "SASL_SSL"):
        return None  # the files are not used
    cafile, certfile, keyfile = kafka.ssl_cafile, kafka.ssl_certfile, kafka.ssl_keyfile
    if keyfile is not None and certfile is None:
        return "CAIRN_KAFKA__SSL_KEYFILE is set without CAIRN_KAFKA__SSL_CERTFILE"
    files = {"SSL_CAFILE": cafile, "SSL_CERTFILE": certfile, "SSL_KEYFILE": keyfile}
    for name, path in files.items():
        if path is not None and not os.path.isfile(path):
            return f"CAIRN_KAFKA__{name}: no file at {path}"
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if cafile is not None:
        try:
            context.load_verify_locations(cafile=cafile)
        except (OSError, ssl.SSLError) as exc:
            return f"CAIRN_KAFKA__SSL_CAFILE: {cafile} does not load ({_reason(exc)})"
    if certfile is not None:
        try:
            context.load_cert_chain(certfile, keyfile)
        except (OSError, ssl.SSLError) as exc:
            return (
                "CAIRN_KAFKA__SSL_CERTFILE and CAIRN_KAFKA__SSL_KEYFILE: the certificate and its "
                f"key do not load ({_reason(exc)})"
            )
    return None


def _reason(exc: OSError) -> str:
    if isinstance(exc, ssl.SSLError):
        return str(exc)
    return exc.strerror or str(exc)


TOPIC_ROLES = ("commands", "control", "results", "events", "sessions", "dlq")
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
_TOPIC_MAX_LENGTH = 249


class TopicSettings(BaseModel):
    """Topic names and the partition count shared by the co-partitioned topics."""

    commands: str = "cairn.commands"
    control: str = "cairn.control"
    results: str = "cairn.results"
    events: str = "cairn.events"
    sessions: str = "cairn.sessions"
    dlq: str = "cairn.dlq"
    partitions: int = Field(default=12, gt=0)
    """Partition count of commands, control and sessions (co-partitioned: always equal)."""
    output_partitions: int | None = Field(default=None, gt=0)
    """Partition count of results, events and dlq when created; defaults to ``partitions``."""
    replication_factor: int = Field(default=1, gt=0)

    @field_validator(*TOPIC_ROLES)
    @classmethod
    def _topic_name(cls, name: str) -> str:
        """Kafka's own rule for a topic name, checked here: a broker refuses it only when the
        topic is described or created, with an error code that names no setting."""
        if not name:
            raise ValueError("a topic name cannot be empty")
        if name in (".", ".."):
            raise ValueError("a topic name cannot be '.' or '..'")
        if len(name) > _TOPIC_MAX_LENGTH:
            raise ValueError(f"a topic name is at most {_TOPIC_MAX_LENGTH} characters")
        if not _TOPIC_NAME.fullmatch(name):
            raise ValueError("a topic name holds only ASCII letters, digits, '.', '_' and '-'")
        return name

    @model_validator(mode="after")
    def _one_topic_per_role(self) -> TopicSettings:
        """Two roles on one topic would mix records of both kinds (a cancel read as a command,
        results among session states), which the service cannot tell apart."""
        names = [getattr(self, role) for role in TOPIC_ROLES]
        for name in names:
            shared = [role for role, other in zip(TOPIC_ROLES, names, strict=True) if other == name]
            if len(shared) > 1:
                names = [f"CAIRN_TOPICS__{role.upper()}" for role in shared]
                variables = f"{', '.join(names[:-1])} and {names[-1]}"
                raise ValueError(
                    f"{variables} name the same topic: every role ({', '.join(shared)}) needs a "
                    "topic of its own"
                )
        return self

    @property
    def co_partitioned(self) -> tuple[str, str, str]:
        return (self.commands, self.control, self.sessions)


class GroupSettings(BaseModel):
    """Consumer-group membership; ``instance_id`` turns on static membership."""

    group_id: str = Field(default="cairn", min_length=1)
    """Also the prefix of the transactional ids; the broker refuses an empty one."""
    instance_id: str | None = Field(default=None, min_length=1)
    """Unset for dynamic membership; an empty one is refused rather than taken for unset."""
    session_timeout_ms: int = Field(default=6_000, gt=0)
    """How long a silent member keeps its partitions: most of the takeover time after a crash.
    6 s is the broker's default floor (``group.min.session.timeout.ms``)."""
    heartbeat_interval_ms: int = Field(default=1_000, gt=0)
    """Survivors learn of a dead member at their next heartbeat: part of the takeover time."""
    max_poll_interval_ms: int = Field(default=300_000, gt=0)
    rebalance_timeout_ms: int | None = Field(default=30_000, gt=0)
    """How long a live member may take to rejoin a rebalance (its revoke drain included);
    unset means the session timeout."""

    @model_validator(mode="after")
    def _heartbeat_below_session(self) -> GroupSettings:
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError(
                f"CAIRN_GROUP__HEARTBEAT_INTERVAL_MS ({self.heartbeat_interval_ms} ms) must be "
                f"lower than CAIRN_GROUP__SESSION_TIMEOUT_MS ({self.session_timeout_ms} ms)"
            )
        return self


class RuntimeSettings(BaseModel):
    """Throughput, latency and drain bounds of the per-partition runtime."""

    max_in_flight: int = Field(default=1_000, gt=0)
    """Commands accepted but not yet committed, per instance; fetching pauses above it."""
    commit_interval_ms: int = Field(default=0, ge=0)
    """Minimum spacing between the starts of two shares of one partition in the instance's
    transactions. At 0 a commit
    starts as soon as the previous one ended: work finished meanwhile forms the next batch, so
    batches grow with load and an idle partition commits at once."""
    transaction_streams: Literal["partition", "instance"] = "partition"
    """``partition``: one transactional producer per owned partition (``<group_id>-<p>``), whose
    start fences the partition's previous owner. ``instance``: one producer for all of an
    instance's partitions, its transactions fenced by the group generation (KIP-447); fewer,
    larger transactions, but one at a time (see docs/runtime.md, "One stream per instance")."""
    transactions_version: int = Field(default=2, ge=1, le=2)
    """Kafka's transaction protocol. ``2`` (KIP-890; a broker whose ``transaction.version``
    feature is at 2, as a cluster formatted by Kafka 4.0 or later has it): the partition leader
    adds a partition to the transaction with the produce itself, so a commit waits for two round
    trips instead of three; sent by a producer of the service's own over aiokafka's client
    (``service/runtime/txn_v2.py``). ``1``: aiokafka's producer, for a broker without it."""
    offsets_every_ms: int = Field(default=1_000, ge=0)
    """Input offsets move in a transaction at most this often (0: every transaction). Commands
    re-read after a crash are recognised by the applied command ids in their session state, so
    lagging offsets cost only replays; records no state records (dead letters, answers to
    session-less commands, control) always move them at once. With one stream per instance
    every transaction carries the offsets (they are what fences a zombie's transaction), moved
    or not."""
    transaction_timeout_ms: int = Field(default=30_000, gt=0)
    """Broker-side bound of one transaction; a stuck zombie's transaction aborts after it."""
    commit_timeout_s: float = Field(default=15.0, gt=0)
    """Client-side bound of one transaction; past it the instance's producer is thrown away and
    re-created, and the partitions with work in it start again from what is committed."""
    revoke_grace_s: float = Field(default=5.0, ge=0)
    """On revocation or shutdown, how long in-flight steps may run to reach a commit."""
    state_record_max_bytes: int = Field(default=900_000, gt=0)
    """Largest record Cairn reads or writes: a command or cancel above it is dead-lettered, a
    result above it is answered with a small error, a longer history record is split."""
    text_events_every_ms: int = Field(default=500, ge=0)
    """While a model streams text, the ``text_delta`` event of what it streamed so far is
    published once this long has passed since the oldest part of it came (0: one per model
    call, when it ends); each costs a commit of the events and the session's head."""
    fetch_max_records: int = Field(default=20, gt=0)
    """Records per fetch; every command fetched at once runs before the loop polls I/O again, so
    this bounds how long a commit's next round trip waits behind engine steps."""


class SessionSettings(BaseModel):
    """The local session store: where it lives on disk and how much of it stays in memory."""

    store_dir: Path | None = None
    """Folder of the local store (one SQLite file per owned partition). Keep it on a volume that
    outlives the process, and a restart reads only the changelog's tail; unset means a fresh
    temporary folder per process (removed at exit), so every start restores from the topic."""
    cache_max_bytes: int = Field(default=128 * 1024 * 1024, ge=0)
    """Decoded sessions held in memory, in bytes of their JSON; the rest are read from the
    store when touched. Sessions with writes not yet committed stay in memory whatever this is."""
    result_max_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    """Largest tool result kept (bytes of its JSON); a larger one reaches the model as an error
    result instead (docs/runtime.md has the text). Results above the record limit are split
    across records."""
    idle_ttl_s: float | None = Field(default=None, gt=0)
    """Delete a session idle longer than this (no command written to it), as a ``delete``
    command would, with a ``session_expired`` event; unset keeps sessions until deleted."""
    versions_kept: int = Field(default=100, ge=1)
    """Versions a session keeps for ``history`` and ``fork`` (one per committed step); older
    ones are tombstoned, and compaction removes them."""
    standby: bool = False
    """Keep a local copy of every partition this instance does not own, following the sessions
    topic, so that taking a partition over reads only what was written since (instead of the
    whole partition); costs a reader of the topic and the disk of the copies."""
    local_max_age_s: float = Field(default=12 * 3600.0, gt=0)
    """A local store last written longer ago is rebuilt from the topic, not trusted: a session
    deleted meanwhile leaves only tombstones, which compaction removes after the topic's
    ``delete.retention.ms`` (24 h by default); keep this below it."""


FaultPoint = Literal["after_produce_before_commit", "after_commit"]


class FaultSettings(BaseModel):
    """Test-only fault points: at the named place the process SIGKILLs itself (``kill_at``),
    SIGSTOPs itself (``stop_at``: a zombie until someone sends SIGCONT) or the commit fails as if
    its outcome were unknown (``fail_at``). Only transactions that carry work count; the first
    commit of a new owner, which claims the partition, does not."""

    kill_at: FaultPoint | None = None
    kill_after: int = Field(default=1, gt=0)
    """Kill on the n-th time the point is reached (counted per process)."""
    stop_at: FaultPoint | None = None
    stop_after: int = Field(default=1, gt=0)
    """Stop on the n-th time the point is reached (counted per process)."""
    fail_at: FaultPoint | None = None
    fail_after: int = Field(default=1, gt=0)
    """Fail the commit the n-th time the point is reached, once."""
    hold_restore: bool = False
    """Every partition's restore waits until the process receives SIGUSR1 (makes a restore in
    progress observable from outside)."""
    fail_command: str | None = None
    """Handling the record of this command id raises, as an unexpected bug would (a poison
    record: it must be answered and never stop its partition)."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="CAIRN_",
        env_nested_delimiter="__",
        extra="ignore",
    )

    kafka: KafkaSettings = KafkaSettings()
    topics: TopicSettings = TopicSettings()
    group: GroupSettings = GroupSettings()
    runtime: RuntimeSettings = RuntimeSettings()
    sessions: SessionSettings = SessionSettings()
    faults: FaultSettings = FaultSettings()

    @model_validator(mode="after")
    def _grace_within_rebalance(self) -> Settings:
        rebalance_ms = self.group.rebalance_timeout_ms or self.group.session_timeout_ms
        if self.runtime.revoke_grace_s * 1000 >= rebalance_ms:
            timeout = (
                "CAIRN_GROUP__REBALANCE_TIMEOUT_MS"
                if self.group.rebalance_timeout_ms
                else "CAIRN_GROUP__SESSION_TIMEOUT_MS, the rebalance timeout when "
                "CAIRN_GROUP__REBALANCE_TIMEOUT_MS is unset"
            )
            raise ValueError(
                f"CAIRN_RUNTIME__REVOKE_GRACE_S ({self.runtime.revoke_grace_s:g} s) must be "
                f"shorter than the group's rebalance timeout ({timeout}: {rebalance_ms} ms), or "
                "a draining member is dropped from the group"
            )
        return self

    agents: str = "service.demo:agents"
    """The agents hosted: an agents file (``.toml``/``.yaml``) or a registry import path
    ``package.module:attribute``."""
    health_port: int | None = Field(default=8080, ge=0, le=65535)
    """The operator endpoint's port (``/livez``, ``/readyz``, ``/metrics``, ``/drain``); 0 takes
    a free one."""
    health_host: str = Field(default="0.0.0.0", min_length=1)
    """The address the operator endpoint listens on (all interfaces unless set)."""
    log_level: str = "INFO"
    log_json: bool = True
    log_repeat_limit: int = Field(default=5, ge=0)
    """Warnings and errors of one kind (logger, level, message template, exception types)
    written per interval; the rest are counted into one line. 0 writes every record."""
    log_repeat_interval_s: float = Field(default=10.0, gt=0)

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if value.upper() not in logging.getLevelNamesMapping():
            raise ValueError("not a log level: use DEBUG, INFO, WARNING, ERROR or CRITICAL")
        return value


def process_environment() -> Mapping[str, str]:
    """A snapshot of the process environment, for what settings cannot name in advance: the
    API-key variables an agents file refers to (``api_key_env``)."""
    return dict(os.environ)


NOT_SETTINGS = ("CAIRN_TEST_", "CAIRN_PYTHON")
"""Prefixes of ``CAIRN_`` variables that are no setting by design: hooks of the test agents and
the interpreter ``make run`` starts the service with."""
SERVICE_LINK = re.compile(
    r"(?!.*__).*_(SERVICE_HOST|SERVICE_PORT.*|PORT|PORT_\d+_(TCP|UDP|SCTP).*)"
)
"""The variables Kubernetes adds to a pod for each service of its namespace (a service named
``cairn-metrics`` gives ``CAIRN_METRICS_SERVICE_HOST``, ``CAIRN_METRICS_PORT``, ...). A name
with ``__`` is taken for a setting of a group (``CAIRN_HEALTH__PORT``) whatever its end: a
service name would need two hyphens in a row to give one."""


def setting_names() -> list[str]:
    """Every variable that sets something: each group as a whole and each of its fields."""
    names = []
    for name, field in Settings.model_fields.items():
        top = f"CAIRN_{name.upper()}"
        names.append(top)
        group = field.annotation
        if isinstance(group, type) and issubclass(group, BaseModel):
            names.extend(f"{top}__{sub.upper()}" for sub in group.model_fields)
    return names


_GROUPS = frozenset(
    f"CAIRN_{name.upper()}"
    for name, field in Settings.model_fields.items()
    if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
)


def unknown_settings(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """Each ``CAIRN_`` variable of ``environ`` that names no setting (a misspelt name is
    otherwise ignored without a word), with the setting it was likely meant to be."""
    known = setting_names()
    found: list[tuple[str, str | None]] = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith("CAIRN_") or upper in known or upper.startswith(NOT_SETTINGS):
            continue
        if SERVICE_LINK.fullmatch(upper):
            continue
        found.append((name, _likely_meant(upper, known)))
    return found


def _likely_meant(upper: str, known: list[str]) -> str | None:
    """The setting a variable that names none was likely meant to be: the one field whose own
    name it is (``CAIRN_GROUP_ID``: ``CAIRN_GROUP__GROUP_ID``), else the closest spelling of a
    field, else (for a name without ``__``) of a group. A group is never offered for a name a
    field is close to: its variable takes a whole JSON object."""
    fields = [name for name in known if name not in _GROUPS]
    own = [name for name in fields if name.partition("__")[2] == upper.removeprefix("CAIRN_")]
    if len(own) == 1:
        return own[0]
    close = difflib.get_close_matches(upper, fields, n=1, cutoff=0.8)
    if not close and "__" not in upper:
        close = difflib.get_close_matches(upper, sorted(_GROUPS), n=1, cutoff=0.8)
    return close[0] if close else None
