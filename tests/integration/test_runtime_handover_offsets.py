"""A graceful handover (another instance joins, or SIGTERM) commits the input offsets with the
partition's last commit: the group's committed offsets reach the position after the last
answered command, and the next owner re-reads none of them.

Offsets would otherwise join a transaction only every ``runtime.offsets_every_ms``; the tests
set it far beyond their length, so only the last commit of a partition can have moved them.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from tests.support.runtime_harness import Client, Cluster, invoke, services, unique

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]

COMMANDS = 16
_RARE_OFFSETS = {"CAIRN_RUNTIME__OFFSETS_EVERY_MS": "600000"}


async def _committed(cluster: Cluster) -> dict[int, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(cluster.group)
    finally:
        await admin.close()
    commands = cluster.topics.commands
    return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == commands}


async def _ends(cluster: Cluster) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=cluster.bootstrap, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(cluster.topics.commands, p) for p in range(cluster.partitions)]
        ends = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
    return {tp.partition: offset for tp, offset in ends.items() if offset > 0}


async def _wait_committed_at_end(cluster: Cluster, timeout: float = 10.0) -> None:
    """Committed offsets become readable once the commit markers are written: poll briefly."""
    ends = await _ends(cluster)
    assert len(ends) > 1, "the commands should spread over several partitions"
    deadline = time.monotonic() + timeout
    committed = await _committed(cluster)
    while any(committed.get(p) != end for p, end in ends.items()):
        if time.monotonic() > deadline:
            raise AssertionError(f"committed offsets {committed} never reached the ends {ends}")
        await asyncio.sleep(0.05)
        committed = await _committed(cluster)


def _model_calls_per_session(cluster: Cluster) -> Counter[str]:
    return Counter(call["session_id"] for call in cluster.model_calls())


async def _answer_all(client: Client) -> None:
    """Two waves: the first commit of each partition carries offsets, the second's do not."""
    for wave in range(2):
        commands = [invoke(unique("s"), "hello", agent="simple") for _ in range(COMMANDS // 2)]
        await client.send(*commands)
        await client.wait_results((wave + 1) * COMMANDS // 2, timeout=60)


async def test_a_joining_instance_takes_over_without_re_reading_answered_commands(
    cluster: Cluster,
) -> None:
    with services() as procs:
        first = cluster.start("first", **_RARE_OFFSETS)
        procs.append(first)
        await first.wait_log("partition ready", count=cluster.partitions)
        async with Client(cluster) as client:
            await _answer_all(client)
            second = cluster.start("second", **_RARE_OFFSETS)
            procs.append(second)
            await second.wait_ready()
            await first.wait_log("partitions assigned", count=2)
            await _wait_committed_at_end(cluster)
            # Whoever owns a partition now started at its end: nothing was answered twice.
            follow = invoke(unique("s"), "hello again", agent="simple")
            await client.send(follow)
            await client.result(follow["command_id"], timeout=30)
            assert await second.terminate() == 0, second.text()[-3000:]
            assert await first.terminate() == 0, first.text()[-3000:]
    for proc in (first, second):
        assert "duplicate command" not in proc.text(), proc.text()[-3000:]
    calls = _model_calls_per_session(cluster)
    assert len(calls) == COMMANDS + 1 and set(calls.values()) == {1}


async def test_sigterm_commits_the_offsets_of_every_answered_command(cluster: Cluster) -> None:
    with services() as procs:
        first = cluster.start("first", **_RARE_OFFSETS)
        procs.append(first)
        await first.wait_log("partition ready", count=cluster.partitions)
        async with Client(cluster) as client:
            await _answer_all(client)
            assert await first.terminate() == 0, first.text()[-3000:]
            await _wait_committed_at_end(cluster)
            second = cluster.start("second", **_RARE_OFFSETS)
            procs.append(second)
            await second.wait_log("partition ready", count=cluster.partitions)
            follow = invoke(unique("s"), "hello again", agent="simple")
            await client.send(follow)
            await client.result(follow["command_id"], timeout=30, alive=second)
            assert await second.terminate() == 0, second.text()[-3000:]
    assert "duplicate command" not in second.text(), second.text()[-3000:]
    # The second instance ran the new command only.
    by_second = [m["session_id"] for m in cluster.model_calls() if m["pid"] == second.pid]
    assert by_second == [follow["session_id"]]
    calls = _model_calls_per_session(cluster)
    assert len(calls) == COMMANDS + 1 and set(calls.values()) == {1}
