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
offsets unstable (a transaction of the previous owner still open) reads whose producer holds them
and fences it (:meth:`TransactionStream.fence`), which aborts that transaction at once instead of
after the broker's transaction timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import (
    CorruptRecordException,
    InvalidTimestampError,
    MessageSizeTooLargeError,
    ProducerFenced,
    RecordListTooLargeError,
)
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import OffsetAndMetadata

from service.runtime.clients import connection_options, transactional_producer
from service.runtime.faults import FaultPoints
from service.runtime.offset_fetch import UNSTABLE_OFFSET_COMMIT, StableOffsetFetch, fetched_all
from service.runtime.transactions import PROBE_KEY
from service.runtime.txn_offset_commit import GroupTxnOffsetCommit, Membership, partition_errors
from service.runtime.work import OutRecord
from service.settings import KafkaSettings

logger = logging.getLogger(__name__)

GROUP_COORDINATOR = 0
"""aiokafka's coordinator type for a consumer group."""

_FENCED_BY_GROUP = {22: "ILLEGAL_GENERATION", 25: "UNKNOWN_MEMBER_ID", 82: "FENCED_INSTANCE_ID"}
_REBALANCING = 27
_PRODUCER_FENCED = 47
_RETRIABLE = {7, 14, 15, 16}
"""REQUEST_TIMED_OUT, COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR."""
_CLOSE_S = 2.0


class CommitFailedError(RuntimeError):
    """A transaction failed or its outcome is unknown: its partitions start again from what is
    committed."""


class GroupFencedError(RuntimeError):
    """The consumer group refused a transaction's offsets: this instance's membership is not the
    group's current one (it lost its partitions, or a rebalance is under way)."""


UNWRITABLE_ERRORS: tuple[type[Exception], ...] = (
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    CorruptRecordException,
    InvalidTimestampError,
)
"""Produce errors that retrying the same records can never cure: the records are the problem."""


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
        kafka: KafkaSettings,
        transactional_id: str,
        group_id: str,
        sessions_topic: str,
        membership: Callable[[], Membership | None],
        transaction_timeout_ms: int,
        timeout_s: float,
        faults: FaultPoints,
    ) -> None:
        self._kafka = kafka
        self.transactional_id = transactional_id
        self._group_id = group_id
        self._sessions_topic = sessions_topic
        self._membership = membership
        self._transaction_timeout_ms = transaction_timeout_ms
        self._timeout_s = timeout_s
        self._faults = faults
        self._producer: AIOKafkaProducer | None = None
        self._client: AIOKafkaClient | None = None
        """For the group coordinator's offsets; outlives the producers the stream renews."""
        self._queue: list[Share] = []
        self._probes: list[tuple[list[TopicPartition], asyncio.Future[None]]] = []
        self._wakeup = asyncio.Event()
        self._partitioner = DefaultPartitioner()
        self._partitions: dict[str, list[int]] = {}
        self.transactions = 0
        """Transactions committed so far."""

    async def start(self) -> None:
        """Initialise the producer (its InitProducerId aborts what an earlier incarnation of the
        same transactional id left open)."""
        self._producer = await self._new_producer()
        self._client = AIOKafkaClient(
            **connection_options(self._kafka), client_id=f"{self._kafka.client_id}-offsets"
        )
        await self._client.bootstrap()

    async def close(self) -> None:
        await _close(self._producer)
        self._producer = None
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.close()
            self._client = None
        for share in self._queue:
            if not share.done.done():
                share.done.set_exception(CommitFailedError("the transaction stream stopped"))
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
        if not offsets:
            raise ValueError(f"partition {partition}: a share must carry its input offsets")
        share = Share(partition, records, offsets, claim)
        self._queue.append(share)
        self._wakeup.set()
        return await share.done

    async def abort_probe(self, partitions: list[TopicPartition]) -> None:
        """An abort-only transaction writing a probe record to each partition: its ABORT markers
        end whatever batches of this producer id are left open there."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._probes.append((partitions, future))
        self._wakeup.set()
        await future

    async def run(self) -> None:
        """Commit what partitions hand in, one transaction at a time, for ever."""
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            probes, self._probes = self._probes, []
            for partitions, future in probes:
                await self._probe(partitions, future)
            batch, self._queue = self._queue, []
            batch = [share for share in batch if not share.done.done()]
            if batch:
                await self._commit(batch)

    async def _probe(self, partitions: list[TopicPartition], future: asyncio.Future[None]) -> None:
        try:
            producer = await self._ready_producer()
            await producer.begin_transaction()
            try:
                for tp in partitions:
                    await producer.send(tp.topic, key=PROBE_KEY, value=None, partition=tp.partition)
            finally:
                await producer.abort_transaction()
        except Exception as exc:  # noqa: BLE001 - the asker gets it; the stream goes on
            await self._renew()
            if not future.done():
                future.set_exception(exc)
        else:
            if not future.done():
                future.set_result(None)

    async def _commit(self, batch: list[Share]) -> None:
        try:
            try:
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
        except Exception as exc:  # noqa: BLE001 - every share of the transaction learns of it
            await self._renew()
            _fail(batch, exc)
            return
        self.transactions += 1
        for share in batch:
            if not share.done.done():
                share.done.set_result(positions.get(share.partition, 0))

    async def _transact(self, batch: list[Share]) -> dict[int, int]:
        producer = await self._ready_producer()
        deliveries: list[asyncio.Future[Any]] = []
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        for share in batch:
            for tp, committed in share.offsets.items():
                offsets[tp] = OffsetAndMetadata(committed.offset, self.transactional_id)
        try:
            await producer.begin_transaction()
            states = await self._send(producer, batch, deliveries)
            membership = self._current_membership()
            # aiokafka's own offset commit (version 0, no membership) adds the group to the
            # transaction; the version 3 commit of the same offsets is what the group checks.
            await producer.send_offsets_to_transaction(offsets, self._group_id)
            await self._commit_offsets(producer, membership, offsets)
            if deliveries:
                await asyncio.gather(*deliveries)
            positions: dict[int, int] = {}
            for partition, delivery, count in states:
                end = delivery.result().offset + count
                positions[partition] = max(positions.get(partition, 0), end)
            counted = not all(share.claim for share in batch)
            if counted:
                self._faults.reached("after_produce_before_commit")
            await producer.commit_transaction()
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

    async def _commit_offsets(
        self,
        producer: AIOKafkaProducer,
        membership: Membership,
        offsets: dict[TopicPartition, OffsetAndMetadata],
    ) -> None:
        client = producer.client
        manager = producer._txn_manager
        while True:
            node = await client.coordinator_lookup(GROUP_COORDINATOR, self._group_id)
            request = GroupTxnOffsetCommit(
                transactional_id=self.transactional_id,
                group_id=self._group_id,
                producer_id=manager.producer_id,
                producer_epoch=manager.producer_epoch,
                membership=membership,
                offsets=offsets,
            )
            errors = set(partition_errors(await client.send(node, request)).values())
            errors.discard(0)
            if not errors:
                return
            if fenced := errors & _FENCED_BY_GROUP.keys():
                raise GroupFencedError(
                    f"the group refused the offsets: {_FENCED_BY_GROUP[min(fenced)]} "
                    f"(generation {membership.generation_id})"
                )
            if _REBALANCING in errors:
                raise GroupFencedError("the group is rebalancing")
            if _PRODUCER_FENCED in errors:
                raise ProducerFenced()
            if not errors <= _RETRIABLE:
                raise CommitFailedError(f"the offset commit failed with error codes {errors}")
            await asyncio.sleep(0.02)

    async def _send(
        self, producer: AIOKafkaProducer, batch: list[Share], deliveries: list[asyncio.Future[Any]]
    ) -> list[tuple[int, asyncio.Future[Any], int]]:
        """One record batch per output partition (far cheaper than a send per record), in order;
        each delivery future goes into ``deliveries`` as soon as it exists. Returns the
        deliveries to sessions partitions with the partition and their record counts."""
        states: list[tuple[int, asyncio.Future[Any], int]] = []

        def sent(delivery: asyncio.Future[Any], topic: str, partition: int, count: int) -> None:
            deliveries.append(delivery)
            if topic == self._sessions_topic:
                states.append((partition, delivery, count))

        groups: dict[tuple[str, int], list[OutRecord]] = {}
        for share in batch:
            for record in share.records:
                partition = record.partition
                if partition is None:
                    partition = await self._partition_of(producer, record.topic, record.key)
                groups.setdefault((record.topic, partition), []).append(record)
        for (topic, partition), group in groups.items():
            records_batch = producer.create_batch()
            for record in group:
                if _append(records_batch, record):
                    continue
                if count := records_batch.record_count():
                    delivery = await producer.send_batch(records_batch, topic, partition=partition)
                    sent(delivery, topic, partition, count)
                    records_batch = producer.create_batch()
                    if _append(records_batch, record):
                        continue
                # Larger than a whole batch: it travels alone.
                alone = await producer.send(
                    topic,
                    value=record.value,
                    key=record.key,
                    partition=partition,
                    headers=record.headers,
                )
                sent(alone, topic, partition, 1)
            if count := records_batch.record_count():
                delivery = await producer.send_batch(records_batch, topic, partition=partition)
                sent(delivery, topic, partition, count)
        return states

    async def _partition_of(self, producer: AIOKafkaProducer, topic: str, key: bytes | None) -> int:
        """The partition the default partitioner picks for a key (as a keyed send would)."""
        partitions = self._partitions.get(topic)
        if partitions is None:
            partitions = sorted(await producer.partitions_for(topic))
            self._partitions[topic] = partitions
        return int(self._partitioner(key, partitions, partitions))

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
        client = self._client
        if client is None:
            raise CommitFailedError("the transaction stream is not started")
        node = await client.coordinator_lookup(GROUP_COORDINATOR, self._group_id)
        request = StableOffsetFetch(self._group_id, partitions, require_stable=require_stable)
        found = fetched_all(await client.send(node, request))
        errors = {error for _, _, error in found.values()} - {0, UNSTABLE_OFFSET_COMMIT}
        if errors:
            raise CommitFailedError(f"the offset fetch failed with error codes {errors}")
        return found

    async def fence(self, transactional_id: str) -> None:
        """Fence the producer of another transactional id: its InitProducerId aborts the
        transaction that producer has open (no-op for this stream's own id)."""
        if transactional_id == self.transactional_id:
            return
        logger.warning(
            "transactional_id=<%s> | fencing the producer that holds this partition's offsets",
            transactional_id,
        )
        producer = transactional_producer(
            self._kafka, transactional_id, transaction_timeout_ms=self._transaction_timeout_ms
        )
        try:
            await producer.start()
        finally:
            await _close(producer)

    async def abort_as(self, transactional_id: str, partitions: list[TopicPartition]) -> None:
        """An abort-only transaction of ``transactional_id`` on ``partitions`` (this stream's own
        when it is ours): its markers end the batches that producer id left open there."""
        if transactional_id == self.transactional_id:
            await self.abort_probe(partitions)
            return
        producer = transactional_producer(
            self._kafka, transactional_id, transaction_timeout_ms=self._transaction_timeout_ms
        )
        try:
            await producer.start()
            await producer.begin_transaction()
            try:
                for tp in partitions:
                    await producer.send(tp.topic, key=PROBE_KEY, value=None, partition=tp.partition)
            finally:
                await producer.abort_transaction()
        finally:
            await _close(producer)

    async def _ready_producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            self._producer = await self._new_producer()
        return self._producer

    async def _new_producer(self) -> AIOKafkaProducer:
        producer = transactional_producer(
            self._kafka, self.transactional_id, transaction_timeout_ms=self._transaction_timeout_ms
        )
        try:
            await producer.start()
        except BaseException:
            await _close(producer)
            raise
        return producer

    async def _renew(self) -> None:
        """Throw the producer away; the next transaction starts a fresh one (a new epoch, which
        aborts what the old one left open and resets its sequence numbers)."""
        producer, self._producer = self._producer, None
        await _close(producer)


def _loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


def _fail(batch: list[Share], exc: BaseException) -> None:
    for share in batch:
        if not share.done.done():
            share.done.set_exception(exc)


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


async def _close(producer: AIOKafkaProducer | None) -> None:
    """Stop a producer within a bound; an open transaction it leaves is aborted by the next
    InitProducerId of its transactional id."""
    if producer is None:
        return
    with contextlib.suppress(Exception):
        async with asyncio.timeout(_CLOSE_S):
            await producer.stop()
    discard_leftovers(producer)
