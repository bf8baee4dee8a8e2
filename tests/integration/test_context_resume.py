"""A summarized session moves to another instance: the new owner sends the model exactly the
context the first would have sent, summary included, read back from the sessions topic."""

from __future__ import annotations

from typing import Any

import pytest

from service.agent.events import Stopped
from service.agent.loop import Invocation, run_invocation
from service.agent.state import SessionState
from tests.support.agents import WindowModel, windowed
from tests.support.runtime_harness import (
    Client,
    Cluster,
    checkpoint_resume,
    invoke,
    services,
    unique,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]

PROMPT = "Record six steps."
SWITCH_AFTER = 8
"""Commands the first instance answers: past the first summary (written by the 7th)."""


async def straight_run() -> list[list[dict[str, Any]]]:
    """What the model receives when one process runs the whole turn without pausing."""
    agent = windowed()
    events = [
        e
        async for e in run_invocation(
            agent, SessionState(session_id="x"), Invocation("c", PROMPT, checkpointing=False)
        )
    ]
    last = events[-1]
    assert isinstance(last, Stopped) and last.result.stop_reason == "end_turn"
    assert isinstance(agent.model, WindowModel)
    return agent.model.seen


async def test_a_summarized_session_resumed_elsewhere_sends_the_same_context(
    cluster: Cluster,
) -> None:
    expected = await straight_run()
    summaries = [m for m in expected if "Summarize" in str(m[-1])]
    assert len(summaries) == 2, "the scenario writes two summaries"
    session = unique("s")
    stops: list[str] = []
    with services() as procs:
        async with Client(cluster) as client:
            first = cluster.start("first")
            procs.append(first)
            await first.wait_ready()
            command = invoke(session, PROMPT, agent="windowed")
            proc = first
            for n in range(1, 14):
                await client.send(command)
                result = await client.result(command["command_id"], alive=proc)
                stops.append(result["stop_reason"])
                if result["stop_reason"] != "checkpoint":
                    break
                command = checkpoint_resume(session, result["checkpoint"])
                if n == SWITCH_AFTER:
                    assert await first.terminate() == 0, first.text()[-3000:]
                    proc = cluster.start("second")
                    procs.append(proc)
                    await proc.wait_ready()
            assert await proc.terminate() == 0, proc.text()[-3000:]
    assert stops == ["checkpoint"] * 12 + ["end_turn"]
    calls = [c for c in cluster.model_calls() if c["session_id"] == session]
    assert [c["messages"] for c in calls] == expected
    pids = [c["pid"] for c in calls]
    # the first instance: calls 0-2, the first summary, call 3; the second: call 4, the
    # second summary, calls 5 and 6 (no summary written again after the move)
    assert pids == [pids[0]] * 5 + [pids[-1]] * 4 and pids[0] != pids[-1]
    assert [c["summary"] for c in calls] == [False] * 3 + [True] + [False] * 2 + [True] + [
        False
    ] * 2
    # its first call opens with the summary the first instance wrote, read from the topic
    assert calls[5]["messages"][0] == {
        "role": "user",
        "content": [{"text": "Summary: steps w0, w1 recorded."}],
    }
