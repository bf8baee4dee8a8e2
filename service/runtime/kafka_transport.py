"""The aiokafka implementation of the transport (``transport.py``): the group consumer as an
:class:`~service.runtime.transport.InputSource`, aiokafka's transactional producer as a
:class:`~service.runtime.transport.TxnProducer` (Kafka's transactions version 1), the group's
offsets read with OffsetFetch version 7, and the requests both producers send to the
coordinators (:class:`CoordinatorRequests`).

Written against aiokafka 0.14.0: its producer sends TxnOffsetCommit version 0 only, which
carries no membership. :meth:`KafkaTxnProducer.commit_offsets` therefore adds the group to the
transaction itself (AddOffsetsToTxn, sent while aiokafka adds the partitions and produces), tells
aiokafka's transaction manager that the group is added (so it neither sends its own offset
commit nor takes the transaction for empty), and commits the offsets with version 3
(``txn_offset_commit.py``), which the group coordinator checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka import errors as kafka_errors
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError, ProducerFenced, for_code
from aiokafka.protocol.transaction import AddOffsetsToTxnRequest
from aiokafka.structs import ConsumerRecord, OffsetAndMetadata

from service.runtime.clients import connection_options, transactional_producer
from service.runtime.offset_fetch import StableOffsetFetch, fetched_all
from service.runtime.partitioning import partition_among
from service.runtime.transport import (
    CONCURRENT_TRANSACTIONS,
    INVALID_PRODUCER_EPOCH,
    PRODUCER_FENCED,
    CommitFailedError,
    Delivery,
    GroupFencedError,
    GroupOffsets,
    TransactionTimeoutRefused,
    TxnProducer,
)
from service.runtime.txn_offset_commit import GroupTxnOffsetCommit, Membership, partition_errors
from service.runtime.unreadable import batch_records, failed_read, fetch_batch, read_before
from service.runtime.work import InputRecord, Origin, OutRecord
from service.settings import KafkaSettings

logger = logging.getLogger(__name__)

GROUP_COORDINATOR = 0
"""aiokafka's coordinator type for a consumer group."""
TXN_COORDINATOR = 1

FENCED_BY_GROUP = {22: "ILLEGAL_GENERATION", 25: "UNKNOWN_MEMBER_ID", 82: "FENCED_INSTANCE_ID"}
REBALANCE_IN_PROGRESS = 27
RETRIABLE = frozenset({7, 14, 15, 16})
"""REQUEST_TIMED_OUT, COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR."""
INVALID_TRANSACTION_TIMEOUT = 50
MOVED = frozenset({15, 16})
"""The coordinator is elsewhere now: look it up again."""
_RETRY_S = 0.005
_CLOSE_S = 2.0


def rebalance_step_failed(error: BaseException) -> bool:
    """``error`` is a retriable error of the group's rebalance, as aiokafka (0.14.0) hands it to
    the consumer's user: a bare ``KafkaError`` naming it (``COORDINATOR_LOAD_IN_PROGRESS`` from
    SyncGroup, as the coordinator reloads the group after a broker restart). aiokafka has asked
    to join again already, so the next fetch goes on; any other error stays fatal."""
    if type(error) is not KafkaError or len(error.args) != 1 or not isinstance(error.args[0], str):
        return False
    named = getattr(kafka_errors, error.args[0].removesuffix("()"), None)
    return (
        isinstance(named, type)
        and issubclass(named, KafkaError)
        and getattr(named, "retriable", False) is True
    )


class KafkaInput:
    """:class:`InputSource` over the instance's group consumer.

    A record aiokafka cannot parse (``unreadable.py``) is read from the broker's bytes with the
    rest of its batch, in its place among its partition's records (one that cannot be read at
    all comes with ``unreadable`` set), and the partition goes on after it; the records the
    failed call had taken are fetched again.
    """

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self.consumer = consumer
        self._next: dict[TopicPartition, int] = {}
        """By partition, the offset after the last record handed out or the last seek: where
        to take it up again after a failed call."""

    async def fetch(
        self, timeout_ms: int, max_records: int
    ) -> dict[TopicPartition, list[InputRecord]]:
        try:
            batches = await self.consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        except Exception as error:
            failed = failed_read(self.consumer)
            if failed is not None:
                return await self._step_over(*failed, error)
            if not rebalance_step_failed(error):
                raise
            logger.warning(
                "error=<%s> | a step of the group's rebalance failed and is retried: the "
                "consumer joins the group again",
                error.args[0],
            )
            return {}
        taken: dict[TopicPartition, list[InputRecord]] = {}
        for tp, records in batches.items():
            taken[tp] = [_input(tp, record) for record in records]
            self._next[tp] = records[-1].offset + 1
        return taken

    async def _step_over(
        self, tp: TopicPartition, offset: int, error: Exception
    ) -> dict[TopicPartition, list[InputRecord]]:
        """The failing partition's records up to the one at ``offset`` read by aiokafka, then
        its batch from that one on read by ``raw_batch.py``, the partition moved past the batch;
        every other partition back where the failed call found it."""
        logger.warning(
            "topic=<%s>, partition=<%d>, offset=<%d>, error=<%r> | input record not readable by "
            "the consumer: its batch is read from the broker's bytes",
            tp.topic,
            tp.partition,
            offset,
            error,
        )
        assigned = self.consumer.assignment()
        for other, position in self._next.items():
            if other != tp and other in assigned:
                self.consumer.seek(other, position)
        start = self._next.get(tp, offset)
        before = await read_before(self.consumer, tp, start, offset) if start < offset else []
        batch = await fetch_batch(self.consumer, tp, offset)
        if batch is None:
            raise error
        taken, after = batch_records(tp, batch, offset)
        if tp in self.consumer.assignment():
            self.seek(tp, after)
        return {tp: [*(_input(tp, record) for record in before), *taken]}

    def assignment(self) -> set[TopicPartition]:
        return set(self.consumer.assignment())

    def fetched_at(self, tp: TopicPartition) -> int | None:
        if tp not in self.consumer.assignment():
            return None
        # aiokafka stamps a partition with the time of each fetch response that carried it.
        stamp = self.consumer.last_poll_timestamp(tp)
        return int(stamp) if stamp is not None else None

    def paused(self) -> set[TopicPartition]:
        return set(self.consumer.paused())

    def pause(self, *partitions: TopicPartition) -> None:
        self.consumer.pause(*partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self.consumer.resume(*partitions)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.consumer.seek(tp, offset)
        self._next[tp] = offset

    async def beginning_offsets(
        self, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, int]:
        found = await self.consumer.beginning_offsets(partitions)
        return {tp: int(offset) for tp, offset in found.items()}


def _input(tp: TopicPartition, record: ConsumerRecord[Any, Any]) -> InputRecord:
    return InputRecord(
        origin=Origin(tp.topic, tp.partition, record.offset),
        key=record.key,
        value=record.value,
        headers=list(record.headers),
        timestamp_ms=record.timestamp,
    )


class CoordinatorRequests:
    """What both producers send to coordinators alike: AddOffsetsToTxn, and the transaction's
    offsets under a group membership (TxnOffsetCommit v3, ``txn_offset_commit.py``), each
    coordinator looked up once and again only after it answered that it is not one or a request
    to it failed (aiokafka's lookup asks the broker every time)."""

    transactional_id: str

    def __init__(self) -> None:
        self._coordinators: dict[tuple[int, str], int] = {}

    def _coordinator_client(self) -> AIOKafkaClient:
        raise NotImplementedError

    def _producer_ids(self) -> tuple[int, int]:
        """The producer id and epoch of the open transaction."""
        raise NotImplementedError

    async def add_group(self, group_id: str) -> None:
        await self._add_offsets(group_id)

    async def commit_offsets(
        self,
        group_id: str,
        membership: Membership,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
    ) -> None:
        await self.add_group(group_id)
        producer_id, epoch = self._producer_ids()
        request = GroupTxnOffsetCommit(
            transactional_id=self.transactional_id,
            group_id=group_id,
            producer_id=producer_id,
            producer_epoch=epoch,
            membership=membership,
            offsets=offsets,
        )
        while True:
            response = await self._coordinator(GROUP_COORDINATOR, group_id, request)
            errors = set(partition_errors(response).values()) - {0}
            if not errors:
                return
            if errors & MOVED:
                self._coordinators.pop((GROUP_COORDINATOR, group_id), None)
            raise_for_offsets(errors - {CONCURRENT_TRANSACTIONS}, membership)
            await asyncio.sleep(_RETRY_S)

    async def _add_offsets(self, group_id: str) -> None:
        """AddOffsetsToTxn: the transaction will write its markers to the group's offsets."""
        producer_id, epoch = self._producer_ids()
        request = AddOffsetsToTxnRequest(self.transactional_id, producer_id, epoch, group_id)
        await self._until_done(request, "AddOffsetsToTxn")

    async def _until_done(self, request: Any, name: str) -> Any:
        """Send ``request`` to the transaction coordinator until it succeeds (retriable errors
        are sent again after a short pause, others raised); its response."""
        while True:
            response = await self._coordinator(TXN_COORDINATOR, self.transactional_id, request)
            if response.error_code == 0:
                return response
            raise_unless_retriable(response.error_code, name)
            await asyncio.sleep(_RETRY_S)

    async def _coordinator(self, kind: int, key: str, request: Any) -> Any:
        client = self._coordinator_client()
        node = self._coordinators.get((kind, key))
        if node is None:
            node = self._coordinators[(kind, key)] = await client.coordinator_lookup(kind, key)
        try:
            response = await client.send(node, request)
        except Exception:
            self._coordinators.pop((kind, key), None)
            raise
        if getattr(response, "error_code", 0) in MOVED:
            self._coordinators.pop((kind, key), None)
        return response


def raise_unless_retriable(error: int, request: str) -> None:
    """Raise what a coordinator's error code means, unless asking again may succeed."""
    if error in (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED):
        raise ProducerFenced()
    if error == INVALID_TRANSACTION_TIMEOUT:
        raise TransactionTimeoutRefused(f"{request} failed: the transaction timeout is refused")
    if error not in RETRIABLE and error != CONCURRENT_TRANSACTIONS:
        raise CommitFailedError(f"{request} failed: {for_code(error).__name__} ({error})")


class KafkaTxnProducer(CoordinatorRequests):
    def __init__(self, kafka: KafkaSettings, transactional_id: str, timeout_ms: int) -> None:
        super().__init__()
        self.transactional_id = transactional_id
        self._producer: AIOKafkaProducer = transactional_producer(
            kafka, transactional_id, transaction_timeout_ms=timeout_ms
        )
        self._partitions: dict[str, list[int]] = {}

    async def start(self) -> None:
        await self._producer.start()

    async def close(self) -> None:
        producer = self._producer
        with contextlib.suppress(Exception):
            async with asyncio.timeout(_CLOSE_S):
                await producer.stop()
        discard_leftovers(producer)

    async def begin(self) -> None:
        await self._producer.begin_transaction()

    async def partition_of(self, topic: str, key: bytes | None) -> int:
        partitions = self._partitions.get(topic)
        if partitions is None:
            partitions = sorted(await self._producer.partitions_for(topic))
            self._partitions[topic] = partitions
        return partition_among(key, partitions)

    async def send(
        self, topic: str, partition: int, records: Sequence[OutRecord]
    ) -> list[Delivery]:
        """One record batch per partition where they fit (far cheaper than a send per record);
        a record larger than a whole batch travels alone."""
        producer = self._producer
        sent: list[Delivery] = []
        batch = producer.create_batch()
        for record in records:
            if _append(batch, record):
                continue
            if count := batch.record_count():
                sent.append(
                    (_base(await producer.send_batch(batch, topic, partition=partition)), count)
                )
                batch = producer.create_batch()
                if _append(batch, record):
                    continue
            alone = await producer.send(
                topic,
                value=record.value,
                key=record.key,
                partition=partition,
                headers=record.headers,
            )
            sent.append((_base(alone), 1))
        if count := batch.record_count():
            sent.append(
                (_base(await producer.send_batch(batch, topic, partition=partition)), count)
            )
        return sent

    async def add_group(self, group_id: str) -> None:
        await self._add_offsets(group_id)
        # aiokafka then ends the transaction with EndTxn even when no record was sent.
        self._producer._txn_manager.consumer_group_added(group_id)

    def _coordinator_client(self) -> AIOKafkaClient:
        return self._producer.client

    def _producer_ids(self) -> tuple[int, int]:
        manager = self._producer._txn_manager
        return manager.producer_id, manager.producer_epoch

    async def commit(self) -> None:
        await self._producer.commit_transaction()

    async def abort(self) -> None:
        await self._producer.abort_transaction()


def raise_for_offsets(errors: set[int], membership: Membership) -> None:
    """Raise what a refused TxnOffsetCommit means; return when every error is retriable."""
    if fenced := errors & FENCED_BY_GROUP.keys():
        raise GroupFencedError(
            f"the group refused the offsets: {FENCED_BY_GROUP[min(fenced)]} "
            f"(generation {membership.generation_id})"
        )
    if REBALANCE_IN_PROGRESS in errors:
        raise GroupFencedError("the group is rebalancing")
    if INVALID_PRODUCER_EPOCH in errors:
        raise ProducerFenced()
    if not errors <= RETRIABLE:
        raise CommitFailedError(f"the offset commit failed with error codes {sorted(errors)}")


class KafkaGroupOffsets:
    """OffsetFetch v7 on a client of its own (it outlives the producers the stream renews)."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self._kafka = kafka
        self._client: AIOKafkaClient | None = None

    async def start(self) -> None:
        self._client = AIOKafkaClient(
            **connection_options(self._kafka), client_id=f"{self._kafka.client_id}-offsets"
        )
        try:
            await self._client.bootstrap()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()

    async def fetch(
        self, group_id: str, partitions: Iterable[TopicPartition], *, require_stable: bool
    ) -> dict[TopicPartition, tuple[int, str, int]]:
        client = self._client
        if client is None:
            raise CommitFailedError("the group offsets reader is not started")
        node = await client.coordinator_lookup(GROUP_COORDINATOR, group_id)
        request = StableOffsetFetch(group_id, partitions, require_stable=require_stable)
        return fetched_all(await client.send(node, request), request.partitions)


MakeProducer = Callable[[KafkaSettings, str, int], TxnProducer]
"""A producer class: (settings, transactional id, transaction timeout in ms)."""


class KafkaTransport:
    def __init__(
        self,
        kafka: KafkaSettings,
        *,
        transaction_timeout_ms: int,
        make_producer: MakeProducer | None = None,
    ) -> None:
        self._kafka = kafka
        self._timeout_ms = transaction_timeout_ms
        self._make_producer: MakeProducer = make_producer or KafkaTxnProducer
        self.offsets: GroupOffsets = KafkaGroupOffsets(kafka)

    def producer(self, transactional_id: str) -> TxnProducer:
        return self._make_producer(self._kafka, transactional_id, self._timeout_ms)


def _append(batch: Any, record: OutRecord) -> bool:
    appended = batch.append(
        timestamp=None, key=record.key, value=record.value, headers=record.headers
    )
    return appended is not None


def _base(delivery: asyncio.Future[Any]) -> asyncio.Future[int]:
    """The base offset of an aiokafka delivery, as a future of its own; the delivery's failure
    is always retrieved, whether or not anyone still waits for the offset."""
    offset: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def done(finished: asyncio.Future[Any]) -> None:
        if finished.cancelled():
            if not offset.done():
                offset.cancel()
            return
        error = finished.exception()
        if offset.done():
            return
        if error is not None:
            offset.set_exception(error)
        else:
            offset.set_result(int(finished.result().offset))

    delivery.add_done_callback(done)
    return offset


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
