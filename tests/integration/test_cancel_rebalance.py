"""Cancels across a change of owner: one read but not yet acted on is answered by the owner
after the rebalance, exactly once; one answered and committed still covers an older command
that only the next owner reads."""

from __future__ import annotations

import time

import pytest

from tests.support.runtime_harness import (
    Client,
    Cluster,
    cancel,
    invoke,
    services,
    unique,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]

AGENTS = "tests.support.cancel_agents:registry"


async def test_a_deferred_cancel_survives_a_rebalance(cluster: Cluster) -> None:
    s = unique("s")
    command = invoke(s, "go", agent="patient")
    deferred = cancel(s, after_current_tools=True)
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
            await client.send(deferred, topic=cluster.topics.control)
            await first.wait_log("cancel read")
            second = cluster.start("second", **env)
            procs.append(second)
            await first.wait_log("partitions revoked", count=2)
            stopped = await client.result(command["command_id"], 60, alive=second)
            assert stopped["stop_reason"] == "cancelled", stopped
            own = await client.result(str(deferred["command_id"]), 60, alive=second)
            assert own["stop_reason"] == "cancelled", own
            await client.caught_up()
    assert len(client.results_for(command["command_id"])) == 1
    assert len(client.results_for(str(deferred["command_id"]))) == 1
    # The batch ran to its end (deferred) at least once, and no second model call happened.
    # The new owner either re-ran the batch to its end (the command read first) or resolved the
    # committed after_model boundary (the cancel read first); a deferred cancel never woke a
    # tool, and the model was never called again.
    outcomes = [c["outcome"] for c in cluster.tool_calls() if "outcome" in c]
    assert set(outcomes) <= {"waited"}, outcomes
    assert len([m for m in cluster.model_calls() if m["session_id"] == s]) == 1


async def test_a_committed_cancel_covers_an_older_command_first_read_by_the_next_owner(
    cluster: Cluster,
) -> None:
    s = unique("s")
    hello = invoke(s, "hello", agent="simple")
    late = cancel(s)
    cancelled_at = int(time.time() * 1000)
    with services() as procs:
        first = cluster.start("first", CAIRN_AGENTS=AGENTS)
        procs.append(first)
        await first.wait_ready()
        async with Client(cluster) as client:
            await client.send(hello)
            assert (await client.result(hello["command_id"], 30, alive=first))["error"] is None
            await client.send(late, topic=cluster.topics.control, timestamp_ms=cancelled_at)
            own = await client.result(str(late["command_id"]), 30, alive=first)
            assert own["stop_reason"] == "cancelled", own
            # The cancel's answer and offset are committed: the next owner never reads it.
            first.kill()
            second = cluster.start("second", CAIRN_AGENTS=AGENTS)
            procs.append(second)
            # Published before the cancel (its record says so), read for the first time now.
            older = invoke(s, "older", agent="simple")
            await client.send(older, timestamp_ms=cancelled_at - 1000)
            newer = invoke(s, "newer", agent="simple")
            await client.send(newer)
            skipped = await client.result(older["command_id"], 60, alive=second)
            assert skipped["stop_reason"] == "cancelled", skipped
            ran = await client.result(newer["command_id"], 30, alive=second)
            assert ran["stop_reason"] == "end_turn", ran
            await client.caught_up()
    for command_id in (hello["command_id"], late["command_id"], older["command_id"]):
        assert len(client.results_for(str(command_id))) == 1, command_id
    assert len(client.results_for(newer["command_id"])) == 1
    assert second.log_count("command covered by a cancel") == 1
    # The older command never reached the model: one call for `hello`, one for `newer`.
    assert len([m for m in cluster.model_calls() if m["session_id"] == s]) == 2
