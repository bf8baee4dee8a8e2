"""Fixtures shared by every test tier: a real Kafka bootstrap address and per-test unique names.

Guarantee: a broker is started only when a test asks for one, and a broker started here is stopped
when the session ends (and killed with the test process if that dies first).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import for_code

from tests.support.runtime_harness import delete_topics

REPO_ROOT = Path(__file__).resolve().parent.parent

# An external broker ("host:port") takes precedence over anything started here.
BOOTSTRAP_ENV = "CAIRN_TEST_BOOTSTRAP"
# "testcontainers" runs the broker in Docker; anything else starts the local Maven-built broker.
KAFKA_MODE_ENV = "CAIRN_TEST_KAFKA"

CreateTopics = Callable[..., Awaitable[list[str]]]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "kafka_bootstrap" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.kafka)


def _local_broker(base: Path) -> Iterator[str]:
    from tests.support.own_broker import own_broker

    with own_broker(base, fast_transaction_cleanup=False) as broker:
        yield broker.bootstrap


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
        # The services the tests start use a 3 s session timeout (tests/support/runtime_harness.py).
        .with_env("KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS", "1000")
        .with_env("KAFKA_LOG_CLEANER_BACKOFF_MS", "1000")
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
    # Under $CAIRN_TEST_KAFKA_DIR when that is set (CI stops what it finds there).
    yield from _local_broker(tmp_path_factory.mktemp("kafka"))


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
async def kafka_topics(kafka_bootstrap: str) -> AsyncIterator[CreateTopics]:
    """`await kafka_topics("a", "b", partitions=3, config={...})` creates topics on the broker;
    they are deleted after the test."""
    created: list[str] = []

    async def create(*names: str, **options: object) -> list[str]:
        created.extend(names)
        return await create_topics(kafka_bootstrap, *names, **options)  # type: ignore[arg-type]

    yield create
    if created:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap, request_timeout_ms=10_000)
        await delete_topics(admin, created)
