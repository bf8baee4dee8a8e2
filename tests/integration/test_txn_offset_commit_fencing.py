"""What the broker does with TxnOffsetCommit v3 and OffsetFetch v7 (KIP-447), what a single
transactional producer per instance would rest on: the group coordinator commits a transaction's
offsets under the current membership of the group, and refuses them under a stale generation or
an unknown member, whatever producer sends them; and it calls offsets an open transaction may
still move unstable until that transaction ends.

The producer side (the transaction, AddOffsetsToTxn) is aiokafka's own; only the offset commit
is the project's request, sent with aiokafka's client to the group's coordinator.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from service.runtime.offset_fetch import (
    NO_OFFSET,
    UNSTABLE_OFFSET_COMMIT,
    StableOffsetFetch,
    fetched,
)
from service.runtime.txn_offset_commit import (
    GroupTxnOffsetCommit,
    Membership,
    partition_errors,
)
from tests.conftest import CreateTopics

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]

ILLEGAL_GENERATION = 22
UNKNOWN_MEMBER_ID = 25
GROUP_COORDINATOR = 0


@dataclass
class Setup:
    bootstrap: str
    group: str
    tp: TopicPartition
    member: AIOKafkaConsumer
    producer: AIOKafkaProducer

    @property
    def membership(self) -> Membership:
        coordinator = self.member._coordinator
        return Membership(coordinator.generation, coordinator.member_id)

    async def commit_v3(self, membership: Membership, offset: int) -> int:
        """Commit ``offset`` under ``membership`` in the producer's open transaction; the
        coordinator's error code for the partition."""
        producer = self.producer
        client = producer.client
        node = await client.coordinator_lookup(GROUP_COORDINATOR, self.group)
        manager = producer._txn_manager
        request = GroupTxnOffsetCommit(
            transactional_id=manager.transactional_id,
            group_id=self.group,
            producer_id=manager.producer_id,
            producer_epoch=manager.producer_epoch,
            membership=membership,
            offsets={self.tp: OffsetAndMetadata(offset, "")},
        )
        return partition_errors(await client.send(node, request))[self.tp]

    async def committed(self) -> int | None:
        reader = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        await reader.start()
        try:
            found: int | None = await reader.committed(self.tp)
            return found
        finally:
            await reader.stop()


@pytest.fixture
async def setup(
    kafka_bootstrap: str, kafka_topics: CreateTopics, unique_name: str
) -> AsyncIterator[Setup]:
    [topic] = await kafka_topics(unique_name)
    group = f"fencing-{uuid.uuid4().hex[:8]}"
    member = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        group_id=group,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await member.start()
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, transactional_id=f"{group}-tx", acks="all"
    )
    await producer.start()
    try:
        await member.getmany(timeout_ms=5000)  # joined: a generation and a member id
        assert member._coordinator.generation > 0
        yield Setup(kafka_bootstrap, group, TopicPartition(topic, 0), member, producer)
    finally:
        await producer.stop()
        await member.stop()


async def _open_transaction(setup: Setup) -> None:
    """A transaction with the group added to it (aiokafka's AddOffsetsToTxn, and its own
    version 0 offset commit of offset 1)."""
    await setup.producer.begin_transaction()
    await setup.producer.send_offsets_to_transaction(
        {setup.tp: OffsetAndMetadata(1, "")}, setup.group
    )


async def test_the_current_membership_commits_with_the_transaction(setup: Setup) -> None:
    await _open_transaction(setup)
    assert await setup.commit_v3(setup.membership, 7) == 0
    await setup.producer.commit_transaction()
    assert await setup.committed() == 7


@pytest.mark.parametrize(
    ("stale", "error"),
    [
        (lambda m: Membership(m.generation_id + 1, m.member_id), ILLEGAL_GENERATION),
        (lambda m: Membership(m.generation_id - 1, m.member_id), ILLEGAL_GENERATION),
        (lambda m: Membership(m.generation_id, "a-member-that-left"), UNKNOWN_MEMBER_ID),
    ],
    ids=["newer-generation", "older-generation", "unknown-member"],
)
async def test_a_stale_membership_is_refused_and_commits_nothing(
    setup: Setup, stale: object, error: int
) -> None:
    await _open_transaction(setup)
    membership = stale(setup.membership)  # type: ignore[operator]
    assert await setup.commit_v3(membership, 9) == error
    await setup.producer.abort_transaction()
    assert await setup.committed() is None


async def _fetch(setup: Setup, *, require_stable: bool) -> tuple[int, int]:
    client = setup.producer.client
    node = await client.coordinator_lookup(GROUP_COORDINATOR, setup.group)
    request = StableOffsetFetch(setup.group, [setup.tp], require_stable=require_stable)
    return fetched(await client.send(node, request))[setup.tp]


async def test_offsets_an_open_transaction_may_still_move_are_unstable_until_it_ends(
    setup: Setup,
) -> None:
    """What a new owner's wait for stable offsets rests on (OffsetFetch v7, require_stable)."""
    await _open_transaction(setup)
    assert await setup.commit_v3(setup.membership, 5) == 0
    assert await _fetch(setup, require_stable=True) == (NO_OFFSET, UNSTABLE_OFFSET_COMMIT)
    # Without require_stable the coordinator answers at once, with what is committed so far.
    assert await _fetch(setup, require_stable=False) == (NO_OFFSET, 0)
    await setup.producer.commit_transaction()
    # The commit's markers reach the offsets topic just after EndTxn returns: ask again, as a
    # new owner would, until the answer is stable.
    deadline = asyncio.get_running_loop().time() + 30
    while (answer := await _fetch(setup, require_stable=True))[1] == UNSTABLE_OFFSET_COMMIT:
        assert asyncio.get_running_loop().time() < deadline, "offsets never became stable"
        await asyncio.sleep(0.05)
    assert answer == (5, 0)
