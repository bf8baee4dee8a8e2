"""kill -9 of the owning instance while a delete waits behind a running invocation of another
session of its partition: after the takeover, the delete, and what its session did after it,
are each answered exactly once, and the session goes on from the fresh start the delete made.

Nothing remembers a delete once its session is gone: answered while an earlier record of the
partition still ran, its offset could not be committed, and the next owner read it again and
deleted what the session had done since. Proven from the committed results a client reads.
"""

from __future__ import annotations

import pytest

from service.client.kafka_io import partition_for
from tests.support.runtime_harness import (
    Client,
    Cluster,
    delete,
    invoke,
    services,
    unique,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.timeout(180)]


def _on_partition(partition: int, partitions: int) -> str:
    while True:
        session = unique("s")
        if partition_for(session, partitions) == partition:
            return session


async def test_a_delete_read_again_after_a_takeover_is_answered_once(cluster: Cluster) -> None:
    busy = unique("busy")
    partition = partition_for(busy, cluster.partitions)
    erased, marker = (_on_partition(partition, cluster.partitions) for _ in range(2))
    before = invoke(erased, "before", agent="simple")
    running = invoke(busy, "go", agent="slowtools")
    erase = delete(erased)
    after = invoke(erased, "after", agent="simple")
    passed = invoke(marker, "read past them", agent="simple")
    with services() as procs:
        victim = cluster.start("victim", CAIRN_TEST_TOOL_SLEEP="120")
        procs.append(victim)
        await victim.wait_ready()
        async with Client(cluster) as client:
            await client.send(before)
            await client.result(before["command_id"], alive=victim)
            await client.send(running)
            await wait_for(lambda: bool(cluster.tool_calls()), 30, "the slow tool", alive=victim)
            await client.send(erase, after, passed)
            # Read past the delete: everything before the marker was read by then.
            await client.result(passed["command_id"], alive=victim)
            victim.kill()
            fresh = cluster.start("fresh", CAIRN_TEST_TOOL_SLEEP="0.5")
            procs.append(fresh)
            for command in (running, erase, after):
                await client.result(command["command_id"], timeout=60, alive=fresh)
            again = invoke(erased, "again", agent="simple")
            await client.send(again)
            last = await client.result(again["command_id"], alive=fresh)
            await client.caught_up()
            assert await fresh.terminate() == 0
    for command in (before, running, erase, after, passed, again):
        assert len(client.results_for(command["command_id"])) == 1, command["command_id"]
    (deleted,) = client.results_for(erase["command_id"])
    assert deleted["deleted"]["existed"] is True
    # The session started afresh at the delete and kept what followed it: one turn, then this.
    (fresh_turn,) = client.results_for(after["command_id"])
    assert fresh_turn["message"]["content"] == [{"text": "done turn 1"}]
    assert last["message"]["content"] == [{"text": "done turn 2"}]
