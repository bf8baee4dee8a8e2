"""A Strands agent hosted by real service processes (``CAIRN_AGENTS`` naming a registry of
Strands agents): its Strands tool's interrupt reaches the caller, and the answer, handled by
another instance, completes the tool with it."""

from __future__ import annotations

import pytest

from tests.support.runtime_harness import (
    Client,
    Cluster,
    ServiceProcess,
    invoke,
    last_session_state,
    resume,
    services,
    unique,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]

REGISTRY = "tests.support.strands_agents:registry"


async def _one_command(
    cluster: Cluster, client: Client, command: dict, procs: list[ServiceProcess]
) -> dict:
    proc = cluster.start(CAIRN_AGENTS=REGISTRY)
    procs.append(proc)
    await proc.wait_ready()
    await client.send(command)
    result = await client.result(command["command_id"], alive=proc)
    assert await proc.terminate() == 0, proc.text()[-3000:]
    return result


async def test_strands_tool_interrupt_answered_on_another_instance(cluster: Cluster) -> None:
    session = unique("s")
    with services() as procs:
        async with Client(cluster) as client:
            first = await _one_command(
                cluster, client, invoke(session, "refund A1", agent="strands-shop"), procs
            )
            assert first["stop_reason"] == "interrupt", first
            [interrupt] = first["interrupts"]
            assert interrupt["name"] == "approval"
            assert interrupt["reason"] == {"order_id": "A1"}
            assert interrupt["id"].startswith("v1:tool_call:t1:")
            answer = [{"interruptResponse": {"interruptId": interrupt["id"], "response": "yes"}}]
            second = await _one_command(cluster, client, resume(session, answer), procs)
    assert second["stop_reason"] == "end_turn", second
    assert second["message"]["content"] == [{"text": "Refund done."}]
    state, _ = await last_session_state(cluster, session)
    [result] = [b["toolResult"] for b in state.messages[2]["content"]]
    assert result["content"] == [{"text": "refund of A1: yes"}], "the tool got its answer"
    calls = cluster.tool_calls()
    assert [c["tool"] for c in calls] == ["refund", "refund"]
    assert calls[0]["pid"] != calls[1]["pid"], "answered by another instance"
