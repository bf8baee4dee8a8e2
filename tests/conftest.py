"""Fixtures shared by every test tier: a real Kafka bootstrap address and per-test unique names.

Guarantee: a broker is started only when a test asks for one, and a broker started here is stopped
when the session ends (and killed with the test process if that dies first).
"""

from __future__ import annotations

import asyncio
import importlib
import os
import re
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import for_code

REPO_ROOT = Path(__file__).resolve().parent.parent
LOCAL_KAFKA_DIR = REPO_ROOT / "deploy" / "local-kafka"

# An external broker ("host:port") takes precedence over anything started here.
BOOTSTRAP_ENV = "CAIRN_TEST_BOOTSTRAP"
# "testcontainers" runs the broker in Docker; anything else starts the local Maven-built broker.
KAFKA_MODE_ENV = "CAIRN_TEST_KAFKA"
# A directory for local broker data that an outer script cleans up (CI stops brokers found there).
KAFKA_DIR_ENV = "CAIRN_TEST_KAFKA_DIR"

CreateTopics = Callable[..., Awaitable[list[str]]]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "kafka_bootstrap" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.kafka)


def _local_kafka() -> ModuleType:
    if str(LOCAL_KAFKA_DIR) not in sys.path:
        sys.path.insert(0, str(LOCAL_KAFKA_DIR))
    return importlib.import_module("kafka_local")


def _two_free_ports(kafka_local: ModuleType) -> tuple[int, int]:
    port: int = kafka_local.free_port()
    controller_port: int = kafka_local.free_port()
    while controller_port == port:
        controller_port = kafka_local.free_port()
    return port, controller_port


def _local_broker(base: Path) -> Iterator[str]:
    kafka_local = _local_kafka()
    attempts = 3
    for attempt in range(1, attempts + 1):
        port, controller_port = _two_free_ports(kafka_local)
        config = kafka_local.BrokerConfig(
            data_dir=Path(tempfile.mkdtemp(prefix="broker-", dir=base)),
            port=port,
            controller_port=controller_port,
            die_with_parent=True,
        )
        broker = kafka_local.LocalBroker(config)
        try:
            broker.start(timeout=180.0)
        except kafka_local.BrokerError as error:
            # Free ports can be taken by another process between the probe and the bind.
            if attempt == attempts or "in use" not in str(error):
                raise
            continue
        try:
            yield config.bootstrap
        finally:
            broker.stop()
        return


def _container_broker() -> Iterator[str]:
    try:
        from testcontainers.community.kafka import KafkaContainer
    except ImportError:
        from testcontainers.kafka import KafkaContainer

    container = (
        KafkaContainer()
        .with_kraft()
        .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
    )
    with container as kafka:
        yield kafka.get_bootstrap_server()


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A "host:port" of a real Kafka broker that serves transactions and consumer groups."""
    external = os.environ.get(BOOTSTRAP_ENV)
    if external:
        yield external
        return
    if os.environ.get(KAFKA_MODE_ENV) == "testcontainers":
        yield from _container_broker()
        return
    kafka_dir = os.environ.get(KAFKA_DIR_ENV)
    if kafka_dir:
        base = Path(kafka_dir)
        base.mkdir(parents=True, exist_ok=True)
    else:
        base = tmp_path_factory.mktemp("kafka")
    yield from _local_broker(base)


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> str:
    """A topic and group name prefix that no other test (or earlier run) uses."""
    readable = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
    return f"t-{readable}-{uuid.uuid4().hex[:8]}"


async def create_topics(
    bootstrap: str,
    *names: str,
    partitions: int = 1,
    config: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> list[str]:
    """Creates topics with the admin client and waits until every partition has a leader."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        new = [NewTopic(name, partitions, 1, topic_configs=dict(config or {})) for name in names]
        response = await admin.create_topics(new)
        for topic, code, *_ in response.topic_errors:
            if code != 0:
                raise for_code(code)(f"topic=<{topic}> | create failed")
        deadline = time.monotonic() + timeout
        while True:
            described = await admin.describe_topics(list(names))
            if all(_has_leaders(topic, partitions) for topic in described):
                return list(names)
            if time.monotonic() > deadline:
                raise TimeoutError(f"topics=<{names}> | partitions have no leader yet")
            await asyncio.sleep(0.05)
    finally:
        await admin.close()


def _has_leaders(topic: Mapping[str, object], partitions: int) -> bool:
    found = topic.get("partitions")
    if topic.get("error_code") != 0 or not isinstance(found, list) or len(found) != partitions:
        return False
    return all(p.get("error_code") == 0 and p.get("leader", -1) >= 0 for p in found)


@pytest.fixture
def kafka_topics(kafka_bootstrap: str) -> CreateTopics:
    """`await kafka_topics("a", "b", partitions=3, config={...})` creates topics on the broker."""

    async def create(*names: str, **options: object) -> list[str]:
        return await create_topics(kafka_bootstrap, *names, **options)  # type: ignore[arg-type]

    return create
