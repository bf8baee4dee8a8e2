"""The transaction stream of one instance: one transactional producer for every partition it owns.

Guarantees: the work partitions hand in while a transaction is open forms the next one, so an
instance runs one transaction at a time whatever its partition count; a partition's share (its
records, its session state, its input offsets) becomes visible with the rest of its transaction
or not at all; every transaction commits its input offsets under the consumer group membership
current when it is sent (TxnOffsetCommit v3), so the group coordinator refuses the transaction of
an instance that lost its partitions (a zombie) and the transaction is aborted, never committed;
a member outside any generation sends nothing. A share the broker refuses for good is retried
alone, so only its own partition sees the refusal.

The offsets carry the transactional id as their metadata: a new owner that finds a partition's
offsets unstable (a transaction of the previous owner still open, or offsets a broker restart left
pending) reads whose producer holds them and releases them
(:meth:`TransactionStream.release_offsets`), which aborts that transaction at once instead of
after the broker's transaction timeout, and ends pending offsets no transaction would ever end.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from aiokafka import TopicPartition
from aiokafka.errors import (
    CorruptRecordException,
    InvalidProducerEpoch,
    InvalidTimestampError,
    MessageSizeTooLargeError,
    ProducerFenced,
    RecordListTooLargeError,
)
from aiokafka.structs import OffsetAndMetadata

from service.runtime.faults import FaultPoints
from service.runtime.offset_fetch import UNSTABLE_OFFSET_COMMIT
from service.runtime.transactions import PROBE_KEY
from service.runtime.transport import (
    CommitFailedError,
    Delivery,
    GroupFencedError,
    Transport,
    TxnProducer,
    discard,
)
from service.runtime.txn_offset_commit import Membership
from service.runtime.work import OutRecord

__all__ = [
    "UNWRITABLE_ERRORS",
    "CommitFailedError",
    "GroupFencedError",
    "Share",
    "TransactionStream",
]

logger = logging.getLogger(__name__)

UNWRITABLE_ERRORS: tuple[type[Exception], ...] = (
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    CorruptRecordException,
    InvalidTimestampError,
)
"""Produce errors that retrying the same records can never cure: the records are the problem."""

FENCED_ERRORS: tuple[type[Exception], ...] = (ProducerFenced, InvalidProducerEpoch)
"""Another producer took the transactional id over: a new owner of what this stream wrote for.
The stream does not start a producer again at once (that would fence the new owner in turn);
the next transaction does, if one comes. A membership that is over (a pause past the session
timeout; a static member replaced under the same instance id) may mean the same: the stream
then only aborts with the producer it has."""


@dataclass(eq=False, slots=True)
class Share:
    """One partition's part of a transaction."""

    partition: int
    records: list[OutRecord]
    offsets: dict[TopicPartition, OffsetAndMetadata]
    claim: bool = False
    done: asyncio.Future[int] = field(default_factory=lambda: _loop().create_future())
    """Resolves to the sessions offset after this share's state records once committed."""


class TransactionStream:
    def __init__(
        self,
        *,
        transport: Transport,
        transactional_id: str,
        group_id: str,
        sessions_topic: str,
        membership: Callable[[], Membership | None],
        timeout_s: float,
        faults: FaultPoints,
        shared: bool = True,
        on_transaction: Callable[[float], None] | None = None,
    ) -> None:
        self._transport = transport
        self._on_transaction = on_transaction
        """Called with the seconds of each committed transaction (abort-only ones excluded)."""
        self.shared = shared
        """Shared by the partitions of an instance: every share must carry its input offsets (the
        group generation they are committed under is what fences a zombie). A stream of one
        partition is fenced by its transactional id instead, and a share may carry none."""
        self.transactional_id = transactional_id
        self._group_id = group_id
        self._sessions_topic = sessions_topic
        self._membership = membership
        self._timeout_s = timeout_s
        self._faults = faults
        self._producer: TxnProducer | None = None
        self._queue: list[Share] = []
        self._probes: list[tuple[list[TopicPartition], bool, asyncio.Future[None]]] = []
        self._wakeup = asyncio.Event()
        self.transactions = 0
        """Transactions committed so far."""

    async def start(self) -> None:
        """Initialise the producer: its InitProducerId aborts what an earlier incarnation of the
        same transactional id left open. (The transport's group offsets reader is started by
        whoever made the transport.)"""
        self._producer = await self._new_producer()

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.close()
        _fail(self._queue, CommitFailedError("the transaction stream stopped"))
        self._queue.clear()

    async def transact(
        self,
        partition: int,
        records: list[OutRecord],
        offsets: dict[TopicPartition, OffsetAndMetadata],
        *,
        claim: bool = False,
    ) -> int:
        """Commit ``records`` and ``offsets`` of ``partition`` with the next transaction; returns
        the sessions offset after the state records written. Every share carries offsets: they
        are what the group coordinator fences a zombie's transaction by. A ``claim`` (a new
        owner's first commit) alone in its transaction passes no fault point."""
        if self.shared and not offsets:
            raise ValueError(f"partition {partition}: a share must carry its input offsets")
        share = Share(partition, records, offsets, claim)
        self._queue.append(share)
        self._wakeup.set()
        return await share.done

    async def abort_probe(self, partitions: list[TopicPartition], *, group: bool = False) -> None:
        """An abort-only transaction writing a probe record to each partition (and, with
        ``group``, adding the group's offsets): its ABORT markers end whatever batches, and
        pending offsets, of this producer id are left open there."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._probes.append((partitions, group, future))
        self._wakeup.set()
        await future

    async def run(self) -> None:
        """Commit what partitions hand in, one transaction at a time, for ever."""
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            probes, self._probes = self._probes, []
            for partitions, group, future in probes:
                await self._probe(partitions, group, future)
            batch, self._queue = self._queue, []
            batch = [share for share in batch if not share.done.done()]
            if batch:
                await self._commit(batch)

    async def _probe(
        self, partitions: list[TopicPartition], group: bool, future: asyncio.Future[None]
    ) -> None:
        try:
            producer = await self._ready_producer()
            await _abort_only(producer, partitions, self._group_id if group else None)
        except Exception as exc:  # noqa: BLE001 - the asker gets it; the stream goes on
            await (self._drop() if isinstance(exc, FENCED_ERRORS) else self._renew())
            if not future.done():
                future.set_exception(exc)
        else:
            if not future.done():
                future.set_result(None)

    async def _commit(self, batch: list[Share]) -> None:
        try:
            try:
                started = time.monotonic()
                async with asyncio.timeout(self._timeout_s):
                    positions = await self._transact(batch)
            except TimeoutError as exc:
                raise CommitFailedError(
                    f"a transaction of {len(batch)} partitions timed out"
                ) from exc
        except UNWRITABLE_ERRORS as exc:
            # The transaction can only abort; which share the broker refused is not known.
            await self._renew()
            if len(batch) == 1:
                _fail(batch, exc)
                return
            for share in batch:
                await self._commit([share])
            return
        except GroupFencedError as exc:
            await self._abort_or_drop()
            _fail(batch, exc)
            return
        except FENCED_ERRORS as exc:
            await self._drop()
            _fail(batch, exc)
            return
        except Exception as exc:  # noqa: BLE001 - every share of the transaction learns of it
            # A partition's own stream ends with its owner, which this fails: a producer started
            # now would only fence the partition's next owner (see FENCED_ERRORS).
            await (self._renew() if self.shared else self._drop())
            _fail(batch, exc)
            return
        self.transactions += 1
        if self._on_transaction is not None:
            self._on_transaction(time.monotonic() - started)
        for share in batch:
            if not share.done.done():
                share.done.set_result(positions.get(share.partition, 0))

    async def _transact(self, batch: list[Share]) -> dict[int, int]:
        producer = await self._ready_producer()
        deliveries: list[asyncio.Future[int]] = []
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        for share in batch:
            for tp, committed in share.offsets.items():
                offsets[tp] = OffsetAndMetadata(committed.offset, self.transactional_id)
        counted = not all(share.claim for share in batch)
        try:
            await producer.begin()
            states = await self._send(producer, batch, deliveries)
            if offsets:
                membership = self._current_membership()
                await producer.commit_offsets(self._group_id, membership, offsets)
            if deliveries:
                await asyncio.gather(*deliveries)
            positions: dict[int, int] = {}
            for partition, (delivery, count) in states:
                end = delivery.result() + count
                positions[partition] = max(positions.get(partition, 0), end)
            if counted:
                self._faults.reached("after_produce_before_commit")
            await producer.commit()
        except BaseException:
            discard(deliveries)
            raise
        if counted:
            self._faults.reached("after_commit")
        return positions

    def _current_membership(self) -> Membership:
        membership = self._membership()
        if membership is None:
            raise GroupFencedError("not a member of a consumer group generation")
        return membership

    async def _send(
        self, producer: TxnProducer, batch: list[Share], deliveries: list[asyncio.Future[int]]
    ) -> list[tuple[int, Delivery]]:
        """Every share's records, grouped by output partition in order; each delivery goes into
        ``deliveries`` as soon as it exists. Returns the deliveries to sessions partitions with
        their partition."""
        groups: dict[tuple[str, int], list[OutRecord]] = {}
        for share in batch:
            for record in share.records:
                partition = record.partition
                if partition is None:
                    partition = await producer.partition_of(record.topic, record.key)
                groups.setdefault((record.topic, partition), []).append(record)
        states: list[tuple[int, Delivery]] = []
        for (topic, partition), group in groups.items():
            for delivery in await producer.send(topic, partition, group):
                deliveries.append(delivery[0])
                if topic == self._sessions_topic:
                    states.append((partition, delivery))
        return states

    async def stable_offsets(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, tuple[int, str]] | None:
        """The group's committed offsets of ``partitions`` with their metadata once no open
        transaction may still move them; None while one may (``UNSTABLE_OFFSET_COMMIT``)."""
        found = await self._fetch(partitions, require_stable=True)
        if any(error == UNSTABLE_OFFSET_COMMIT for _, _, error in found.values()):
            return None
        return {tp: (offset, metadata) for tp, (offset, metadata, _) in found.items()}

    async def committed_metadata(self, partitions: Iterable[TopicPartition]) -> set[str]:
        """The metadata of the offsets committed so far (transactional ids of their writers)."""
        found = await self._fetch(partitions, require_stable=False)
        return {metadata for _, metadata, _ in found.values() if metadata}

    async def _fetch(
        self, partitions: Iterable[TopicPartition], *, require_stable: bool
    ) -> dict[TopicPartition, tuple[int, str, int]]:
        asked = list(partitions)
        found = await self._transport.offsets.fetch(
            self._group_id, asked, require_stable=require_stable
        )
        errors = {error for _, _, error in found.values()} - {0, UNSTABLE_OFFSET_COMMIT}
        if errors:
            raise CommitFailedError(f"the offset fetch failed with error codes {sorted(errors)}")
        missing = sorted(set(asked) - found.keys())
        if missing:
            # Not "nothing committed": an owner would start wherever its consumer happens to be.
            raise CommitFailedError(f"the offset fetch left out {missing}")
        return found

    async def release_offsets(self, transactional_id: str) -> None:
        """End what the producer of ``transactional_id`` holds of the group's offsets: an
        abort-only transaction of that id that adds the group's offsets. For another id it runs
        on a producer of its own, whose InitProducerId first fences that producer and aborts the
        transaction it has open; its ABORT marker on the group's offsets partition then ends
        offsets that producer id left pending with no transaction the coordinator still knows
        of (a commit whose markers a broker restart dropped), which no InitProducerId ends."""
        if transactional_id == self.transactional_id:
            logger.warning(
                "transactional_id=<%s> | ending what this instance's own producer holds of the "
                "partition's offsets",
                transactional_id,
            )
            await self.abort_probe([], group=True)
            return
        logger.warning(
            "transactional_id=<%s> | fencing the producer that holds this partition's offsets, "
            "then ending what it holds of them",
            transactional_id,
        )
        producer = self._transport.producer(transactional_id)
        try:
            await producer.start()
            await _abort_only(producer, [], self._group_id)
        finally:
            await producer.close()

    async def abort_as(self, transactional_id: str, partitions: list[TopicPartition]) -> None:
        """An abort-only transaction of ``transactional_id`` on ``partitions`` (this stream's own
        when it is ours): its markers end the batches that producer id left open there."""
        if transactional_id == self.transactional_id:
            await self.abort_probe(partitions)
            return
        producer = self._transport.producer(transactional_id)
        try:
            await producer.start()
            await _abort_only(producer, partitions)
        finally:
            await producer.close()

    async def _ready_producer(self) -> TxnProducer:
        if self._producer is None:
            self._producer = await self._new_producer()
        return self._producer

    async def _new_producer(self) -> TxnProducer:
        producer = self._transport.producer(self.transactional_id)
        try:
            await producer.start()
        except BaseException:
            await producer.close()
            raise
        return producer

    async def _abort_or_drop(self) -> None:
        """End the open transaction under the producer's own epoch, which fences nobody (a
        producer that took the transactional id over makes the broker refuse it); a producer
        that cannot abort is dropped, and the next transaction, if any, starts another."""
        producer = self._producer
        if producer is None:
            return
        try:
            async with asyncio.timeout(self._timeout_s):
                await producer.abort()
        except Exception:  # noqa: BLE001 - fenced or unreachable: nothing more to end here
            await self._drop()

    async def _drop(self) -> None:
        """Throw the fenced producer away; the next transaction, if any, starts another."""
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.close()

    async def _renew(self) -> None:
        """Throw the producer away and start a fresh one: its new epoch aborts the transaction
        the old one left open at once (it would otherwise hold back the last stable offset of
        every partition it wrote to until the broker's transaction timeout) and resets the
        sequence numbers. If the broker cannot be reached now, the next transaction tries."""
        await self._drop()
        try:
            async with asyncio.timeout(self._timeout_s):
                self._producer = await self._new_producer()
        except Exception as exc:  # noqa: BLE001 - retried by the next transaction
            logger.warning(
                "error=<%r> | producer not renewed yet, the next transaction retries", exc
            )


async def _abort_only(
    producer: TxnProducer, partitions: list[TopicPartition], group_id: str | None = None
) -> None:
    await producer.begin()
    try:
        if group_id is not None:
            await producer.add_group(group_id)
        for tp in partitions:
            probe = OutRecord(tp.topic, PROBE_KEY, None, partition=tp.partition)
            for delivery, _ in await producer.send(tp.topic, tp.partition, [probe]):
                await delivery
    finally:
        await producer.abort()


def _loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


def _fail(batch: list[Share], exc: BaseException) -> None:
    for share in batch:
        if not share.done.done():
            share.done.set_exception(exc)
