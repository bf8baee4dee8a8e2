"""An instance whose producer is fenced while the group still gives it the partitions (a
transaction the broker aborted, a stray producer with the same id) takes them back after a
session timeout, instead of leaving them unserved until the next rebalance."""

from __future__ import annotations

from collections import Counter

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition

from tests.support.runtime_harness import Client, Cluster, invoke, services, unique
from tests.support.txn_probe import offsets_writers

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.timeout(120)]


async def fence_the_instance(cluster: Cluster) -> None:
    """Initialise elsewhere every transactional id the committed offsets name (a producer per
    partition, or the instance's one): the broker fences the owners' producers."""
    commands = [TopicPartition(cluster.topics.commands, p) for p in range(cluster.partitions)]
    writers = await offsets_writers(cluster.bootstrap, cluster.group, commands)
    for transactional_id in sorted(set(writers.values())):
        producer = AIOKafkaProducer(
            bootstrap_servers=cluster.bootstrap, transactional_id=transactional_id
        )
        await producer.start()
        await producer.stop()


async def test_a_fenced_owner_still_assigned_is_re_created(cluster: Cluster) -> None:
    session = unique("s")
    first = invoke(session, "one", agent="simple")
    second = invoke(session, "two", agent="simple")
    with services() as procs:
        service = cluster.start("only")
        procs.append(service)
        await service.wait_ready()
        async with Client(cluster) as client:
            await client.send(first)
            await client.result(first["command_id"], timeout=30)
            await fence_the_instance(cluster)
            # Its commit fails as fenced; no other member exists to take the partition over.
            await client.send(second)
            await service.wait_log("producer fenced", timeout=30)
            result = await client.result(second["command_id"], timeout=60, alive=service)
            assert result["stop_reason"] == "end_turn"
            assert service.log_count("still owned after being fenced") >= 1
            assert await service.terminate() == 0, service.text()[-3000:]
            await client.caught_up()
    assert Counter(r["command_id"] for r in client.results) == Counter(
        {first["command_id"]: 1, second["command_id"]: 1}
    )
    assert "never retrieved" not in service.text()
