"""The commands topic deleted and created again under running sessions, against a real broker: its
offsets start again at 0, and a command published there with an older time than the newest one
its session answered (a producer that sets its records' timestamps, a replay keeping CreateTime)
is answered, once. The topic's id, which Kafka gives every topic it creates, tells the new log
from the old one."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from tests.support.runtime_harness import (
    Client,
    Cluster,
    delete_topics,
    invoke,
    last_stored_session,
    services,
    unique,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]


async def _created_again(bootstrap: str, topic: str, partitions: int) -> None:
    """Delete ``topic`` and create it anew (Kafka finishes a deletion in the background: the
    creation is refused until it has)."""
    await delete_topics(AIOKafkaAdminClient(bootstrap_servers=bootstrap), [topic])
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                await admin.create_topics([NewTopic(topic, partitions, 1)])
                return
            except TopicAlreadyExistsError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)  # polled: the deletion has no event to wait on
    finally:
        await admin.close()


@pytest.mark.parametrize("across", ["stopped", "running"])
async def test_a_command_of_the_topic_created_anew_runs_though_published_earlier(
    kafka_bootstrap: str, tmp_path: Path, across: str
) -> None:
    """``stopped``: the service stopped while the topic is deleted and created again;
    ``running``: it runs throughout, loses the partition with the topic and owns it anew."""
    cluster = Cluster(kafka_bootstrap, tmp_path, partitions=1)
    await cluster.create_topics()
    session = unique("s")
    try:
        with services() as procs:
            first = cluster.start()
            procs.append(first)
            await first.wait_ready()
            async with Client(cluster) as client:
                sent = [invoke(session, text, agent="simple") for text in ("one", "two", "three")]
                await client.send(*sent)
                for command in sent:
                    assert (await client.result(command["command_id"], alive=first))[
                        "stop_reason"
                    ] == "end_turn"
            if across == "stopped":
                assert await first.terminate() == 0
            await _created_again(kafka_bootstrap, cluster.topics.commands, 1)
            if across == "stopped":
                second = cluster.start()
                procs.append(second)
                await second.wait_ready()
            else:
                second = first
                await second.wait_log("partition ready", count=2, timeout=90)
            async with Client(cluster) as client:
                # Offset 0 of the new log, stamped an hour before the answers of the old one.
                late = invoke(session, "four", agent="simple")
                await client.send(late, timestamp_ms=int(time.time() * 1000) - 3_600_000)
                result = await client.result(late["command_id"], alive=second)
                assert result["stop_reason"] == "end_turn", result
                await client.caught_up()
                assert len(client.results_for(late["command_id"])) == 1
                assert not client.dead_letters
            # The session went on from its state: the old topic's turns are its history.
            stored = await last_stored_session(cluster, session)
            assert [m["role"] for m in stored.state.messages] == ["user", "assistant"] * 4
            # Its position on the new log, named by the topic's id and the partition.
            assert stored.delivery.answered_through is not None
            assert stored.delivery.answered_through[0] == 0
            log = stored.delivery.answered_log
            assert log is not None and log.endswith(":0") and len(log) == 24, log
            assert second.alive
    finally:
        await cluster.delete_topics()
