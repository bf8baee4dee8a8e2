"""The producer of transactions version 2 against the real broker: a committed transaction is
visible whole and in order, an aborted one never; the epoch moves at every commit, so a batch of
an ended transaction is refused; a new producer of the same id fences the old one and aborts what
it left open; records the broker refuses for good fail as the stream expects (their aiokafka
class); input offsets commit under the group's membership and are refused under a stale one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import MessageSizeTooLargeError, ProducerFenced
from aiokafka.structs import OffsetAndMetadata

from service.runtime.group_member import membership_of
from service.runtime.transport import GroupFencedError
from service.runtime.txn_offset_commit import Membership
from service.runtime.txn_v2 import KafkaTxnV2Producer
from service.runtime.txn_v2_requests import TxnProduce, produced
from service.runtime.work import OutRecord
from service.settings import KafkaSettings
from tests.conftest import CreateTopics
from tests.support.txn_probe import committed_values

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(90)]

INVALID_PRODUCER_EPOCH = 47
PRODUCER_FENCED = 90


@dataclass
class Setup:
    bootstrap: str
    results: str
    events: str
    small: str
    transactional_id: str

    def producer(self) -> KafkaTxnV2Producer:
        kafka = KafkaSettings(bootstrap_servers=self.bootstrap)
        return KafkaTxnV2Producer(kafka, self.transactional_id, 60_000)

    async def visible(self, topic: str, partition: int = 0) -> list[bytes | None]:
        return await committed_values(self.bootstrap, TopicPartition(topic, partition))


@pytest.fixture
async def setup(kafka_topics: CreateTopics, kafka_bootstrap: str, unique_name: str) -> Setup:
    results, events = await kafka_topics(
        f"{unique_name}.results", f"{unique_name}.events", partitions=2
    )
    (small,) = await kafka_topics(f"{unique_name}.small", config={"max.message.bytes": "10000"})
    return Setup(kafka_bootstrap, results, events, small, f"{unique_name}-tx")


@pytest.fixture
async def producer(setup: Setup) -> AsyncIterator[KafkaTxnV2Producer]:
    producer = setup.producer()
    await producer.start()
    try:
        yield producer
    finally:
        await producer.close()


def _records(topic: str, *values: bytes) -> list[OutRecord]:
    return [OutRecord(topic, b"k", value) for value in values]


async def _offsets(producer: KafkaTxnV2Producer, topic: str, *values: bytes) -> list[int]:
    deliveries = await producer.send(topic, 0, _records(topic, *values))
    return [await offset for offset, _ in deliveries]


async def _committed_once_materialized(member: AIOKafkaConsumer, tp: TopicPartition) -> int | None:
    """The group's offset of ``tp`` once the commit markers reached the offsets partition
    (EndTxn returns before the coordinator has written them)."""
    async with asyncio.timeout(10):
        while (offset := await member.committed(tp)) is None:
            await asyncio.sleep(0.05)
    return offset


async def test_a_commit_is_visible_whole_in_order_and_an_abort_never(
    setup: Setup, producer: KafkaTxnV2Producer
) -> None:
    await producer.begin()
    aborted = await producer.send(setup.results, 0, _records(setup.results, b"no-1", b"no-2"))
    await asyncio.gather(*(offset for offset, _ in aborted))
    await producer.abort()

    await producer.begin()
    first = await producer.send(setup.results, 0, _records(setup.results, b"a", b"b"))
    beside = await producer.send(setup.events, 1, _records(setup.events, b"e"))
    await producer.commit()

    assert await setup.visible(setup.results) == [b"a", b"b"]
    assert await setup.visible(setup.events, 1) == [b"e"]
    # Two records in one batch; the aborted batch and its marker came before it.
    assert [count for _, count in first + beside] == [2, 1]
    assert first[0][0].result() == 3


async def test_records_beyond_one_batch_keep_their_order(
    setup: Setup, producer: KafkaTxnV2Producer
) -> None:
    values = [bytes([65 + n]) * 150_000 for n in range(4)]
    await producer.begin()
    sent = await producer.send(setup.results, 0, _records(setup.results, *values))
    await producer.commit()
    assert len(sent) >= 2, "a batch holds at most 256 KiB"
    assert await setup.visible(setup.results) == values


async def test_the_epoch_moves_at_every_commit_so_a_late_batch_is_refused(
    setup: Setup, producer: KafkaTxnV2Producer
) -> None:
    await producer.begin()
    await _offsets(producer, setup.results, b"first")
    tp = TopicPartition(setup.results, 0)
    builder = producer._builder(tp)
    builder.append(0, None, b"k", b"late", [])
    late = bytes(builder.build())  # a batch of the transaction about to end
    await producer.commit()

    await producer.begin()
    await _offsets(producer, setup.results, b"second")
    client = producer._client
    leader = client.cluster.leader_for_partition(tp)
    answer = await client.send(leader, TxnProduce(setup.transactional_id, {tp: late}, 30_000))
    error, _ = produced(answer)[tp]
    assert error in (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED)
    await producer.commit()
    assert await setup.visible(setup.results) == [b"first", b"second"]


async def test_a_new_producer_of_the_id_fences_the_old_one_and_aborts_its_transaction(
    setup: Setup, producer: KafkaTxnV2Producer
) -> None:
    await producer.begin()
    await _offsets(producer, setup.results, b"zombie")

    successor = setup.producer()
    await successor.start()
    try:
        with pytest.raises(ProducerFenced):
            await producer.commit()
        await successor.begin()
        await _offsets(successor, setup.results, b"successor")
        await successor.commit()
    finally:
        await successor.close()
    assert await setup.visible(setup.results) == [b"successor"]


async def test_a_record_the_broker_refuses_fails_as_unwritable_and_the_producer_goes_on(
    setup: Setup, producer: KafkaTxnV2Producer
) -> None:
    await producer.begin()
    with pytest.raises(MessageSizeTooLargeError):
        await _offsets(producer, setup.small, b"x" * 20_000)
    await producer.abort()

    await producer.begin()
    await _offsets(producer, setup.small, b"fits")
    await producer.commit()
    assert await setup.visible(setup.small) == [b"fits"]


async def test_offsets_commit_under_the_current_membership_only(
    setup: Setup, producer: KafkaTxnV2Producer, unique_name: str
) -> None:
    group = f"{unique_name}-group"
    member = AIOKafkaConsumer(
        setup.events,
        bootstrap_servers=setup.bootstrap,
        group_id=group,
        enable_auto_commit=False,
    )
    await member.start()
    try:
        await member.getmany(timeout_ms=5000)  # joined: a generation and a member id
        current = membership_of(member, None)
        assert current is not None
        tp = TopicPartition(setup.events, 0)

        await producer.begin()
        stale = Membership(current.generation_id + 5, current.member_id)
        with pytest.raises(GroupFencedError):
            await producer.commit_offsets(group, stale, {tp: OffsetAndMetadata(7, "tx")})
        await producer.abort()

        await producer.begin()
        await _offsets(producer, setup.results, b"with offsets")
        await producer.commit_offsets(group, current, {tp: OffsetAndMetadata(9, "tx")})
        await producer.commit()
        assert await _committed_once_materialized(member, tp) == 9
    finally:
        await member.stop()
    assert await setup.visible(setup.results) == [b"with offsets"]
