"""Deleting a session: one result, tombstones for its head and every history record, and after
compaction nothing of it left on the sessions topic; its id then starts a fresh session."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from service.client.kafka_io import partition_for
from tests.support.runtime_harness import (
    Client,
    Cluster,
    committed_records,
    delete,
    invoke,
    services,
    unique,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]

FAST_COMPACTION = {
    # AlterConfigs replaces a topic's whole configuration: the policy must be said again.
    "cleanup.policy": "compact",
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": "0",
    "min.compaction.lag.ms": "0",
}


async def _compact_quickly(cluster: Cluster) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    await admin.start()
    try:
        resource = ConfigResource(
            ConfigResourceType.TOPIC, cluster.topics.sessions, configs=FAST_COMPACTION
        )
        await admin.alter_configs([resource])
    finally:
        await admin.close()


def _same_partition(session_id: str, partitions: int) -> str:
    """Another session id of the same partition (its writes roll and dirty that log)."""
    wanted = partition_for(session_id, partitions)
    while True:
        other = unique("filler")
        if partition_for(other, partitions) == wanted:
            return other


async def _keys_of(cluster: Cluster, session_id: str) -> list[bytes]:
    records = await committed_records(
        cluster.bootstrap, cluster.topics.sessions, cluster.partitions
    )
    head = session_id.encode()
    return [r.key for r in records if r.key == head or r.key.startswith(head + b"\x00")]


async def _newest_values(cluster: Cluster, session_id: str) -> dict[bytes, bytes]:
    """The session's keys whose newest record on the sessions topic is not a tombstone."""
    records = await committed_records(
        cluster.bootstrap, cluster.topics.sessions, cluster.partitions
    )
    head = session_id.encode()
    newest: dict[bytes, bytes | None] = {}
    for r in records:
        if r.key == head or r.key.startswith(head + b"\x00"):
            newest[r.key] = r.value
    return {key: value for key, value in newest.items() if value is not None}


async def test_a_deleted_session_is_compacted_away_and_its_id_starts_afresh(
    cluster: Cluster,
) -> None:
    await _compact_quickly(cluster)
    session = unique("s")
    filler = _same_partition(session, cluster.partitions)
    with services() as procs:
        proc = cluster.start()
        procs.append(proc)
        await proc.wait_ready()
        async with Client(cluster) as client:
            for turn in range(3):
                command = invoke(session, f"turn {turn}", agent="simple")
                await client.send(command)
                await client.result(command["command_id"], alive=proc)
            # A head, six messages, three applied command ids and three versions (an entry and
            # a body each).
            assert len(set(await _keys_of(cluster, session))) == 16
            erase = delete(session, metadata={"ticket": "gdpr-1"})
            await client.send(erase)
            result = await client.result(erase["command_id"], alive=proc)
            assert result["stop_reason"] == "end_turn"
            assert result["metadata"] == {"ticket": "gdpr-1"}
            assert result["deleted"] == {
                "existed": True,
                "records": 16,
                "stopped": None,
                "skipped": [],
            }
            # Every key the session ever had ends in a tombstone.
            assert await _newest_values(cluster, session) == {}
            # Writes of another session of the partition roll its segments, so the broker's
            # cleaner compacts it: first the records, then the tombstones.
            deadline = time.monotonic() + 120
            while await _keys_of(cluster, session):
                assert time.monotonic() < deadline, "the deleted session was not compacted away"
                command = invoke(filler, "fill", agent="simple")
                await client.send(command)
                await client.result(command["command_id"], alive=proc)
                await asyncio.sleep(0.5)
            again = invoke(session, "hello again", agent="simple")
            await client.send(again)
            fresh = await client.result(again["command_id"], alive=proc)
            assert fresh["message"]["content"] == [{"text": "done turn 1"}]
            # A delete of a session that has no state says so.
            nothing = delete(unique("s"))
            await client.send(nothing)
            empty = await client.result(nothing["command_id"], alive=proc)
            assert empty["deleted"]["existed"] is False and empty["deleted"]["records"] == 0
        assert await proc.terminate() == 0
    assert len(client.results_for(erase["command_id"])) == 1


async def test_a_delete_stops_the_running_invocation_and_skips_what_was_queued(
    cluster: Cluster,
) -> None:
    session = unique("s")
    with services() as procs:
        proc = cluster.start(CAIRN_TEST_TOOL_SLEEP="3")
        procs.append(proc)
        await proc.wait_ready()
        async with Client(cluster) as client:
            running = invoke(session, "go", agent="slowtools")
            queued = invoke(session, "after", agent="simple")
            erase = delete(session)
            again = delete(session)
            later = invoke(session, "new life", agent="simple")
            await client.send(running)
            await wait_for(lambda: bool(cluster.tool_calls()), 30, "slow tool", alive=proc)
            await client.send(queued, erase, again, later)
            result = await client.result(erase["command_id"], alive=proc)
            assert result["deleted"]["existed"] is True
            assert result["deleted"]["stopped"] == running["command_id"]
            assert result["deleted"]["skipped"] == [queued["command_id"]]
            # The second delete, read while the first was waiting its turn, found nothing left:
            # what the first stopped and skipped is the first's alone.
            second = await client.result(again["command_id"], alive=proc)
            assert second["deleted"] == {
                "existed": False,
                "records": 0,
                "stopped": None,
                "skipped": [],
            }
            stopped = await client.result(running["command_id"], alive=proc)
            assert stopped["stop_reason"] == "cancelled"
            skipped = await client.result(queued["command_id"], alive=proc)
            assert skipped["stop_reason"] == "cancelled"
            fresh = await client.result(later["command_id"], alive=proc)
            assert fresh["message"]["content"] == [{"text": "done turn 1"}]
        assert await proc.terminate() == 0


async def test_an_idle_session_expires_with_an_event_and_its_id_starts_afresh(
    cluster: Cluster,
) -> None:
    idle, busy = unique("s"), unique("s")
    with services() as procs:
        proc = cluster.start(CAIRN_SESSIONS__IDLE_TTL_S="3")
        procs.append(proc)
        await proc.wait_ready()
        async with Client(cluster) as client:
            first = invoke(idle, "hello", agent="simple")
            await client.send(first)
            await client.result(first["command_id"], alive=proc)
            # The other session is written to every second: never idle for 3 s.
            started = asyncio.get_running_loop().time()
            kept = []
            while not _expired(client, idle):
                assert asyncio.get_running_loop().time() - started < 30, "no session_expired"
                command = invoke(busy, "still here", agent="simple")
                await client.send(command)
                await client.result(command["command_id"], alive=proc)
                kept.append(command)
                await asyncio.sleep(1)
            [event] = _expired(client, idle)
            assert event["command_id"] == first["command_id"]
            # A head, two messages, one applied command id and one version's entry and body.
            assert event["idle_s"] >= 3 and event["records"] == 6
            assert not _expired(client, busy)
            assert await _newest_values(cluster, idle) == {}
            again = invoke(idle, "back again", agent="simple")
            await client.send(again)
            fresh = await client.result(again["command_id"], alive=proc)
            assert fresh["message"]["content"] == [{"text": "done turn 1"}]
        assert await proc.terminate() == 0
    turns = [r["message"]["content"][0]["text"] for r in client.session_results(busy)]
    assert turns == [f"done turn {k}" for k in range(1, len(kept) + 1)]


def _expired(client: Client, session_id: str) -> list[dict[str, Any]]:
    return [
        e for e in client.events if e["session_id"] == session_id and e["type"] == "session_expired"
    ]
