"""Input records aiokafka's consumer cannot read (a header key that is not UTF-8), against a real
broker: each comes out once, in its place, marked unreadable, and its partition goes on with
nothing before or after it lost; the service dead-letters it and answers what follows it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from service.runtime.kafka_transport import KafkaInput
from service.runtime.partitioning import keyed_partition
from service.runtime.work import InputRecord
from tests.support.runtime_harness import (
    cancel,
    create_topics_raw,
    delete_topics,
    invoke,
    unique,
    wait_for,
)
from tests.support.stage import Stage, staged
from tests.support.unreadable_writer import BAD_HEADER_KEY, write

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.timeout(120),
    pytest.mark.asyncio(loop_scope="module"),
]


def _records(*specs: str) -> list[dict[str, Any]]:
    """``"a"`` is a record with value ``a``; ``"!a"`` one with a header key that is not UTF-8."""
    return [
        {"key": "k", "value": spec.lstrip("!"), "unreadable": spec.startswith("!")}
        for spec in specs
    ]


async def _take_all(source: KafkaInput, wanted: int) -> dict[int, list[InputRecord]]:
    taken: dict[int, list[InputRecord]] = {}
    for _ in range(100):
        for tp, records in (await source.fetch(200, 500)).items():
            taken.setdefault(tp.partition, []).extend(records)
        if sum(map(len, taken.values())) >= wanted:
            return taken
    offsets = {partition: [r.origin.offset for r in rs] for partition, rs in taken.items()}
    raise AssertionError(f"only {offsets} of {wanted} records")


async def _fetched(source: KafkaInput, tps: list[TopicPartition]) -> None:
    """Until a fetch response has carried each of ``tps`` (buffered, not yet handed out)."""
    await wait_for(lambda: all(source.fetched_at(tp) is not None for tp in tps), 30, f"{tps}")


REPLACED = BAD_HEADER_KEY.decode("utf-8", errors="replace")


async def test_records_with_a_header_key_not_utf8_come_in_order_and_nothing_is_lost(
    kafka_bootstrap: str,
) -> None:
    """aiokafka cannot read such a record, nor any after it in its batch: each comes once, in
    its place, its key read with U+FFFD, and the records before it (of its partition and of
    the partitions the failed call drained) are not lost."""
    topic = unique("unreadable")
    await create_topics_raw(kafka_bootstrap, {topic: 3})
    try:
        # Partitions 0 and 1: readable records, drained before partition 2 (the last in the
        # fetch response) by the call that fails. Partition 2: two transactions (a commit
        # marker between them), a bad record in the middle of the second's batch, then one at
        # the head of a plain batch.
        readable = [
            await write(kafka_bootstrap, topic, partition, [_records("p", "q", "r")])
            for partition in (0, 1)
        ]
        first = await write(
            kafka_bootstrap,
            topic,
            2,
            [_records("a", "b"), _records("c", "!x", "d")],
            transactional=True,
        )
        second = await write(kafka_bootstrap, topic, 2, [_records("!y", "e")])
        consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka_bootstrap,
            isolation_level="read_committed",
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            source = KafkaInput(consumer)
            tps = [TopicPartition(topic, partition) for partition in range(3)]
            consumer.assign(tps)
            for tp in tps:
                source.seek(tp, 0)
            # Partition 2 fetched after the others: the failing call drains them first.
            consumer.pause(tps[2])
            await _fetched(source, tps[:2])
            consumer.resume(tps[2])
            await _fetched(source, tps[2:])
            taken = await _take_all(source, 13)
        finally:
            await consumer.stop()
    finally:
        await delete_topics(AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap), [topic])

    def seen(partition: int) -> list[tuple[int, bytes | None, str]]:
        return [(r.origin.offset, r.value, r.headers[0][0]) for r in taken[partition]]

    assert seen(2) == [
        (offset, value.encode(), REPLACED if value in "xy" else "ok")
        for offset, value in zip([*first, *second], "abcxdye", strict=True)
    ]
    for partition, offsets in enumerate(readable):
        expected = zip(offsets, "pqr", strict=True)
        assert seen(partition) == [(offset, value.encode(), "ok") for offset, value in expected]
    assert all(r.unreadable is None and r.key == b"k" for r in taken[2])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stage(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stage]:
    async with staged(kafka_bootstrap, Path(tmp_path_factory.mktemp("unreadable"))) as ready:
        yield ready


@pytest.mark.parametrize("topic", ["commands", "control"])
async def test_the_service_answers_commands_with_a_header_key_not_utf8(
    stage: Stage, topic: str
) -> None:
    """The command with such a header, the one before it and the one after it in its batch are
    answered once each, and so is a command of another session behind them."""
    session = unique("s")
    partition = keyed_partition(session.encode(), stage.cluster.partitions)
    source = getattr(stage.cluster.topics, topic)
    if topic == "commands":
        sent = [invoke(session, text, agent="simple") for text in ("one", "two", "three")]
    else:
        sent = [cancel(session) for _ in range(3)]
    specs = [
        {"key": session, "value": orjson.dumps(command).decode(), "unreadable": index == 1}
        for index, command in enumerate(sent)
    ]
    await write(stage.cluster.bootstrap, source, partition, [specs])
    later = invoke(unique("s"), "later", agent="simple")
    await stage.client.send(later)
    for command in [*sent, later]:
        result = await stage.result(command["command_id"])
        assert result["stop_reason"] in {"end_turn", "cancelled"}, result
    await stage.exactly_once(*(command["command_id"] for command in [*sent, later]))
    assert stage.service.alive


@pytest.mark.parametrize("compression", ["gzip", "snappy", "lz4", "zstd"])
async def test_commands_compressed_as_kafka_clients_compress_them_are_answered(
    stage: Stage, compression: str
) -> None:
    """Producers compress batches (franz-go with snappy unless told otherwise): the service
    reads every codec Kafka defines."""
    commands = [invoke(unique("s"), "hello", agent="simple") for _ in range(3)]
    producer = AIOKafkaProducer(
        bootstrap_servers=stage.cluster.bootstrap, compression_type=compression, linger_ms=20
    )
    await producer.start()
    try:
        sent = [
            await producer.send(
                stage.cluster.topics.commands,
                key=command["session_id"].encode(),
                value=orjson.dumps(command),
            )
            for command in commands
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
    for command in commands:
        assert (await stage.result(command["command_id"]))["stop_reason"] == "end_turn"
    await stage.exactly_once(*(command["command_id"] for command in commands))
    assert not stage.client.dead_letters
