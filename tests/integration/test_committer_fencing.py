"""A committer whose producer was fenced fails its commit with the fencing error and leaves no
future behind whose exception nobody retrieves (asyncio would report it at garbage collection)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import InvalidProducerEpoch, ProducerFenced

from service.runtime.committer import Committer, discard_leftovers
from service.runtime.faults import FaultPoints
from service.runtime.offsets import OffsetTracker
from service.runtime.work import Origin, Outcome, OutRecord
from service.settings import FaultSettings
from tests.conftest import CreateTopics

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(60)]


@pytest.fixture
async def unretrieved() -> AsyncIterator[list[dict[str, Any]]]:
    """What the event loop reports through its exception handler during the test."""
    loop = asyncio.get_running_loop()
    reports: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reports.append(context))
    try:
        yield reports
    finally:
        loop.set_exception_handler(previous)


def _committer(producer: AIOKafkaProducer, topics: list[str], tracker: OffsetTracker) -> Committer:
    commands, _, sessions = topics
    return Committer(
        producer=producer,
        group_id=f"{commands}-group",
        sessions_topic=sessions,
        partition=0,
        trackers={commands: tracker},
        interval_s=0.0,
        offsets_every_s=0.0,
        timeout_s=10.0,
        faults=FaultPoints(FaultSettings()),
    )


def _outcome(topics: list[str], offset: int) -> Outcome:
    commands, results, _ = topics
    return Outcome(
        records=[OutRecord(results, b"s", b"answer %d" % offset, partition=0)],
        finished=[Origin(commands, 0, offset)],
        results=1,
    )


@pytest.mark.parametrize("committed_before", [False, True], ids=["first-commit", "later-commit"])
async def test_a_fenced_commit_leaves_no_unretrieved_future(
    kafka_bootstrap: str,
    kafka_topics: CreateTopics,
    unique_name: str,
    unretrieved: list[dict[str, Any]],
    committed_before: bool,
) -> None:
    topics = await kafka_topics(
        f"{unique_name}.commands", f"{unique_name}.results", f"{unique_name}.sessions"
    )
    transactional_id = f"{unique_name}-0"
    zombie = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, transactional_id=transactional_id, linger_ms=0
    )
    await zombie.start()
    tracker = OffsetTracker(0)
    committer = _committer(zombie, topics, tracker)
    running = asyncio.create_task(committer.run())
    if committed_before:
        tracker.received(0)
        committer.submit(_outcome(topics, 0))
        await asyncio.wait_for(committer.flush(), 10)
    successor = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, transactional_id=transactional_id, linger_ms=0
    )
    await successor.start()
    try:
        tracker.received(1)
        committer.submit(_outcome(topics, 1))
        with pytest.raises((ProducerFenced, InvalidProducerEpoch)):
            await asyncio.wait_for(running, 10)
        async with asyncio.timeout(5):
            await zombie.stop()
        discard_leftovers(zombie)
    finally:
        await successor.stop()
    del zombie, committer, running
    gc.collect()
    await asyncio.sleep(0)
    messages = [report.get("message") for report in unretrieved]
    assert messages == [], unretrieved
