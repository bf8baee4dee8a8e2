"""Limits counted across the turn and metrics per invocation plus turn totals (SEMANTICS §6-7)."""

from __future__ import annotations

import time

from engine_helpers import call, check_history, invoke, make_agent, resume, roundtrip

from service.agent.state import SessionState
from service.agent.types import Limits, Usage
from service.providers.scripted import ScriptedReply

THREE_CYCLES = [call("echo", text="1"), call("echo", text="2"), call("echo", text="3"), "done"]


def new_state() -> SessionState:
    return SessionState(session_id="s-lim")


async def _run_turn(agent, limits=None):  # type: ignore[no-untyped-def]
    out = await invoke(agent, new_state(), "go", limits=limits)
    outcomes = [out]
    while out.stop == "checkpoint":
        out = await invoke(agent, roundtrip(out.state), resume(out))
        outcomes.append(out)
    return outcomes


async def test_max_cycles_trips_across_paused_invocations() -> None:
    agent = make_agent(THREE_CYCLES, limits=Limits(max_cycles=2))
    outcomes = await _run_turn(agent)
    stops = [o.stop for o in outcomes]
    assert stops == ["checkpoint"] * 4 + ["limit_turns"]
    last = outcomes[-1]
    assert last.result.metrics["turn"]["cycles"] == 2
    assert last.state.checkpoint is None and last.state.pending is None
    check_history(last.state)


async def test_limits_given_on_the_prompt_stick_to_the_turn() -> None:
    agent = make_agent(THREE_CYCLES)
    outcomes = await _run_turn(agent, limits=Limits(max_cycles=1))
    assert [o.stop for o in outcomes] == ["checkpoint", "checkpoint", "limit_turns"]


async def test_max_cycles_without_checkpointing() -> None:
    agent = make_agent(THREE_CYCLES, checkpointing=False, limits=Limits(max_cycles=3))
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "limit_turns"
    assert out.result.metrics["invocation"]["cycles"] == 3


async def test_max_tokens_counts_the_whole_turn() -> None:
    usage = Usage(input_tokens=40, output_tokens=10)
    script = [
        ScriptedReply(tool_calls=(call("echo", text="a"),), usage=usage),
        ScriptedReply(tool_calls=(call("echo", text="b"),), usage=usage),
        ScriptedReply(text="done", usage=usage),
    ]
    agent = make_agent(script, limits=Limits(max_tokens=100))
    outcomes = await _run_turn(agent)
    assert [o.stop for o in outcomes][-1] == "limit_total_tokens"
    assert outcomes[-1].result.metrics["turn"]["usage"]["totalTokens"] == 100


async def test_deadline_counts_from_the_turn_start() -> None:
    agent = make_agent(THREE_CYCLES, limits=Limits(deadline_s=60))
    out = await invoke(agent, new_state(), "go")
    state = out.state
    assert state.turn_started_at is not None
    state.turn_started_at = time.time() - 61
    out = await invoke(agent, state, resume(out))
    assert out.stop == "checkpoint", "the deadline is checked before model calls only"
    out = await invoke(agent, out.state, resume(out))
    assert out.stop == "error"
    assert out.result.error is not None and out.result.error.code == "limit_exceeded"
    check_history(out.state)


async def test_a_new_turn_resets_the_counters() -> None:
    agent = make_agent(
        [call("echo", text="1"), "done"], checkpointing=False, limits=Limits(max_cycles=2)
    )
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "end_turn"
    out = await invoke(agent, out.state, "again")
    assert out.stop == "end_turn"
    assert out.result.metrics["turn"]["cycles"] == 2


async def test_metrics_per_invocation_and_turn_totals() -> None:
    agent = make_agent([call("echo", text="a"), call("add", a=1, b=2), "done"])
    outcomes = await _run_turn(agent)
    invocations = [o.result.metrics["invocation"] for o in outcomes]
    assert [m["cycles"] for m in invocations] == [1, 0, 1, 0, 1]
    assert [sorted(m["tools"]) for m in invocations] == [[], ["echo"], [], ["add"], []]
    assert invocations[1]["tools"]["echo"]["calls"] == 1
    assert invocations[1]["usage"]["totalTokens"] == 0
    turns = [o.result.metrics["turn"] for o in outcomes]
    assert [t["invocations"] for t in turns] == [1, 2, 3, 4, 5]
    final = turns[-1]
    assert final["cycles"] == 3
    assert final["usage"] == {"inputTokens": 30, "outputTokens": 15, "totalTokens": 45}
    assert final["tools"]["echo"]["calls"] == 1 and final["tools"]["add"]["calls"] == 1
    assert final == outcomes[-1].state.turn_metrics
    assert final["duration_ms"] >= max(m["duration_ms"] for m in invocations)


async def test_tool_errors_are_counted() -> None:
    agent = make_agent([call("add", a="x", b=1), "done"], checkpointing=False)
    out = await invoke(agent, new_state(), "go")
    assert out.result.metrics["invocation"]["tools"]["add"]["errors"] == 1
