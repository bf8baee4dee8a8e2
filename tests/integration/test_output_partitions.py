"""Results, events and dead letters on fewer partitions than the commands
(``topics.output_partitions``): every partition is served, and each answer lands on the
partition its session id keys it to."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from service.runtime.partitioning import keyed_partition
from tests.support.runtime_harness import Client, Cluster, invoke, services, unique

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]

PARTITIONS, OUTPUTS = 4, 2


def _one_session_per_partition() -> Iterator[str]:
    seen: set[int] = set()
    while len(seen) < PARTITIONS:
        session = unique("s")
        home = keyed_partition(session.encode(), PARTITIONS)
        if home not in seen:
            seen.add(home)
            yield session


async def test_every_partition_is_served_with_fewer_output_partitions(
    kafka_bootstrap: str, tmp_path
) -> None:
    cluster = Cluster(kafka_bootstrap, tmp_path, partitions=PARTITIONS, output_partitions=OUTPUTS)
    await cluster.create_topics()
    try:
        with services() as procs:
            proc = cluster.start()
            procs.append(proc)
            # Owners of commands partitions 2 and 3 used to wait for ever on results-2 and -3.
            await proc.wait_ready()
            async with Client(cluster) as client:
                commands = [
                    invoke(s, "hello", agent="simple") for s in _one_session_per_partition()
                ]
                await client.send(*commands)
                await client.wait_results(len(commands))
                for command in commands:
                    [result] = client.results_for(command["command_id"])
                    assert result["stop_reason"] == "end_turn", result
            placed = await _results_partitions(cluster)
            for command in commands:
                key = command["session_id"].encode()
                assert placed[command["command_id"]] == keyed_partition(key, OUTPUTS)
            # The operator is told what is not repaired on such a layout.
            assert proc.log_count("results and events are partitioned unlike the commands") == 1
            assert proc.alive, proc.text()[-3000:]
    finally:
        await cluster.delete_topics()


async def _results_partitions(cluster: Cluster) -> dict[str, int]:
    """The partition each committed result was read from, by command id."""
    consumer = AIOKafkaConsumer(
        **cluster.client_options(), group_id=None, isolation_level="read_committed"
    )
    await consumer.start()
    try:
        partitions = [TopicPartition(cluster.topics.results, p) for p in range(OUTPUTS)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        placed: dict[str, int] = {}
        while [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
            for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                for record in records:
                    placed[_command_id(record.value)] = tp.partition
        return placed
    finally:
        await consumer.stop()


def _command_id(value: bytes | None) -> str:
    assert value is not None
    return str(orjson.loads(value)["command_id"])
