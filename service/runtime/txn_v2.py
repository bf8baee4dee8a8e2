"""A transactional producer of Kafka's transactions version 2 (KIP-890), over aiokafka's client.

Guarantees, as :class:`~service.runtime.transport.TxnProducer` states them: one transaction at a
time; a partition's batches are written in the order sent, each exactly once (idempotent
sequence numbers, so a batch resent after a lost answer is not written twice); a transaction
becomes visible whole on :meth:`commit` or not at all. What differs from aiokafka's producer is
the number of round trips a commit waits for: two (the produce, then EndTxn) instead of three,
because under transactions version 2 the partition leader adds a partition to the transaction
itself (``txn_v2_requests.py``); a commit that moves input offsets still adds them first
(AddOffsetsToTxn, then TxnOffsetCommit, beside the produce). The
coordinator bumps the producer epoch at every EndTxn: a batch of an ended transaction that
reaches a leader late carries the old epoch and is refused, so it can never join the next one.

Everything sent in one event-loop turn travels in one Produce request per leader, as aiokafka's
sender would drain it. A failure the same batch can outlive (a leader moved, a broker away, the
previous transaction's markers still being written) resends it with the same sequence number
until the caller's deadline; a failure it cannot (the records refused, the producer fenced, the
transaction broken) fails the batch, and the caller ends the transaction by renewing the
producer. Needs a broker whose ``transaction.version`` feature is at 2 (Kafka 4.0 or later,
formatted as such); ``runtime.transactions_version=1`` keeps aiokafka's producer for older ones.

Written against aiokafka 0.14.0 (its client, cluster metadata, record batch builder and errors).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from aiokafka import TopicPartition
from aiokafka import errors as kafka_errors
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError, ProducerFenced
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from service.runtime.clients import connection_options
from service.runtime.kafka_transport import CoordinatorRequests
from service.runtime.partitioning import partition_among
from service.runtime.transport import (
    CONCURRENT_TRANSACTIONS,
    INVALID_PRODUCER_EPOCH,
    PRODUCER_FENCED,
    CommitFailedError,
    Delivery,
    discard,
)
from service.runtime.txn_v2_requests import EndTxn, InitProducerId, TxnProduce, produced
from service.runtime.work import OutRecord
from service.settings import KafkaSettings

logger = logging.getLogger(__name__)

INVALID_TXN_STATE = 48
FENCED = frozenset({INVALID_PRODUCER_EPOCH, PRODUCER_FENCED})
RESEND = frozenset({3, 5, 6, 7, 13, 19, 20, 56, CONCURRENT_TRANSACTIONS})
"""Produce errors the same batch outlives: UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE,
NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT, NETWORK_EXCEPTION, NOT_ENOUGH_REPLICAS(_AFTER_APPEND),
KAFKA_STORAGE_ERROR, CONCURRENT_TRANSACTIONS (the previous commit's markers are being written)."""
LEADER_MOVED = frozenset({3, 5, 6, 13, 56})
BATCH_BYTES = 256 * 1024
RESEND_S = 0.005
"""Wait before resending after an answer; markers being written take a millisecond or two."""
RECONNECT_S = 0.1
"""Wait before resending after a lost connection (a broker restarting)."""
_CLOSE_S = 2.0

Batch = tuple[TopicPartition, bytearray, "asyncio.Future[int]"]


class UnsupportedBrokerError(CommitFailedError):
    """The broker does not speak a request of transactions version 2."""

    def __init__(self, detail: str) -> None:
        super().__init__(
            f"the broker does not speak transactions version 2 ({detail}): it needs Kafka 4.0 "
            "or later; set runtime.transactions_version=1 for an older one"
        )


class KafkaTxnV2Producer(CoordinatorRequests):
    """:class:`~service.runtime.transport.TxnProducer` on transactions version 2."""

    def __init__(self, kafka: KafkaSettings, transactional_id: str, timeout_ms: int) -> None:
        super().__init__()
        self.transactional_id = transactional_id
        self._timeout_ms = timeout_ms
        self._request_timeout_ms = kafka.request_timeout_ms
        self._client = AIOKafkaClient(
            **connection_options(kafka), client_id=f"{kafka.client_id}-{transactional_id}"
        )
        self._producer_id = -1
        self._epoch = -1
        self._sequences: dict[TopicPartition, int] = {}
        self._written = False
        """The transaction may hold something: EndTxn must end it."""
        self._unsent: list[Batch] = []
        self._deliveries: list[asyncio.Future[int]] = []
        self._flushes: set[asyncio.Task[None]] = set()
        self._last_flush: asyncio.Task[None] | None = None
        self._partitions: dict[str, list[int]] = {}

    async def start(self) -> None:
        await self._client.bootstrap()
        request = InitProducerId(self.transactional_id, self._timeout_ms)
        response = await self._until_done(request, "InitProducerId")
        self._producer_id = response.producer_id
        self._epoch = response.producer_epoch

    async def close(self) -> None:
        self._drop_sends(CommitFailedError("the producer was closed"))
        with contextlib.suppress(Exception):
            async with asyncio.timeout(_CLOSE_S):
                await self._client.close()

    async def begin(self) -> None:
        if self._written:
            raise CommitFailedError("a transaction is already open")

    async def partition_of(self, topic: str, key: bytes | None) -> int:
        partitions = self._partitions.get(topic)
        if partitions is None:
            partitions = sorted(await self._known_partitions(topic))
            self._partitions[topic] = partitions
        return partition_among(key, partitions)

    async def send(
        self, topic: str, partition: int, records: Sequence[OutRecord]
    ) -> list[Delivery]:
        """One batch per partition where the records fit in one; a record larger than a whole
        batch travels in a batch of its own. Sent with whatever else is sent this loop turn."""
        tp = TopicPartition(topic, partition)
        if self._client.cluster.leader_for_partition(tp) is None:
            await self._known_partitions(topic)
        sent: list[Delivery] = []
        builder, count = self._builder(tp), 0
        for record in records:
            if builder.append(count, None, record.key, record.value, record.headers) is None:
                sent.append(self._queue(tp, builder, count))
                builder, count = self._builder(tp), 0
                builder.append(0, None, record.key, record.value, record.headers)
            count += 1
        if count:
            sent.append(self._queue(tp, builder, count))
        return sent

    async def add_group(self, group_id: str) -> None:
        """AddOffsetsToTxn: the transaction's markers also go to the group's offsets partition
        (see ``txn_v2_requests.py`` for why a transaction of version 2 still sends it)."""
        self._written = True
        await self._add_offsets(group_id)

    async def commit(self) -> None:
        if self._flushes:
            await asyncio.gather(*self._flushes)
        for delivery in self._deliveries:
            if not delivery.done() or delivery.exception() is not None:
                raise CommitFailedError("a batch of the transaction was not written")
        await self._end(committed=True)

    async def abort(self) -> None:
        self._drop_sends(CommitFailedError("the transaction was aborted"))
        await self._end(committed=False)

    async def _end(self, *, committed: bool) -> None:
        if not self._written:
            self._sequences.clear()
            return
        request = EndTxn(self.transactional_id, self._producer_id, self._epoch, committed=committed)
        response = await self._until_done(request, "EndTxn")
        self._producer_id = response.producer_id
        self._epoch = response.producer_epoch
        self._sequences.clear()
        self._deliveries.clear()
        self._written = False

    def _builder(self, tp: TopicPartition) -> Any:
        return DefaultRecordBatchBuilder(
            2,
            0,
            is_transactional=1,
            producer_id=self._producer_id,
            producer_epoch=self._epoch,
            base_sequence=self._sequences.get(tp, 0),
            batch_size=BATCH_BYTES,
        )

    def _queue(self, tp: TopicPartition, builder: Any, count: int) -> Delivery:
        self._sequences[tp] = self._sequences.get(tp, 0) + count
        offset: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if not self._unsent:
            task = asyncio.create_task(self._flush(self._last_flush))
            self._last_flush = task
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)
        batch = (tp, builder.build(), offset)
        self._unsent.append(batch)
        self._deliveries.append(offset)
        self._written = True
        return offset, count

    async def _flush(self, previous: asyncio.Task[None] | None) -> None:
        """Send what was queued in this loop turn once the previous flush is settled (so a
        partition's batches reach it in sequence order): per leader, one request per round of
        distinct partitions (a partition's later batch waits for its earlier one). A failure
        nothing here expects fails the batches, never the task."""
        batches, self._unsent = self._unsent, []
        if previous is not None:
            with contextlib.suppress(Exception):
                await previous
        rounds: list[dict[TopicPartition, Batch]] = []
        for batch in batches:
            for current in rounds:
                if batch[0] not in current:
                    current[batch[0]] = batch
                    break
            else:
                rounds.append({batch[0]: batch})
        try:
            for current in rounds:
                await self._produce(current)
        except Exception as exc:  # noqa: BLE001 - the waiters of the batches learn of it
            for _, _, future in batches:
                if not future.done():
                    future.set_exception(CommitFailedError(f"the produce failed: {exc!r}"))

    async def _produce(self, batches: dict[TopicPartition, Batch]) -> None:
        pending = dict(batches)
        while pending:
            by_leader: dict[int, dict[TopicPartition, Batch]] = {}
            for tp, batch in pending.items():
                leader = self._client.cluster.leader_for_partition(tp)
                by_leader.setdefault(-1 if leader is None else leader, {})[tp] = batch
            outcomes = await asyncio.gather(
                *(self._produce_to(leader, part) for leader, part in by_leader.items())
            )
            pending = {tp: pending[tp] for left in outcomes for tp in left}
            if pending:
                await asyncio.sleep(RESEND_S)

    async def _produce_to(
        self, leader: int, batches: dict[TopicPartition, Batch]
    ) -> list[TopicPartition]:
        """Send ``batches`` to ``leader``; settle what is written or lost for good and return
        the partitions to resend."""
        if leader < 0:
            await self._client.force_metadata_update()
            return list(batches)
        request = TxnProduce(
            self.transactional_id,
            {tp: records for tp, (_, records, _) in batches.items()},
            self._request_timeout_ms,
        )
        try:
            response = await self._client.send(leader, request)
        except NotImplementedError as exc:
            raise UnsupportedBrokerError(str(exc)) from exc
        except KafkaError as exc:
            logger.debug("error=<%r> | produce not answered, resending", exc)
            self._client.force_metadata_update()
            await asyncio.sleep(RECONNECT_S)
            return list(batches)
        answers = produced(response)
        resend = [tp for tp in batches if tp not in answers]
        for tp, (error, base_offset) in answers.items():
            batch = batches.get(tp)
            if batch is None or batch[2].done():
                continue
            future = batch[2]
            if error == 0:
                future.set_result(base_offset)
            elif error in RESEND:
                if error in LEADER_MOVED:
                    self._client.force_metadata_update()
                resend.append(tp)
            elif error in FENCED:
                future.set_exception(ProducerFenced())
            else:
                future.set_exception(_produce_error(error, tp))
        return resend

    def _drop_sends(self, error: Exception) -> None:
        for task in list(self._flushes):
            task.cancel()
        self._last_flush = None
        for future in self._deliveries:
            if not future.done():
                future.set_exception(error)
        discard(self._deliveries)
        self._deliveries, self._unsent = [], []

    async def _known_partitions(self, topic: str) -> set[int]:
        await self._client.add_topic(topic)
        for _ in range(100):
            partitions = self._client.cluster.partitions_for_topic(topic)
            if partitions:
                return set(partitions)
            await self._client.force_metadata_update()
            await asyncio.sleep(RESEND_S)
        raise kafka_errors.UnknownTopicOrPartitionError(topic)

    async def _coordinator(self, kind: int, key: str, request: Any) -> Any:
        try:
            return await super()._coordinator(kind, key, request)
        except NotImplementedError as exc:
            raise UnsupportedBrokerError(str(exc)) from exc

    def _coordinator_client(self) -> AIOKafkaClient:
        return self._client

    def _producer_ids(self) -> tuple[int, int]:
        return self._producer_id, self._epoch


def _produce_error(error: int, tp: TopicPartition) -> Exception:
    """The aiokafka error of a produce error code (the stream tells records the broker refuses
    for good, such as a record too large, by their aiokafka class)."""
    if error == INVALID_TXN_STATE:
        return CommitFailedError(
            f"produce to {tp.topic}-{tp.partition} failed: INVALID_TXN_STATE, the partition was "
            "not added to the transaction; a broker whose transaction.version feature is below "
            "2 does not add it: upgrade the feature, or set runtime.transactions_version=1"
        )
    kind: type[Exception] = kafka_errors.for_code(error)
    if kind in (kafka_errors.UnknownError, kafka_errors.NoError):
        return CommitFailedError(f"produce to {tp.topic}-{tp.partition} failed: error {error}")
    return kind(f"{tp.topic}-{tp.partition}")
