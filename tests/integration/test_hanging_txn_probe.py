"""The hanging transaction that tests.support.txn_probe fabricates is the real thing: it holds the
partition's last stable offset back after its producer is gone and after InitProducerId of the
same transactional id, the next commit of that producer id makes it visible, and an abort ends it
unseen. A broker that verifies transactional produces refuses to let it be made."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition

from tests.conftest import CreateTopics, create_topics
from tests.support.own_broker import OwnBroker, own_broker
from tests.support.txn_probe import (
    VERIFICATION_OFF,
    VerifiedProduceError,
    committed_values,
    fabricate_hanging_transaction,
    fence,
    partition_offsets,
    wait_until_hanging,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def unverified_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnBroker]:
    with own_broker(tmp_path_factory.mktemp("kafka"), VERIFICATION_OFF) as broker:
        yield broker


async def transact(
    bootstrap: str, transactional_id: str, tp: TopicPartition, *, commit: bool
) -> None:
    """One transaction of a new producer of ``transactional_id`` writing ``b"next"`` to ``tp``."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id)
    await producer.start()
    try:
        await producer.begin_transaction()
        await producer.send_and_wait(tp.topic, b"next", key=b"k", partition=tp.partition)
        if commit:
            await producer.commit_transaction()
        else:
            await producer.abort_transaction()
    finally:
        await producer.stop()


async def hanging_on_a_fresh_topic(broker: OwnBroker) -> tuple[str, TopicPartition, int]:
    topic = f"t-hanging-{uuid.uuid4().hex[:8]}"
    await create_topics(broker.bootstrap, topic, partitions=2)
    transactional_id = f"tid-{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 1)
    offset = await fabricate_hanging_transaction(broker.bootstrap, transactional_id, tp)
    return transactional_id, tp, offset


async def test_the_fabricated_transaction_outlives_its_producer_and_the_next_epoch(
    unverified_broker: OwnBroker,
) -> None:
    bootstrap = unverified_broker.bootstrap
    transactional_id, tp, offset = await hanging_on_a_fresh_topic(unverified_broker)
    assert offset == 0
    assert await wait_until_hanging(bootstrap, tp) == (0, 1)
    # InitProducerId of the same id: the coordinator aborts only what it knows of, and it
    # answers only once that abort is written, so nothing more can come of it later.
    await fence(bootstrap, transactional_id)
    assert await partition_offsets(bootstrap, tp) == (0, 1)
    assert await committed_values(bootstrap, tp) == []
    other = TopicPartition(tp.topic, 0)
    assert await partition_offsets(bootstrap, other) == (0, 0)


async def test_the_next_commit_of_the_same_producer_id_makes_it_visible(
    unverified_broker: OwnBroker,
) -> None:
    bootstrap = unverified_broker.bootstrap
    transactional_id, tp, _ = await hanging_on_a_fresh_topic(unverified_broker)
    await transact(bootstrap, transactional_id, tp, commit=True)
    # The COMMIT marker is written for the producer id, so it ends the batch of the epoch
    # before as well: both records become visible.
    assert await partition_offsets(bootstrap, tp) == (3, 3)
    assert await committed_values(bootstrap, tp) == [b"a batch no marker will end", b"next"]


async def test_an_abort_of_the_same_producer_id_ends_it_unseen(
    unverified_broker: OwnBroker,
) -> None:
    bootstrap = unverified_broker.bootstrap
    transactional_id, tp, _ = await hanging_on_a_fresh_topic(unverified_broker)
    await transact(bootstrap, transactional_id, tp, commit=False)
    assert await partition_offsets(bootstrap, tp) == (3, 3)
    assert await committed_values(bootstrap, tp) == []


async def test_a_broker_that_verifies_refuses_to_let_it_be_made(
    kafka_bootstrap: str, kafka_topics: CreateTopics, unique_name: str
) -> None:
    (topic,) = await kafka_topics(unique_name)
    tp = TopicPartition(topic, 0)
    with pytest.raises(VerifiedProduceError):
        await fabricate_hanging_transaction(kafka_bootstrap, f"{unique_name}-tid", tp)
    assert await partition_offsets(kafka_bootstrap, tp) == (0, 0)
