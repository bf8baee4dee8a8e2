"""What the runtime needs of Kafka: the protocols it reaches the broker through.

Guarantee: the transaction stream reaches the broker only through :class:`TxnProducer` (one
transactional producer: begin, send records, commit offsets under a group membership, commit or
abort) and :class:`GroupOffsets` (the group's committed offsets, stable or not), so its rules
(one transaction at a time, every share with its offsets, a refused share retried alone, a
failed transaction failing exactly its shares) are tested on an in-memory implementation
(``tests/support/memory_kafka.py``) with a failure injected at every call, and run on
``kafka_transport.KafkaTransport`` in production. The fetch side is :class:`InputSource` (the
group consumer of the input topics: fetch a batch, the assignment, pause and resume, seek, where
a partition begins), so the consumer loop and the partition owner are unit-tested the same way
on an in-memory one, and run on ``kafka_transport.KafkaInput``, a thin wrapper of
``AIOKafkaConsumer``. The same consumer's place in the group is :class:`GroupMember` (its
membership, and a heartbeat that asks the group coordinator whether it is still current), which
the runtime asks before it re-creates an owner (``group_member.KafkaGroupMember`` on the broker).

Two producers implement :class:`TxnProducer` on the broker: ``kafka_transport.KafkaTxnProducer``,
aiokafka's producer (Kafka's transactions version 1), and ``txn_v2.KafkaTxnV2Producer``, the
service's own of transactions version 2 (``runtime.transactions_version``, the default).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from aiokafka import TopicPartition
from aiokafka.structs import OffsetAndMetadata

from service.runtime.txn_offset_commit import Membership
from service.runtime.work import InputRecord, OutRecord

INVALID_PRODUCER_EPOCH = 47
PRODUCER_FENCED = 90
CONCURRENT_TRANSACTIONS = 51
"""Error codes both producers read in the broker's answers."""


Delivery = tuple["asyncio.Future[int]", int]
"""A batch sent in the open transaction: its base offset once the broker has it, and how many
records it holds."""


class CommitFailedError(RuntimeError):
    """A transaction failed or its outcome is unknown: its partitions start again from what is
    committed."""


class TransactionTimeoutRefused(CommitFailedError):
    """The broker refuses the producer's transaction timeout (above its
    ``transaction.max.timeout.ms``): no transaction can ever start, whatever the retries."""


class GroupFencedError(RuntimeError):
    """The consumer group refused a transaction's offsets: this instance's membership is not the
    group's current one (it lost its partitions, or a rebalance is under way)."""


class TxnProducer(Protocol):
    """One transactional producer, as the stream uses it."""

    transactional_id: str

    async def start(self) -> None:
        """InitProducerId: fences earlier producers of the id, aborting what they left open."""

    async def close(self) -> None:
        """Stop within a bound and never raise; an open transaction is left to the next
        InitProducerId."""

    async def begin(self) -> None: ...

    async def partition_of(self, topic: str, key: bytes | None) -> int:
        """The partition a keyed send picks (the default partitioner's)."""

    async def send(
        self, topic: str, partition: int, records: Sequence[OutRecord]
    ) -> list[Delivery]:
        """Queue ``records`` for one partition in the open transaction, in order."""

    async def add_group(self, group_id: str) -> None:
        """AddOffsetsToTxn alone: the transaction's markers also go to the group's offsets
        partition, where an ABORT ends whatever offsets this producer id left pending."""

    async def commit_offsets(
        self,
        group_id: str,
        membership: Membership,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
    ) -> None:
        """Add the group's ``offsets`` to the transaction under ``membership``; raises
        :class:`GroupFencedError` when the group refuses the membership."""

    async def commit(self) -> None: ...

    async def abort(self) -> None: ...


class GroupOffsets(Protocol):
    """The consumer group's committed offsets, read from its coordinator."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def fetch(
        self, group_id: str, partitions: Iterable[TopicPartition], *, require_stable: bool
    ) -> dict[TopicPartition, tuple[int, str, int]]:
        """By partition, every one of ``partitions``: (offset or -1, metadata, error code); with
        ``require_stable`` a partition whose offsets an open transaction may still move has
        error 88; a group-level error (the coordinator just restarted) is every partition's."""


class Transport(Protocol):
    """Makes the producers of the stream and reads group offsets."""

    offsets: GroupOffsets

    def producer(self, transactional_id: str) -> TxnProducer: ...


class InputSource(Protocol):
    """The consumer group's member reading the input topics (read_committed), as the consumer
    loop and the partition owners use it. Only :meth:`fetch` and :meth:`beginning_offsets` do
    I/O; the rest changes or reads the member's local state and raises only when asked about a
    partition it is not assigned."""

    async def fetch(
        self, timeout_ms: int, max_records: int
    ) -> dict[TopicPartition, list[InputRecord]]:
        """The next records of the assigned partitions not paused, each partition's in offset
        order from its position, at most ``max_records`` in all; waits up to ``timeout_ms`` when
        there are none. Also what keeps the membership alive. A record that cannot be read
        comes in its place with ``unreadable`` set (and may come beyond ``max_records``)."""

    def assignment(self) -> set[TopicPartition]: ...

    def fetched_at(self, tp: TopicPartition) -> int | None:
        """When the broker last answered a fetch of ``tp`` (epoch ms), ``None`` before its first
        answer or when ``tp`` is not assigned; no I/O. It stands still while the broker is out
        of reach or the partition is paused."""

    def paused(self) -> set[TopicPartition]: ...

    def pause(self, *partitions: TopicPartition) -> None: ...

    def resume(self, *partitions: TopicPartition) -> None: ...

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """The next fetch of ``tp`` starts at ``offset``."""

    async def beginning_offsets(
        self, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, int]: ...


class GroupMember(Protocol):
    """This instance's member of the consumer group: the membership it last joined with, which
    it keeps until it hears that the group moved on (after a pause past the session timeout,
    only at its next heartbeat), and a question to the group coordinator about it."""

    def membership(self) -> Membership | None:
        """The generation and member id as this member knows them; None outside a generation."""

    async def current(self) -> bool | None:
        """A heartbeat sent now: True when the coordinator answers that :meth:`membership` is
        still the group's current one, False when it answers that it is over (or there is
        none), None with no answer to go by (no coordinator, a rebalance under way)."""


def discard(futures: Iterable[asyncio.Future[Any]]) -> None:
    """Give up on futures nobody will await: a finished one has its exception retrieved, a
    pending one is cancelled."""
    for future in futures:
        if not future.done():
            future.cancel()
        elif not future.cancelled():
            future.exception()
