"""Readiness probes of the local broker, each one a real client round trip.

Guarantee: `wait_until_serving` returns only after metadata answered, a transaction committed and a
consumer group read that committed record; it never waits past its deadline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code
from kafka_local_config import BrokerError

logger = logging.getLogger("cairn.local_kafka")

READINESS_TOPIC = "cairn.readiness"
READINESS_GROUP = "cairn-readiness"


def run_coroutine(factory: Callable[[], Awaitable[None]]) -> None:
    """Runs async readiness probes from sync code, also when the caller already runs a loop."""

    async def main() -> None:
        await factory()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(main())
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, main()).result()


async def _wait_for(
    step: str,
    attempt: Callable[[], Awaitable[bool]],
    deadline: float,
    check_process: Callable[[], None],
) -> None:
    """Repeats attempt until it returns True; the process check runs before every try."""
    last: BaseException | None = None
    while True:
        check_process()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BrokerError(f"step=<{step}>, last_error=<{last!r}> | broker not ready in time")
        try:
            if await asyncio.wait_for(attempt(), timeout=remaining):
                return
        except (KafkaError, OSError, TimeoutError) as error:
            last = error
        await asyncio.sleep(0.1)


async def _port_open(host: str, port: int) -> bool:
    _, writer = await asyncio.open_connection(host, port)
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def _metadata_and_topic(bootstrap: str, options: Mapping[str, Any]) -> bool:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000, **options)
    try:
        await admin.start()
        cluster = await admin.describe_cluster()
        if not cluster.get("brokers"):
            return False
        response = await admin.create_topics([NewTopic(READINESS_TOPIC, 1, 1)])
        for _topic, code, *_ in response.topic_errors:
            error = for_code(code)
            if code != 0 and error is not TopicAlreadyExistsError:
                raise error()
        return True
    finally:
        await admin.close()


async def _transaction_commits(bootstrap: str, options: Mapping[str, Any]) -> bool:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        **options,
        transactional_id=READINESS_GROUP,
        request_timeout_ms=5000,
    )
    try:
        await producer.start()
        async with producer.transaction():
            await producer.send_and_wait(READINESS_TOPIC, b"ready")
        return True
    finally:
        await producer.stop()


async def _group_reads_committed(bootstrap: str, options: Mapping[str, Any]) -> bool:
    consumer = AIOKafkaConsumer(
        READINESS_TOPIC,
        bootstrap_servers=bootstrap,
        **options,
        group_id=READINESS_GROUP,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        request_timeout_ms=5000,
    )
    try:
        await consumer.start()
        while True:
            batches = await consumer.getmany(timeout_ms=200)
            if any(batches.values()):
                await consumer.commit()
                return True
    finally:
        await consumer.stop()


async def wait_until_serving(
    host: str,
    port: int,
    deadline: float,
    check_process: Callable[[], None],
    options: Mapping[str, Any] | None = None,
) -> None:
    """``options``: aiokafka connection options beyond the bootstrap (how to authenticate)."""
    bootstrap = f"{host}:{port}"
    given = dict(options or {})
    steps: list[tuple[str, Callable[[], Awaitable[bool]]]] = [
        ("port", lambda: _port_open(host, port)),
        ("metadata", lambda: _metadata_and_topic(bootstrap, given)),
        ("transaction", lambda: _transaction_commits(bootstrap, given)),
        ("group", lambda: _group_reads_committed(bootstrap, given)),
    ]
    began = time.monotonic()
    for step, attempt in steps:
        await _wait_for(step, attempt, deadline, check_process)
        logger.debug(
            "step=<%s>, seconds=<%.2f> | readiness step passed", step, time.monotonic() - began
        )
