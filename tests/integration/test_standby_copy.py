"""A standby copy whose local file fails while it follows the sessions topic is thrown away and
read again from the topic's start, and the copy it hands its partition's owner is whole."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from service.runtime.standby import Standby
from service.sessions import table as table_module
from service.sessions.table import SqliteTable
from service.settings import KafkaSettings
from tests.conftest import CreateTopics

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]


class FailingOnce:
    """A SQLite connection whose first write of records once ``armed`` fails as a damaged file
    does."""

    armed = False
    failed = 0
    writes = 0

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def executemany(self, sql: str, rows: Any) -> Any:
        if sql.startswith("INSERT OR REPLACE INTO kv"):
            FailingOnce.writes += 1
            if FailingOnce.armed:
                FailingOnce.armed = False
                FailingOnce.failed += 1
                raise sqlite3.DatabaseError("database disk image is malformed")
        return self._db.executemany(sql, rows)


async def produce(bootstrap: str, topic: str, prefix: str, count: int) -> int:
    """``count`` records over 20 keys ``<prefix><k>``, the last of each ``v<k>``; returns the
    partition's end."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(count):
            sent = await producer.send(topic, f"v{i}".encode(), key=f"{prefix}{i % 20}".encode())
        offset: int = (await sent).offset
        return offset + 1
    finally:
        await producer.stop()


async def reached(standby: Standby, end: int) -> None:
    async with asyncio.timeout(60):
        while standby.position(0) != end:
            await asyncio.sleep(0.05)


async def test_a_copy_that_fails_is_read_again_from_the_start(
    kafka_bootstrap: str,
    kafka_topics: CreateTopics,
    unique_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    [topic] = await kafka_topics(f"{unique_name}-sessions", partitions=1)
    connect = sqlite3.connect
    monkeypatch.setattr(
        table_module.sqlite3, "connect", lambda *a, **kw: FailingOnce(connect(*a, **kw))
    )
    standby = Standby(
        KafkaSettings(bootstrap_servers=kafka_bootstrap), topic, tmp_path, max_age_s=3600
    )
    FailingOnce.failed = 0
    running = asyncio.create_task(standby.run())
    try:
        standby.follow([0])
        await reached(standby, await produce(kafka_bootstrap, topic, "a", 200))
        # The next write fails: the copy is thrown away and followed again from the start.
        FailingOnce.armed = True
        end = await produce(kafka_bootstrap, topic, "b", 200)
        await reached(standby, end)
        assert FailingOnce.failed == 1
        await standby.release(0)
        assert standby.position(0) is None
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    monkeypatch.undo()
    copy = SqliteTable(standby.folder(0), max_age_s=3600)
    try:
        assert copy.position == end
        for key in (f"{prefix}{k}" for prefix in "ab" for k in range(20)):
            value = copy.get(key.encode())
            assert value is not None and value[0] == f"v{180 + int(key[1:])}".encode(), key
    finally:
        copy.close()
