"""kill -9 of the owner between reading a cancel and committing its effect: nothing is lost.

Proven each time: the cancel and the command it stops are answered exactly once, by the instance
that takes over, and the session goes on normally afterwards.
"""

from __future__ import annotations

import orjson
import pytest

from tests.support.runtime_harness import (
    Client,
    Cluster,
    checkpoint_resume,
    invoke,
    services,
    unique,
    wait_for,
)
from tests.support.runtime_harness import (
    cancel as cancel_body,
)

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.timeout(180)]

AGENTS = "tests.support.cancel_agents:registry"


async def test_kill_right_after_a_cancel_of_a_running_invocation_was_read(
    cluster: Cluster,
) -> None:
    s = unique("s")
    command = invoke(s, "go", agent="patient")
    cancel = cancel_body(s, after_current_tools=True)
    with services() as procs:
        # The victim's tool would wait a minute: the deferred cancel cannot finish there.
        victim = cluster.start("victim", CAIRN_AGENTS=AGENTS, CAIRN_TEST_TOOL_SLEEP="60")
        procs.append(victim)
        await victim.wait_ready()
        async with Client(cluster) as client:
            await client.send(command)
            await wait_for(
                lambda: any(c["session_id"] == s for c in cluster.tool_calls()),
                30,
                "tool running",
                alive=victim,
            )
            await client.send(cancel, topic=cluster.topics.control)
            await victim.wait_log("cancel read")
            victim.kill()
            fresh = cluster.start("fresh", CAIRN_AGENTS=AGENTS, CAIRN_TEST_TOOL_SLEEP="1")
            procs.append(fresh)
            stopped = await client.result(command["command_id"], 60, alive=fresh)
            assert stopped["stop_reason"] == "cancelled", stopped
            own = await client.result(str(cancel["command_id"]), 60, alive=fresh)
            assert own["stop_reason"] == "cancelled", own
            after = invoke(s, "again", agent="simple")
            await client.send(after)
            result = await client.result(after["command_id"], 30, alive=fresh)
            assert result["stop_reason"] == "end_turn", result
            await client.caught_up()
    for command_id in (command["command_id"], cancel["command_id"], after["command_id"]):
        assert len(client.results_for(str(command_id))) == 1, command_id
    assert not client.results_for(str(cancel["command_id"]))[0]["error"]
    # The victim never committed anything for the cancel: no result carries its process.
    assert victim.log_count("cancel answered") == 0


async def test_kill_before_the_commit_of_a_cancel_that_resolves_a_pause(cluster: Cluster) -> None:
    s = unique("s")
    command = invoke(s, "go", agent="bench")
    cancel = cancel_body(s, message="Not this time")
    with services() as procs:
        first = cluster.start("first", CAIRN_AGENTS=AGENTS)
        procs.append(first)
        await first.wait_ready()
        async with Client(cluster) as client:
            await client.send(command)
            paused = await client.result(command["command_id"], 30, alive=first)
            assert paused["stop_reason"] == "checkpoint", paused
            first.kill()
            # Its first commit is the cancel's: it produces the result, then dies uncommitted.
            victim = cluster.start(
                "victim",
                CAIRN_AGENTS=AGENTS,
                CAIRN_FAULTS__KILL_AT="after_produce_before_commit",
            )
            procs.append(victim)
            await victim.wait_ready()
            await client.send(cancel, topic=cluster.topics.control)
            await wait_for(lambda: not victim.alive, 30, "victim killed at its commit")
            assert victim.log_count("cancel answered") == 1
            fresh = cluster.start("fresh", CAIRN_AGENTS=AGENTS)
            procs.append(fresh)
            own = await client.result(str(cancel["command_id"]), 60, alive=fresh)
            assert own["stop_reason"] == "cancelled", own
            text = own["message"]["content"][0]["text"]
            assert text == "Not this time"
            stale = checkpoint_resume(s, paused["checkpoint"])
            await client.send(stale)
            refused = await client.result(stale["command_id"], 30, alive=fresh)
            assert refused["error"]["code"] == "checkpoint_stale", refused
            await client.caught_up()
    assert len(client.results_for(str(cancel["command_id"]))) == 1
    assert len(client.results_for(command["command_id"])) == 1
    assert orjson.dumps(own["state"]) == orjson.dumps(paused["state"])


async def test_kill_before_the_commit_of_a_cancel_whose_target_has_not_arrived(
    cluster: Cluster,
) -> None:
    s = unique("s")
    target = invoke(s, "later", agent="simple")
    cancel = cancel_body(s, target_command_id=target["command_id"])
    with services() as procs:
        victim = cluster.start(
            "victim", CAIRN_AGENTS=AGENTS, CAIRN_FAULTS__KILL_AT="after_produce_before_commit"
        )
        procs.append(victim)
        await victim.wait_ready()
        async with Client(cluster) as client:
            await client.send(cancel, topic=cluster.topics.control)
            await wait_for(lambda: not victim.alive, 30, "victim killed at its commit")
            assert victim.log_count("cancel answered") == 1
            fresh = cluster.start("fresh", CAIRN_AGENTS=AGENTS)
            procs.append(fresh)
            own = await client.result(str(cancel["command_id"]), 60, alive=fresh)
            assert own["stop_reason"] == "cancelled", own
            assert own["cancel"]["skipped"] == [], own  # not read yet: not answered ahead
            follow = invoke(s, "after", agent="simple")
            await client.send(target, follow)
            late = await client.result(target["command_id"], 30, alive=fresh)
            assert late["stop_reason"] == "cancelled", late
            done = await client.result(follow["command_id"], 30, alive=fresh)
            assert done["stop_reason"] == "end_turn", done
            await client.caught_up()
    for command_id in (cancel["command_id"], target["command_id"], follow["command_id"]):
        assert len(client.results_for(str(command_id))) == 1, command_id
    # The target never ran: the only model call is the follow-up's.
    assert len([m for m in cluster.model_calls() if m["session_id"] == s]) == 1
