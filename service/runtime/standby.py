"""Standby copies of the partitions this instance does not own (``sessions.standby``).

Guarantee: a followed partition's local table holds committed records of the sessions topic
only (read ``read_committed``), applied in log order with the offset they reach, so it is always
a table an owner may trust: when this instance is given the partition, its owner reads only the
changelog written since. Following costs a reader of the sessions topic and a disk copy of every
partition the instance does not own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from service.runtime.clients import reader, started, stop_consumer
from service.sessions.store import event_seq_of
from service.sessions.table import SqliteTable, StoreBrokenError, StoreLockedError
from service.settings import KafkaSettings

logger = logging.getLogger(__name__)

RELEASE_S = 10.0
"""How long an owner waits for the follower to hand its partition's table over; past it the
owner goes on (and fails on the table's lock if the follower still holds it, to retry)."""
_RETRY_S = 1.0


class Standby:
    def __init__(self, kafka: KafkaSettings, topic: str, root: Path, *, max_age_s: float) -> None:
        self._kafka = kafka
        self._topic = topic
        self._root = root
        self._max_age_s = max_age_s
        self._wanted: set[int] = set()
        self._tables: dict[int, SqliteTable] = {}
        self._changed = asyncio.Event()
        self._synced = asyncio.Condition()

    def folder(self, partition: int) -> Path:
        return self._root / f"{self._topic}-{partition}"

    def follow(self, partitions: Iterable[int]) -> None:
        """Keep copies of these partitions (not owned here) from now on."""
        self._wanted |= set(partitions)
        self._changed.set()

    def position(self, partition: int) -> int | None:
        """The changelog offset the copy of ``partition`` has reached (None while not open)."""
        table = self._tables.get(partition)
        return None if table is None else table.position

    async def release(self, partition: int) -> None:
        """Stop following ``partition`` and close its table, for its owner to open."""
        self._wanted.discard(partition)
        self._changed.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(RELEASE_S), self._synced:
                await self._synced.wait_for(lambda: partition not in self._tables)

    async def run(self) -> None:
        consumer = await started(reader(self._kafka, max_partition_fetch_bytes=8 * 1024 * 1024))
        try:
            while True:
                if self._changed.is_set():
                    self._changed.clear()
                    await self._sync(consumer)
                if not self._tables:
                    await self._changed.wait()
                    continue
                batches = await consumer.getmany(timeout_ms=200, max_records=2_000)
                for tp, records in batches.items():
                    table = self._tables.get(tp.partition)
                    if table is None or not records:
                        continue
                    rows = [
                        (r.key, r.value, event_seq_of(list(r.headers)), r.timestamp)
                        for r in records
                        if r.key
                    ]
                    try:
                        table.apply(rows, records[-1].offset + 1)
                        table.mark_clean()
                    except StoreBrokenError as exc:
                        # Removed at close; the next sync opens it afresh from the start.
                        logger.warning(
                            "partition=<%d>, error=<%s> | standby copy failed: rebuilding it",
                            tp.partition,
                            exc,
                        )
                        self._tables.pop(tp.partition).close()
                        self._changed.set()
        finally:
            for table in self._tables.values():
                table.close()
            self._tables.clear()
            async with self._synced:
                self._synced.notify_all()
            await stop_consumer(consumer)

    async def _sync(self, consumer: AIOKafkaConsumer) -> None:
        """Close the tables of partitions no longer followed, open the new ones, and read each
        from the offset its table reached."""
        for partition in [p for p in self._tables if p not in self._wanted]:
            self._tables.pop(partition).close()
        missing = False
        for partition in sorted(self._wanted - self._tables.keys()):
            try:
                table = SqliteTable(self.folder(partition), max_age_s=self._max_age_s)
            except StoreLockedError:
                missing = True  # its owner has not closed it yet
                continue
            table.mark_clean()  # validated (or wiped) on opening, and written only from here
            self._tables[partition] = table
        if missing:
            asyncio.get_running_loop().call_later(_RETRY_S, self._changed.set)
        partitions = {TopicPartition(self._topic, p): t for p, t in self._tables.items()}
        if not partitions:
            consumer.unsubscribe()
        else:
            consumer.assign(list(partitions))
        for tp, table in partitions.items():
            if table.position:
                consumer.seek(tp, table.position)
            else:
                await consumer.seek_to_beginning(tp)
        async with self._synced:
            self._synced.notify_all()
        logger.info("partitions=<%s> | following as standby", sorted(self._tables))
