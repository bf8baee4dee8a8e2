"""Test harness for the runtime: isolated topics per test, service instances as real OS processes,
commands produced and results read back with a read_committed consumer.

Every wait polls a condition with a deadline; nothing here sleeps in place of a condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from prometheus_client.parser import text_string_to_metric_families

from service.agent.state import SessionState
from service.runtime.clients import admin, connection_options
from service.runtime.topics import create_topics, topic_specs
from service.sessions.store import SessionStore, StoredSession
from service.settings import KafkaSettings, RuntimeSettings, TopicSettings

REPO = Path(__file__).resolve().parents[2]
_counter = itertools.count()

SESSION_TIMEOUT_MS = 3000
"""The group session timeout of the services the harness starts: a killed owner's partitions
move once it expires, so it sets how long every kill test waits. Below Kafka's default floor
(``group.min.session.timeout.ms``, 6 s), which the brokers of ``deploy/local-kafka`` lower."""


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def transaction_streams() -> str:
    """The ``runtime.transaction_streams`` the services a test starts run with (they inherit
    the environment)."""
    default = RuntimeSettings().transaction_streams
    return os.environ.get("CAIRN_RUNTIME__TRANSACTION_STREAMS", default)


@dataclass
class Cluster:
    """One test's topics, group and working directory on the shared broker."""

    bootstrap: str
    workdir: Path
    partitions: int = 4
    output_partitions: int | None = None
    """Partitions of results, events and dlq when not as many as the commands'."""
    prefix: str = field(default_factory=lambda: unique("t"))
    group: str = field(default_factory=lambda: unique("g"))
    client: KafkaSettings | None = None
    """How the test's own clients connect (unset: plaintext to ``bootstrap``); service processes
    get their own ``CAIRN_KAFKA__*`` through ``start``."""

    @property
    def topics(self) -> TopicSettings:
        return TopicSettings(
            commands=f"{self.prefix}.commands",
            control=f"{self.prefix}.control",
            results=f"{self.prefix}.results",
            events=f"{self.prefix}.events",
            sessions=f"{self.prefix}.sessions",
            dlq=f"{self.prefix}.dlq",
            partitions=self.partitions,
            output_partitions=self.output_partitions,
        )

    @property
    def kafka(self) -> KafkaSettings:
        return self.client or KafkaSettings(bootstrap_servers=self.bootstrap)

    def client_options(self) -> dict[str, Any]:
        """aiokafka connection options of the test's own clients."""
        if self.client is None:
            return {"bootstrap_servers": self.bootstrap}
        return connection_options(self.client)

    @property
    def tool_log(self) -> Path:
        return self.workdir / "tool-calls.jsonl"

    @property
    def model_log(self) -> Path:
        return self.workdir / "model-calls.jsonl"

    async def create_topics(self) -> None:
        await create_topics(self.kafka, self.topics)

    async def delete_topics(self) -> None:
        await delete_topics(admin(self.kafka), [spec.name for spec in topic_specs(self.topics)])

    def env(self, **extra: str) -> dict[str, str]:
        topics = self.topics
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "CAIRN_KAFKA__BOOTSTRAP_SERVERS": self.bootstrap,
            "CAIRN_TOPICS__COMMANDS": topics.commands,
            "CAIRN_TOPICS__CONTROL": topics.control,
            "CAIRN_TOPICS__RESULTS": topics.results,
            "CAIRN_TOPICS__EVENTS": topics.events,
            "CAIRN_TOPICS__SESSIONS": topics.sessions,
            "CAIRN_TOPICS__DLQ": topics.dlq,
            "CAIRN_TOPICS__PARTITIONS": str(self.partitions),
            "CAIRN_GROUP__GROUP_ID": self.group,
            "CAIRN_GROUP__SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
            "CAIRN_GROUP__HEARTBEAT_INTERVAL_MS": "500",
            "CAIRN_RUNTIME__REVOKE_GRACE_S": "3",
            "CAIRN_RUNTIME__TRANSACTION_TIMEOUT_MS": "20000",
            "CAIRN_AGENTS": "tests.support.agents:registry",
            "CAIRN_HEALTH_PORT": "0",
            "CAIRN_LOG_JSON": "false",
            "CAIRN_LOG_LEVEL": "INFO",
            "CAIRN_TEST_TOOL_LOG": str(self.tool_log),
            "CAIRN_TEST_MODEL_LOG": str(self.model_log),
            # A killed service leaves its scratch session store behind: in the workdir, it goes
            # with it.
            "TMPDIR": str(self.workdir),
        }
        if self.output_partitions is not None:
            env["CAIRN_TOPICS__OUTPUT_PARTITIONS"] = str(self.output_partitions)
        env.update(extra)
        return env

    def start(self, name: str | None = None, **extra: str) -> ServiceProcess:
        name = name or f"svc{next(_counter)}"
        return ServiceProcess.launch(name, self.workdir, self.env(**extra))

    def tool_calls(self) -> list[dict[str, Any]]:
        return _read_jsonl(self.tool_log)

    def model_calls(self) -> list[dict[str, Any]]:
        return _read_jsonl(self.model_log)


async def committed_records(bootstrap: str, topic: str, partitions: int) -> list[Any]:
    """Every record a read_committed reader gets from ``topic`` now, in log order per partition
    (aiokafka's ``ConsumerRecord``s, with their offsets)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        isolation_level="read_committed",
        enable_auto_commit=False,
    )
    await consumer.start()
    found: list[Any] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + 30
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            assert time.monotonic() < deadline, f"{topic} not read to {ends} in 30 s"
            for records in (await consumer.getmany(timeout_ms=200)).values():
                found.extend(records)
    finally:
        await consumer.stop()
    found.sort(key=lambda record: (record.partition, record.offset))
    return found


async def last_session_state(cluster: Cluster, session_id: str) -> tuple[SessionState, int]:
    """The session's committed state and the event seq its record carries."""
    stored = await last_stored_session(cluster, session_id)
    return stored.state, stored.event_seq


async def last_stored_session(cluster: Cluster, session_id: str) -> StoredSession:
    """The session as committed on the changelog (state, delivery records, event seq)."""
    records = await committed_records(
        cluster.bootstrap, cluster.topics.sessions, cluster.partitions
    )
    store = SessionStore()
    for record in records:
        store.load(record.key, record.value, list(record.headers))
    stored = store.get(session_id)
    assert stored is not None, f"no committed state of {session_id}"
    return stored


async def delete_topics(client: AIOKafkaAdminClient, names: list[str]) -> None:
    """Remove a test's topics. The suite shares one broker, and every partition left behind is
    one more for it to carry (log files, metrics, metadata) through every later test. Best
    effort: a test may leave the broker stopped or the topics gone."""
    try:
        await asyncio.wait_for(client.start(), 10)
        await asyncio.wait_for(client.delete_topics(names, timeout_ms=10_000), 15)
    except (KafkaError, OSError, TimeoutError) as exc:
        print(f"topics {names} not deleted: {exc!r}", file=sys.stderr)
    finally:
        await client.close()


async def create_topics_raw(bootstrap: str, counts: dict[str, int]) -> None:
    """Topics with arbitrary partition counts (to build layouts the service must refuse)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, count, 1) for name, count in counts.items()])
    finally:
        await admin.close()


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class ServiceProcess:
    """``python -m service serve`` in its own process; its log goes to a file in the workdir."""

    def __init__(self, name: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.name = name
        self.process = process
        self.log = log

    @classmethod
    def launch(cls, name: str, workdir: Path, env: dict[str, str]) -> ServiceProcess:
        log = workdir / f"{name}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "service", "serve"],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return cls(name, process, log)

    @property
    def pid(self) -> int:
        return self.process.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def log_count(self, needle: str) -> int:
        return self.text().count(needle)

    async def wait_log(self, needle: str, timeout: float = 30.0, count: int = 1) -> None:
        await wait_for(
            lambda: self.log_count(needle) >= count,
            timeout,
            f"{self.name}: {needle!r} x{count} in its log",
            on_timeout=self.text,
            alive=self,
        )

    async def wait_ready(self, timeout: float = 40.0) -> None:
        """Joined and owns at least one restored partition."""
        await self.wait_log("partition ready", timeout)

    def signal(self, sig: int) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.process.wait(10)

    async def terminate(self, timeout: float = 30.0) -> int:
        self.signal(signal.SIGTERM)
        await wait_for(lambda: self.process.poll() is not None, timeout, f"{self.name} exits")
        code = self.process.returncode
        assert code is not None
        return code

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


async def wait_for(
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    *,
    on_timeout: Callable[[], str] | None = None,
    alive: ServiceProcess | None = None,
    interval: float = 0.05,
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if alive is not None and not alive.alive:
            raise AssertionError(
                f"{alive.name} exited while waiting for {what}:\n{alive.text()[-4000:]}"
            )
        if time.monotonic() > deadline:
            detail = on_timeout()[-4000:] if on_timeout is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{detail}")
        await asyncio.sleep(interval)


def invoke(
    session_id: str,
    prompt: Any,
    *,
    agent: str = "cycles",
    command_id: str | None = None,
    checkpointing: bool | None = None,
    **extra: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": "invoke",
        "schema_version": 1,
        "command_id": command_id or unique("c"),
        "session_id": session_id,
        "agent": agent,
        "prompt": prompt,
    }
    if checkpointing is not None:
        body["checkpointing"] = checkpointing
    body.update(extra)
    return body


def resume(session_id: str, payload: Any, *, command_id: str | None = None) -> dict[str, Any]:
    return {
        "type": "resume",
        "schema_version": 1,
        "command_id": command_id or unique("c"),
        "session_id": session_id,
        "resume": payload,
    }


def cancel(session_id: str, **fields: Any) -> dict[str, Any]:
    """A cancel of the session (its current command unless ``target_command_id`` says which)."""
    return _command("cancel", "x", session_id, fields)


def delete(session_id: str, **fields: Any) -> dict[str, Any]:
    """A delete of the session."""
    return _command("delete", "d", session_id, fields)


def _command(kind: str, prefix: str, session_id: str, fields: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": kind,
        "schema_version": 1,
        "command_id": unique(prefix),
        "session_id": session_id,
        **fields,
    }


def checkpoint_resume(session_id: str, checkpoint: dict[str, Any]) -> dict[str, Any]:
    return resume(session_id, {"checkpointResume": {"checkpoint": checkpoint}})


class Client:
    """Upstream's view: publishes commands, reads committed results (and events)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.results: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.dead_letters: list[dict[str, Any]] = []
        self._producer: AIOKafkaProducer | None = None
        self._readers: list[asyncio.Task[None]] = []
        self._consumers: list[AIOKafkaConsumer] = []

    async def __aenter__(self) -> Client:
        self._producer = AIOKafkaProducer(**self.cluster.client_options(), acks="all", linger_ms=0)
        await self._producer.start()
        topics = self.cluster.topics
        for topic, sink in (
            (topics.results, self.results),
            (topics.events, self.events),
            (topics.dlq, self.dead_letters),
        ):
            consumer = AIOKafkaConsumer(
                **self.cluster.client_options(),
                group_id=None,
                isolation_level="read_committed",
                enable_auto_commit=False,
            )
            await consumer.start()
            count = self.cluster.output_partitions or self.cluster.partitions
            partitions = [TopicPartition(topic, p) for p in range(count)]
            consumer.assign(partitions)
            await consumer.seek_to_beginning(*partitions)
            self._consumers.append(consumer)
            self._readers.append(asyncio.create_task(self._read(consumer, sink)))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._readers:
            task.cancel()
        for task in self._readers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for consumer in self._consumers:
            await consumer.stop()
        if self._producer is not None:
            await self._producer.stop()

    async def _read(self, consumer: AIOKafkaConsumer, sink: list[dict[str, Any]]) -> None:
        while True:
            batches = await consumer.getmany(timeout_ms=100)
            for records in batches.values():
                for record in records:
                    if record.topic == self.cluster.topics.dlq:
                        sink.append(
                            {
                                "key": record.key,
                                "value": record.value,
                                "headers": dict(record.headers),
                            }
                        )
                        continue
                    value = orjson.loads(record.value)
                    value["_partition"] = record.partition
                    value["_offset"] = record.offset
                    value["_headers"] = dict(record.headers)
                    sink.append(value)

    async def send(
        self, *commands: dict[str, Any], topic: str | None = None, timestamp_ms: int | None = None
    ) -> None:
        """Publish in order; ``timestamp_ms`` sets the records' publication time explicitly."""
        assert self._producer is not None
        target = topic or self.cluster.topics.commands
        for command in commands:
            await self._producer.send(
                target,
                key=command["session_id"].encode(),
                value=orjson.dumps(command),
                timestamp_ms=timestamp_ms,
            )
        await self._producer.flush()

    async def send_raw(self, key: bytes | None, value: bytes, topic: str | None = None) -> None:
        assert self._producer is not None
        await self._producer.send_and_wait(
            topic or self.cluster.topics.commands, key=key, value=value
        )

    async def caught_up(self, timeout: float = 30.0) -> None:
        """Wait until every committed record that exists now has been read."""
        for consumer in self._consumers:
            partitions = list(consumer.assignment())
            ends = await consumer.end_offsets(partitions)
            deadline = time.monotonic() + timeout
            while True:
                positions = {tp: await consumer.position(tp) for tp in partitions}
                if all(positions[tp] >= ends[tp] for tp in partitions):
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"reader not caught up: {positions} < {ends}")
                await asyncio.sleep(0.05)

    def results_for(self, command_id: str) -> list[dict[str, Any]]:
        return [r for r in self.results if r["command_id"] == command_id]

    def session_results(self, session_id: str) -> list[dict[str, Any]]:
        return [r for r in self.results if r["session_id"] == session_id]

    async def result(self, command_id: str, timeout: float = 30.0, **kw: Any) -> dict[str, Any]:
        await wait_for(
            lambda: bool(self.results_for(command_id)), timeout, f"result of {command_id}", **kw
        )
        return self.results_for(command_id)[0]

    async def wait_results(self, count: int, timeout: float = 60.0, **kw: Any) -> None:
        await wait_for(lambda: len(self.results) >= count, timeout, f"{count} results", **kw)


@contextlib.contextmanager
def services() -> Iterator[list[ServiceProcess]]:
    """Every process started into the list is killed at the end, whatever happened."""
    started: list[ServiceProcess] = []
    try:
        yield started
    finally:
        for proc in started:
            if proc.alive:
                proc.signal(signal.SIGCONT)
                proc.kill()


_HEALTH_PORT = re.compile(r"port=<(\d+)> \| health server listening")


async def health_port(proc: ServiceProcess) -> int:
    """The port of the process's health and metrics endpoint (started with port 0, it logs the
    one it bound)."""
    await proc.wait_log("health server listening")
    match = _HEALTH_PORT.search(proc.text())
    assert match is not None, proc.text()[-2000:]
    return int(match.group(1))


async def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    """Status and JSON body of a GET of the operator endpoint on ``port`` (``/readyz``,
    ``/livez``, ``/drain``)."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, orjson.loads(await response.read())


async def metric_total(
    proc: ServiceProcess, family: str, labels: dict[str, str] | None = None
) -> float:
    """The sum of the ``_total`` samples of a counter family on the process's ``/metrics``
    (only those with every label of ``labels``, when given)."""
    wanted = (labels or {}).items()
    port = await health_port(proc)
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        text = await response.text()
    for found in text_string_to_metric_families(text):
        if found.name == family:
            return sum(
                s.value
                for s in found.samples
                if s.name.endswith("_total") and wanted <= s.labels.items()
            )
    raise AssertionError(f"no {family} metric")
