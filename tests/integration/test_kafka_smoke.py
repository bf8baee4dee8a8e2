"""Smoke tests of the real broker: topic layout, read_committed transactions and the size limit.

Guarantee: what the runtime relies on from Kafka (compaction, transactional offsets, fencing of
aborted records, loud size failures) is checked against a live broker, never a mock.
"""

from __future__ import annotations

import os
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError, MessageSizeTooLargeError

pytestmark = pytest.mark.kafka

WAIT_S = 30.0


async def _topic_config(bootstrap: str, topic: str, key: str) -> str:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, configs={key: None})]
        )
    finally:
        await admin.close()
    for response in responses:
        for _code, _message, _type, name, entries in response.resources:
            if name == topic:
                for entry in entries:
                    if entry[0] == key:
                        return str(entry[1])
    raise AssertionError(f"topic=<{topic}>, key=<{key}> | not described")


async def _read_all(
    bootstrap: str, topic: str, partitions: int, isolation_level: str
) -> list[ConsumerRecord[bytes, bytes]]:
    """Reads a topic from the start up to its end (the last stable offset for read_committed)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level=isolation_level,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        assigned = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(assigned)
        await consumer.seek_to_beginning(*assigned)
        ends = await consumer.end_offsets(assigned)
        records: list[ConsumerRecord[bytes, bytes]] = []
        deadline = time.monotonic() + WAIT_S
        while [tp for tp in assigned if await consumer.position(tp) < ends[tp]]:
            assert time.monotonic() < deadline, f"topic=<{topic}> | end offsets never reached"
            batches = await consumer.getmany(timeout_ms=500)
            for batch in batches.values():
                records.extend(batch)
        return records
    finally:
        await consumer.stop()


async def test_admin_creates_partitioned_and_compacted_topics(
    kafka_bootstrap: str, kafka_topics, unique_name: str
) -> None:
    commands, sessions = f"{unique_name}.commands", f"{unique_name}.sessions"
    await kafka_topics(commands, partitions=4)
    await kafka_topics(sessions, partitions=4, config={"cleanup.policy": "compact"})

    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        described = {t["topic"]: t for t in await admin.describe_topics([commands, sessions])}
    finally:
        await admin.close()
    assert len(described[commands]["partitions"]) == 4
    assert len(described[sessions]["partitions"]) == 4
    assert await _topic_config(kafka_bootstrap, sessions, "cleanup.policy") == "compact"
    assert await _topic_config(kafka_bootstrap, commands, "cleanup.policy") == "delete"


async def test_transactional_consume_process_produce_is_read_committed(
    kafka_bootstrap: str, kafka_topics, unique_name: str
) -> None:
    source, sink, group = f"{unique_name}.in", f"{unique_name}.out", f"{unique_name}-group"
    await kafka_topics(source, sink, partitions=1)
    source_tp = TopicPartition(source, 0)

    seed = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await seed.start()
    try:
        for value in (b"one", b"two", b"three"):
            await seed.send_and_wait(source, value, key=b"session-1")
    finally:
        await seed.stop()

    consumer = AIOKafkaConsumer(
        source,
        bootstrap_servers=kafka_bootstrap,
        group_id=group,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, transactional_id=f"{unique_name}-txn"
    )
    await consumer.start()
    await producer.start()
    try:
        consumed: list[ConsumerRecord[bytes, bytes]] = []
        deadline = time.monotonic() + WAIT_S
        while len(consumed) < 3:
            assert time.monotonic() < deadline, f"consumed=<{len(consumed)}> | input not read"
            batches = await consumer.getmany(timeout_ms=1000)
            consumed.extend(batches.get(source_tp, []))
        assert [r.value for r in consumed] == [b"one", b"two", b"three"]

        async with producer.transaction():
            for record in consumed[:2]:
                await producer.send_and_wait(sink, record.value.upper(), key=record.key)
            await producer.send_offsets_to_transaction({source_tp: consumed[1].offset + 1}, group)

        await producer.begin_transaction()
        await producer.send_and_wait(sink, b"ABORTED-THREE", key=consumed[2].key)
        await producer.send_offsets_to_transaction({source_tp: consumed[2].offset + 1}, group)
        await producer.abort_transaction()

        assert await consumer.committed(source_tp) == consumed[1].offset + 1
    finally:
        await producer.stop()
        await consumer.stop()

    committed = await _read_all(kafka_bootstrap, sink, 1, "read_committed")
    assert [r.value for r in committed] == [b"ONE", b"TWO"]
    # The aborted record did reach the log: only the isolation level keeps it from readers.
    uncommitted = await _read_all(kafka_bootstrap, sink, 1, "read_uncommitted")
    assert [r.value for r in uncommitted] == [b"ONE", b"TWO", b"ABORTED-THREE"]


async def test_record_over_the_topic_size_limit_fails_on_the_producer(
    kafka_bootstrap: str, kafka_topics, unique_name: str
) -> None:
    topic = f"{unique_name}.small"
    await kafka_topics(topic, config={"max.message.bytes": "65536"})
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, acks="all", max_request_size=4 * 1024 * 1024
    )
    await producer.start()
    try:
        with pytest.raises(KafkaError) as raised:
            await producer.send_and_wait(topic, os.urandom(200_000), key=b"k")
        assert isinstance(raised.value, MessageSizeTooLargeError), repr(raised.value)
        await producer.send_and_wait(topic, b"small", key=b"k")
    finally:
        await producer.stop()
    assert [r.value for r in await _read_all(kafka_bootstrap, topic, 1, "read_committed")] == [
        b"small"
    ]


async def test_record_over_the_client_request_limit_is_refused_before_sending(
    kafka_bootstrap: str, kafka_topics, unique_name: str
) -> None:
    topic = f"{unique_name}.big"
    await kafka_topics(topic)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, max_request_size=100_000)
    await producer.start()
    try:
        with pytest.raises(MessageSizeTooLargeError):
            await producer.send_and_wait(topic, os.urandom(150_000))
    finally:
        await producer.stop()
    assert await _read_all(kafka_bootstrap, topic, 1, "read_uncommitted") == []
