"""A cancel read, but not yet acted on, when a rebalance takes the partition away: the owner
after the rebalance answers it, and the invocation it stops, exactly once."""

from __future__ import annotations

import pytest

from tests.support.runtime_harness import Client, Cluster, invoke, services, unique, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]

AGENTS = "tests.support.cancel_agents:registry"


async def test_a_deferred_cancel_survives_a_rebalance(cluster: Cluster) -> None:
    s = unique("s")
    command = invoke(s, "go", agent="patient")
    cancel = {
        "type": "cancel",
        "schema_version": 1,
        "command_id": unique("x"),
        "session_id": s,
        "after_current_tools": True,
    }
    # Tools outlast the revoke grace (3 s): the deferred cancel cannot finish before the rebalance.
    env = {"CAIRN_AGENTS": AGENTS, "CAIRN_TEST_TOOL_SLEEP": "6"}
    with services() as procs:
        first = cluster.start("first", **env)
        procs.append(first)
        await first.wait_ready()
        async with Client(cluster) as client:
            await client.send(command)
            await wait_for(
                lambda: any(c["session_id"] == s for c in cluster.tool_calls()),
                30,
                "tool running",
                alive=first,
            )
            await client.send(cancel, topic=cluster.topics.control)
            await first.wait_log("cancel read")
            second = cluster.start("second", **env)
            procs.append(second)
            await first.wait_log("partitions revoked", count=2)
            stopped = await client.result(command["command_id"], 60, alive=second)
            assert stopped["stop_reason"] == "cancelled", stopped
            own = await client.result(str(cancel["command_id"]), 60, alive=second)
            assert own["stop_reason"] == "cancelled", own
            await client.caught_up()
    assert len(client.results_for(command["command_id"])) == 1
    assert len(client.results_for(str(cancel["command_id"]))) == 1
    # The batch ran to its end (deferred) at least once, and no second model call happened.
    # The new owner either re-ran the batch to its end (the command read first) or resolved the
    # committed after_model boundary (the cancel read first); a deferred cancel never woke a
    # tool, and the model was never called again.
    outcomes = [c["outcome"] for c in cluster.tool_calls() if "outcome" in c]
    assert set(outcomes) <= {"waited"}, outcomes
    assert len([m for m in cluster.model_calls() if m["session_id"] == s]) == 1
