"""The committer of one partition: batches finished work into one short transaction at a time.

Guarantee: an outcome's records, its session state and the input offsets it finishes become
visible together or not at all; transactions never span a model or tool call (they hold only
work already done), one partition has at most one transaction open at any moment, and a final
flush puts the input offsets into the partition's last commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import (
    CorruptRecordException,
    InvalidTimestampError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
)
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import OffsetAndMetadata

from service.observability.metrics import Metrics
from service.runtime.commit_stats import CommitReport
from service.runtime.faults import FaultPoints
from service.runtime.offsets import OffsetTracker
from service.runtime.work import Outcome, OutRecord
from service.sessions.store import event_seq_header, event_seq_of
from service.sessions.table import Row

logger = logging.getLogger(__name__)

CommitObserver = Callable[[CommitReport], None]
"""Called after each commit with what it held and how long it took."""


class CommitFailedError(RuntimeError):
    """A transaction failed or its outcome is unknown: the producer must be thrown away."""


UNWRITABLE_ERRORS: tuple[type[Exception], ...] = (
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    CorruptRecordException,
    InvalidTimestampError,
)
"""Produce errors that retrying the same records can never cure: the records are the problem."""

DurableObserver = Callable[[list[Row], int, dict[str, int]], None]
"""Told of the session state records of each committed transaction, in log order, with the
sessions offset after them and the store version each session's write had."""

ProducerFactory = Callable[[], Awaitable[AIOKafkaProducer]]
"""Throws the current producer away and returns a started new one with the same transactional
id (its InitProducerId aborts what the old one left open and resets its sequence numbers)."""


class Committer:
    def __init__(
        self,
        *,
        producer: AIOKafkaProducer,
        group_id: str,
        sessions_topic: str,
        partition: int,
        trackers: dict[str, OffsetTracker],
        interval_s: float,
        offsets_every_s: float,
        timeout_s: float,
        faults: FaultPoints,
        observer: CommitObserver | None = None,
        on_finished: Callable[[int], None] | None = None,
        renew_producer: ProducerFactory | None = None,
        on_durable: DurableObserver | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._producer = producer
        self._renew_producer = renew_producer
        self._on_durable = on_durable
        self._store_stale = False
        self._metrics = metrics if metrics is not None else Metrics()
        self._group_id = group_id
        self._sessions_topic = sessions_topic
        self._partition = partition
        self._trackers = trackers
        self._interval_s = interval_s
        self._offsets_every_s = offsets_every_s
        self._offsets_committed_at = 0.0
        self._offsets_lagging = False
        self._timeout_s = timeout_s
        self._faults = faults
        self._observer = observer
        self._on_finished = on_finished
        self._pending: list[Outcome] = []
        self._partitions: dict[str, list[int]] = {}
        self._partitioner = DefaultPartitioner()
        self._wakeup = asyncio.Event()
        self._submitted = 0
        self._committed = 0
        self._offsets_asked = 0
        self._offsets_served = 0
        self._final = False
        self.transactions = 0
        """Transactions committed so far."""
        self._progress = asyncio.Condition()

    def submit(self, outcome: Outcome) -> None:
        self._pending.append(outcome)
        self._submitted += 1
        self._wakeup.set()

    async def flush(self, *, final: bool = False) -> None:
        """Wait until everything submitted so far is committed (or the committer died).

        ``final`` is the flush before the partition is handed over: it waits for a commit that
        puts the input offsets in, whatever ``offsets_every_s`` says, so the next owner does not
        re-read commands already answered; every later commit carries them too.
        """
        target = self._submitted
        asked = self._offsets_asked
        if final:
            self._final = True
            asked = self._offsets_asked = self._offsets_asked + 1
            self._wakeup.set()
        async with self._progress:
            await self._progress.wait_for(
                lambda: self._committed >= target and self._offsets_served >= asked
            )

    async def run(self) -> None:
        """Commit forever; raises :class:`CommitFailedError` (or a fencing error) on failure."""
        last_start = 0.0
        while True:
            if self._offsets_lagging:
                # Idle with offsets behind: an offsets-only commit follows after the interval.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._offsets_every_s):
                        await self._wakeup.wait()
            else:
                await self._wakeup.wait()
            delay = last_start + self._interval_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            self._wakeup.clear()
            batch, self._pending = self._pending, []
            if not batch and not self._offsets_lagging and not self._offsets_due:
                continue
            last_start = time.monotonic()
            await self._commit(batch)
            async with self._progress:
                self._committed += len(batch)
                self._progress.notify_all()

    @property
    def _offsets_due(self) -> bool:
        return self._offsets_asked > self._offsets_served

    async def _commit(self, batch: list[Outcome]) -> None:
        started = time.monotonic()
        records, results, states = self._records_of(batch)
        finished = 0
        for outcome in batch:
            finished += len(outcome.finished)
            for origin in outcome.finished:
                self._trackers[origin.topic].finished(origin.offset)
        offsets = {}
        asked = self._offsets_asked
        if (
            not batch
            or self._final
            or any(outcome.replay_unsafe for outcome in batch)
            or started - self._offsets_committed_at >= self._offsets_every_s
        ):
            for topic, tracker in self._trackers.items():
                position = tracker.take_commit()
                if position is not None:
                    tp = TopicPartition(topic, self._partition)
                    offsets[tp] = OffsetAndMetadata(position, "")
            self._offsets_committed_at = started
        self._offsets_lagging = any(
            tracker.position != tracker.committed for tracker in self._trackers.values()
        )
        if records or offsets:
            try:
                position = await self._transact_in_time(records, offsets)
            except UNWRITABLE_ERRORS as exc:
                await self._isolate(batch, offsets, exc)
            else:
                self._made_durable(batch, states, position)
        self._offsets_served = asked
        elapsed = time.monotonic() - started
        if self._on_finished is not None:
            self._on_finished(finished)
        if self._observer is not None:
            self._observer(
                CommitReport(
                    seconds=elapsed,
                    outcomes=len(batch),
                    records=len(records),
                    results=results,
                    state_bytes=sum(len(s.value or b"") for s in states),
                    states=len(states),
                )
            )

    async def _transact_in_time(
        self, records: list[OutRecord], offsets: dict[TopicPartition, OffsetAndMetadata]
    ) -> int:
        """Commit one transaction; returns the sessions offset after what it wrote there."""
        try:
            async with asyncio.timeout(self._timeout_s):
                position = await self._transact(records, offsets)
        except TimeoutError as exc:
            raise CommitFailedError(f"commit of partition {self._partition} timed out") from exc
        self.transactions += 1
        return position

    async def _isolate(
        self,
        batch: list[Outcome],
        offsets: dict[TopicPartition, OffsetAndMetadata],
        error: BaseException,
    ) -> None:
        """The broker refused some record of ``batch`` for good: commit its outcomes one by one,
        each refused one replaced by its fallback (or dropped), then the input offsets.

        Retrying the batch as it is would fail the same way for ever and stop the partition.
        """
        logger.warning(
            "partition=<%d>, outcomes=<%d>, error=<%s> | a record was refused for good, "
            "committing the batch's outcomes one by one",
            self._partition,
            len(batch),
            error,
        )
        await self._renew()
        refused: set[str] = set()
        for outcome in batch:
            state = outcome.state
            if state is not None and state.session_id in refused:
                # Written as a change of the refused state, which is not on the changelog: the
                # owner starts again from what is, and the rest of the batch is redone.
                raise CommitFailedError(
                    f"partition {self._partition}: a later write of session "
                    f"{state.session_id!r} follows one the broker refused"
                )
            if not await self._commit_alone(outcome) and state is not None:
                refused.add(state.session_id)
        if offsets:
            await self._transact_in_time([], offsets)
        if self._store_stale:
            # The store holds a session state the changelog does not: start again from it.
            raise CommitFailedError(
                f"partition {self._partition}: a session state was refused and dropped"
            )

    async def _commit_alone(self, outcome: Outcome) -> bool:
        """Commit one outcome, or what replaces it; False when it was refused."""
        records, _, states = self._records_of([outcome])
        if not records:
            return True
        try:
            position = await self._transact_in_time(records, {})
        except UNWRITABLE_ERRORS as exc:
            await self._renew()
            outcome.unwritten = exc
        else:
            self._made_durable([outcome], states, position)
            return True
        replacement = outcome.fallback(outcome.unwritten) if outcome.fallback else None
        if replacement is not None:
            records, _, states = self._records_of([replacement])
            try:
                position = await self._transact_in_time(records, {})
            except UNWRITABLE_ERRORS:
                await self._renew()
            else:
                self._made_durable([replacement], states, position)
                self._metrics.unwritable("fallback")
                logger.error(
                    "partition=<%d>, error=<%s> | output refused by the broker, "
                    "answered with a small error result and dead-lettered instead",
                    self._partition,
                    outcome.unwritten,
                )
                return False
        self._metrics.unwritable("dropped")
        logger.error(
            "partition=<%d>, records=<%d>, error=<%s> | output refused by the broker and "
            "nothing could be written in its place: dropped",
            self._partition,
            len(records),
            outcome.unwritten,
        )
        if outcome.state is not None:
            self._store_stale = True
        return False

    async def _renew(self) -> None:
        """A refused record leaves the producer's transaction abortable only and its sequence
        numbers ahead of the broker's; a fresh producer (new epoch) starts clean."""
        if self._renew_producer is None:
            with contextlib.suppress(Exception):
                await self._producer.abort_transaction()
            return
        self._producer = await self._renew_producer()

    async def _transact(
        self, records: list[OutRecord], offsets: dict[TopicPartition, OffsetAndMetadata]
    ) -> int:
        producer = self._producer
        deliveries: list[asyncio.Future[object]] = []
        position = 0
        try:
            await producer.begin_transaction()
            states = await self._send_batched(records, deliveries)
            if offsets:
                await producer.send_offsets_to_transaction(offsets, self._group_id)
            if deliveries:
                await asyncio.gather(*deliveries)
            for delivery, count in states:
                position = max(position, delivery.result().offset + count)
            self._faults.reached("after_produce_before_commit")
            await producer.commit_transaction()
        except BaseException:
            # A failed transaction leaves delivery futures nobody awaits; their exceptions
            # would surface later as "Future exception was never retrieved".
            discard(deliveries)
            raise
        self._faults.reached("after_commit")
        return position

    async def _send_batched(
        self, records: list[OutRecord], deliveries: list[asyncio.Future[object]]
    ) -> list[tuple[asyncio.Future[Any], int]]:
        """One record batch per partition (far cheaper than a send per record), in order;
        each delivery future goes into ``deliveries`` as soon as it exists. Returns the
        deliveries to the sessions partition with their record counts."""
        producer = self._producer
        states: list[tuple[asyncio.Future[Any], int]] = []

        def sent(delivery: asyncio.Future[Any], topic: str, count: int) -> None:
            deliveries.append(delivery)
            if topic == self._sessions_topic:
                states.append((delivery, count))

        groups: dict[tuple[str, int], list[OutRecord]] = {}
        for record in records:
            partition = record.partition
            if partition is None:
                partition = await self._partition_of(record.topic, record.key)
            groups.setdefault((record.topic, partition), []).append(record)
        for (topic, partition), group in groups.items():
            batch = producer.create_batch()
            for record in group:
                if _append(batch, record):
                    continue
                if count := batch.record_count():
                    sent(await producer.send_batch(batch, topic, partition=partition), topic, count)
                    batch = producer.create_batch()
                    if _append(batch, record):
                        continue
                # Larger than a whole batch: it travels alone.
                alone = await producer.send(
                    topic,
                    value=record.value,
                    key=record.key,
                    partition=partition,
                    headers=record.headers,
                )
                sent(alone, topic, 1)
            if count := batch.record_count():
                sent(await producer.send_batch(batch, topic, partition=partition), topic, count)
        return states

    async def _partition_of(self, topic: str, key: bytes | None) -> int:
        """The partition the default partitioner picks for a key (as a keyed send would)."""
        partitions = self._partitions.get(topic)
        if partitions is None:
            partitions = sorted(await self._producer.partitions_for(topic))
            self._partitions[topic] = partitions
        return int(self._partitioner(key, partitions, partitions))

    def _records_of(self, batch: list[Outcome]) -> tuple[list[OutRecord], int, list[OutRecord]]:
        """Every record of the batch in order, then the session state records: of a key written
        twice only the last, in the place of its last write (each session's head after its
        history records)."""
        records: list[OutRecord] = []
        states: dict[bytes, OutRecord] = {}
        results = 0
        for outcome in batch:
            records.extend(outcome.records)
            results += outcome.results
            state = outcome.state
            if state is None:
                continue
            head = state.session_id.encode()
            for key, value in state.records:
                states.pop(key, None)
                states[key] = OutRecord(
                    topic=self._sessions_topic,
                    key=key,
                    value=value,
                    headers=[event_seq_header(state.event_seq)] if key == head else [],
                    partition=self._partition,
                )
        records.extend(states.values())
        return records, results, list(states.values())

    def _made_durable(self, batch: list[Outcome], states: list[OutRecord], position: int) -> None:
        if self._on_durable is None or not states:
            return
        versions = {o.state.session_id: o.state.version for o in batch if o.state is not None}
        now_ms = int(time.time() * 1000)
        rows = [(r.key or b"", r.value, event_seq_of(r.headers), now_ms) for r in states]
        self._on_durable(rows, position, versions)


def _append(batch: Any, record: OutRecord) -> bool:
    appended = batch.append(
        timestamp=None, key=record.key, value=record.value, headers=record.headers
    )
    return appended is not None


def discard(futures: Iterable[asyncio.Future[Any]]) -> None:
    """Give up on futures nobody will await: a finished one has its exception retrieved, a
    pending one is cancelled (a shielded delivery then retrieves its inner future itself)."""
    for future in futures:
        if not future.done():
            future.cancel()
        elif not future.cancelled():
            future.exception()


def discard_leftovers(producer: AIOKafkaProducer) -> None:
    """Retrieve the failures a stopped producer keeps inside aiokafka (0.14): the waiter of a
    transaction that never reached its commit and the drain waiters of batches that never
    reached a broker. Nothing awaits them, so each would be reported as never retrieved."""
    leftovers: list[asyncio.Future[Any]] = []
    txn = getattr(producer, "_txn_manager", None)
    waiter = txn.wait_for_transaction_end() if txn is not None else None
    if waiter is not None:
        leftovers.append(waiter)
    accumulator = getattr(producer, "_message_accumulator", None)
    if accumulator is not None:
        for batches in getattr(accumulator, "_batches", {}).values():
            leftovers.extend(batch._drain_waiter for batch in batches)
        leftovers.extend(
            batch._drain_waiter for batch in getattr(accumulator, "_pending_batches", ())
        )
    for future in leftovers:
        if future.done() and not future.cancelled():
            future.exception()
