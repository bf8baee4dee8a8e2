"""kill -9 of an owner after it answered refusals whose offsets could not be committed yet.

A long invocation earlier in the partition holds the committed input offset back, so the next
owner reads the refusals again: each must still have exactly one result.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.runtime_harness import Client, Cluster, invoke, services, unique, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.timeout(180)]

AGENTS = "tests.support.cancel_agents:registry"


async def test_refusals_are_not_answered_again_after_a_takeover(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    cluster = Cluster(kafka_bootstrap, tmp_path, partitions=1)
    await cluster.create_topics()
    slow = invoke(unique("s"), "go", agent="patient")
    unknown = invoke(unique("s"), "hi", agent="no-such-agent")
    invalid = invoke(unique("s"), "hi", agent="simple", checkpointing="yes")
    with services() as procs:
        victim = cluster.start("victim", CAIRN_AGENTS=AGENTS, CAIRN_TEST_TOOL_SLEEP="120")
        procs.append(victim)
        await victim.wait_ready()
        async with Client(cluster) as client:
            await client.send(slow)
            await wait_for(
                lambda: any(c["session_id"] == slow["session_id"] for c in cluster.tool_calls()),
                30,
                "the slow tool running",
                alive=victim,
            )
            await client.send(unknown, invalid)
            await client.result(unknown["command_id"], 30, alive=victim)
            await client.result(invalid["command_id"], 30, alive=victim)
            victim.kill()

            fresh = cluster.start("fresh", CAIRN_AGENTS=AGENTS, CAIRN_TEST_TOOL_SLEEP="0")
            procs.append(fresh)
            # The slow command was never answered: the new owner re-reads from it, and so
            # reads the refusals again before it answers the marker.
            marker = invoke(unique("s"), "after", agent="simple")
            await client.send(marker)
            await client.result(slow["command_id"], 60, alive=fresh)
            await client.result(marker["command_id"], 60, alive=fresh)
            await client.caught_up()
            for command in (slow, unknown, invalid, marker):
                assert len(client.results_for(command["command_id"])) == 1, command
