"""SEMANTICS rules at their edges: one-shot pauses after cancel, turn limits across answers,
null answers, cancel while answering, cancel observed at a boundary, cancelled provider replies."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from engine_helpers import (
    TOOLS,
    answers,
    call,
    check_history,
    invoke,
    make_agent,
    model_of,
    results_of,
    resume,
    roundtrip,
)

from service.agent.cancel import CancelSignal
from service.agent.definition import AgentDefinition
from service.agent.errors import CheckpointStaleError, NoPendingInterruptError
from service.agent.events import Boundary, Stopped
from service.agent.loop import Invocation, resolve_cancel, run_invocation
from service.agent.provider import ModelChunk, ModelProvider, ModelReply, ModelRequest
from service.agent.state import SessionState
from service.agent.tools import ToolContext, tool
from service.agent.types import Limits

CANCELLED = [{"text": "Tool execution cancelled"}]
APPROVAL = "approval"


def new_state() -> SessionState:
    return SessionState(session_id="s-rules")


RAN: list[str] = []


@pytest.fixture(autouse=True)
def _clear() -> None:
    RAN.clear()


@tool(inline=True)
def record(label: str) -> str:
    """Record that it ran."""
    RAN.append(label)
    return f"ran {label}"


@tool(inline=True)
def ask(label: str, context: ToolContext) -> str:
    """Ask a human, then record."""
    answer = context.interrupt(APPROVAL, reason=label)
    RAN.append(label)
    return f"{label}:{answer}"


ALL = [*TOOLS, record, ask]


@pytest.mark.parametrize("deferred", [False, True])
async def test_cancel_observed_at_the_after_tools_boundary_stops_before_the_model(
    deferred: bool,
) -> None:
    agent = make_agent([call("record", "r1", label="a"), "never"], checkpointing=False, tools=ALL)
    signal = CancelSignal()
    events = []
    async for event in run_invocation(agent, new_state(), Invocation("c1", "go"), cancel=signal):
        events.append(event)
        if isinstance(event, Boundary) and event.position == "after_tools":
            signal.cancel(after_current_tools=deferred)
    stopped = events[-1]
    assert isinstance(stopped, Stopped)
    assert stopped.result.stop_reason == "cancelled"
    assert model_of(agent).calls == 1, "no model request after the cancel"
    tool_use_message = stopped.state.messages[1]
    assert stopped.result.message == tool_use_message
    assert stopped.state.messages[-1]["role"] == "user", "no cancel text without a message"
    assert results_of(stopped.state.messages[-1])[0]["content"] == [{"text": "ran a"}]
    check_history(stopped.state)


@pytest.mark.parametrize("deferred", [False, True])
async def test_a_checkpoint_consumed_by_a_cancelled_resume_is_stale(deferred: bool) -> None:
    agent = make_agent([call("record", "r1", label="a"), "never"], tools=ALL)
    paused = await invoke(agent, new_state(), "go")
    signal = CancelSignal()
    signal.cancel(after_current_tools=deferred)
    out = await invoke(agent, paused.state, resume(paused), cancel=signal)
    assert out.stop == "cancelled" and out.state.checkpoint is None
    assert RAN == [], "no batch was running, so even a deferred cancel starts none"
    before = roundtrip(out.state)
    with pytest.raises(CheckpointStaleError):
        await invoke(agent, out.state, resume(paused))
    assert out.state == before


async def test_deferred_cancel_during_the_model_call_stops_at_after_model() -> None:
    # Cancel beats checkpoint at both boundaries; a deferred cancel that came while no batch ran
    # starts none: the reply is kept and its tools are cancelled. The reference pauses here
    # instead and drops the cancel.
    def responder(request: ModelRequest, index: int) -> Any:
        request.cancel.cancel(after_current_tools=True)
        return [call("record", "r1", label="a"), "never"][index]

    agent = make_agent(["unused"], tools=ALL)
    agent.model = type(model_of(agent))(responder)
    out = await invoke(agent, new_state(), "go", cancel=CancelSignal())
    assert out.stop == "cancelled" and out.result.checkpoint is None
    assert RAN == []
    assert out.result.message == out.state.messages[1]
    assert results_of(out.state.messages[2])[0]["content"] == [{"text": "Tool execution cancelled"}]
    assert out.state.checkpoint is None and out.state.pending is None
    check_history(out.state)


async def test_max_cycles_counts_across_interrupt_answers() -> None:
    agent = make_agent([call("ask", "q", label="x"), "never"], checkpointing=False, tools=ALL)
    out = await invoke(agent, new_state(), "go", limits=Limits(max_cycles=1))
    assert out.stop == "interrupt"
    interrupt_id = (out.result.interrupts or [])[0].id
    out = await invoke(agent, out.state, answers((interrupt_id, "yes")))
    assert out.stop == "limit_turns", "the answer invocation inherits the turn's cycle count"
    assert model_of(agent).calls == 1
    assert out.result.message == out.state.messages[-1]
    assert results_of(out.state.messages[-1])[0]["content"] == [{"text": "x:yes"}]
    check_history(out.state)


async def test_max_tokens_trip_after_a_checkpoint_pause_leaves_the_checkpoint_stale() -> None:
    script = [call("record", "r1", label="a"), call("record", "r2", label="b"), "done"]
    agent = make_agent(script, tools=ALL, limits=Limits(max_tokens=20))
    out = await invoke(agent, new_state(), "go")
    out = await invoke(agent, out.state, resume(out))
    paused = out
    assert paused.checkpoint == {
        "position": "after_tools",
        "cycle_index": 0,
        "schema_version": "1.0",
    }
    out = await invoke(agent, out.state, resume(out))
    assert out.stop == "checkpoint", "15 tokens so far: under the 20 cap"
    out = await invoke(agent, out.state, resume(out))
    out = await invoke(agent, out.state, resume(out))
    assert out.stop == "limit_total_tokens"
    assert model_of(agent).calls == 2
    assert out.result.checkpoint is None and out.state.checkpoint is None
    with pytest.raises(CheckpointStaleError):
        await invoke(agent, out.state, resume(paused))


async def test_null_answer_keeps_the_turn_cycle_index_under_checkpointing() -> None:
    script = [call("record", "r1", label="a"), call("ask", "q", label="x"), "done"]
    agent = make_agent(script, tools=ALL)
    out = await invoke(agent, new_state(), "go")
    for _ in range(3):
        out = await invoke(agent, out.state, resume(out))
    assert out.stop == "interrupt"
    interrupt_id = (out.result.interrupts or [])[0].id
    out = await invoke(agent, out.state, answers((interrupt_id, None)))
    assert out.stop == "interrupt" and out.result.checkpoint is None
    assert [i.to_dict() for i in out.result.interrupts or []] == [
        {"id": interrupt_id, "name": APPROVAL, "reason": "x", "response": None}
    ]
    assert out.state.interrupted and out.state.pending is not None
    assert out.state.pending.interrupts[0].response is None
    out = await invoke(agent, roundtrip(out.state), answers((interrupt_id, "ok")))
    assert out.checkpoint == {"position": "after_tools", "cycle_index": 1, "schema_version": "1.0"}
    assert RAN == ["a", "x"]
    check_history(out.state)


async def test_cancel_while_answering_with_the_sequential_executor() -> None:
    batch = [call("ask", "q", label="x"), call("record", "r2", label="b")]
    agent = make_agent([batch, "never"], checkpointing=False, tools=ALL)
    out = await invoke(agent, new_state(), "go")
    reply = answers(((out.result.interrupts or [])[0].id, "yes"))
    signal = CancelSignal()
    signal.cancel()
    cancelled = await invoke(agent, out.state, reply, cancel=signal)
    assert cancelled.stop == "cancelled" and cancelled.result.interrupts is None
    assert cancelled.result.message == cancelled.state.messages[1]
    assert [r["content"] for r in results_of(cancelled.state.messages[-1])] == [
        CANCELLED,
        CANCELLED,
    ]
    assert RAN == []
    assert not cancelled.state.interrupted and cancelled.state.pending is None
    with pytest.raises(NoPendingInterruptError):
        await invoke(agent, cancelled.state, reply)
    check_history(cancelled.state)


class CancelledReplyModel(ModelProvider):
    """Ends its stream with the reply a provider yields when it stopped for a cancel."""

    def __init__(self) -> None:
        self.calls = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        self.calls += 1
        yield ModelReply({"role": "assistant", "content": [{"text": "parti"}]}, "cancelled")


async def test_a_cancelled_provider_reply_is_a_cancelled_stream() -> None:
    agent = AgentDefinition(name="t", model=CancelledReplyModel(), tools=ALL)
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "cancelled"
    assert out.state.messages[-1] == {
        "role": "assistant",
        "content": [{"text": "Cancelled by user"}],
    }
    assert all("parti" not in str(m) for m in out.state.messages)


class UnidentifiedCallModel(ModelProvider):
    """A custom provider whose reply asks for a tool without giving the call an id."""

    def __init__(self, tool_use: dict[str, Any]) -> None:
        self.tool_use = tool_use

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        yield ModelReply({"role": "assistant", "content": [{"toolUse": self.tool_use}]}, "tool_use")


@pytest.mark.parametrize(
    "tool_use",
    [{"name": "record", "input": {"label": "a"}}, {"toolUseId": 7, "name": "record", "input": {}}],
    ids=["missing", "not-a-string"],
)
async def test_a_reply_with_a_tool_call_without_an_id_is_a_model_error(
    tool_use: dict[str, Any],
) -> None:
    agent = AgentDefinition(name="t", model=UnidentifiedCallModel(tool_use), tools=ALL)
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "error"
    assert out.result.error is not None
    assert out.result.error.code == "model_error"
    assert "toolUse without a toolUseId" in out.result.error.message
    assert out.state.messages == [{"role": "user", "content": [{"text": "go"}]}]


async def test_resolve_cancel_leaves_the_history_a_running_cancel_would() -> None:
    agent = make_agent([call("record", "r1", label="a"), "never"], tools=ALL)
    paused = await invoke(agent, new_state(), "go")
    result, resolved = resolve_cancel(paused.state)
    signal = CancelSignal()
    signal.cancel()
    running = await invoke(agent, paused.state, resume(paused), cancel=signal)
    assert resolved.messages == running.state.messages
    assert result.message == running.result.message == paused.state.messages[1]
    after_tools = await invoke(agent, paused.state, resume(paused))
    result, resolved = resolve_cancel(after_tools.state)
    running = await invoke(agent, after_tools.state, resume(after_tools), cancel=signal)
    assert resolved.messages == running.state.messages
    assert result.message == running.result.message
    assert result.message == {"role": "assistant", "content": [{"text": "Cancelled by user"}]}


async def test_turn_limits_survive_a_crash_recovered_invocation() -> None:
    script = [call("record", "r1", label="a"), call("record", "r2", label="b"), "done"]
    limits = Limits(max_cycles=2)
    agent = make_agent(script, checkpointing=False, tools=ALL, limits=limits)
    full = await invoke(agent, new_state(), "go", command_id="c")
    assert full.stop == "limit_turns"
    boundary = [b for b in full.of(Boundary) if b.position == "after_model"][-1]
    assert boundary.cycle_index == 1
    assert boundary.state.turn_metrics["cycles"] == 2
    recovered_agent = make_agent(script, checkpointing=False, tools=ALL, limits=limits)
    out = await invoke(recovered_agent, roundtrip(boundary.state), "go", command_id="c")
    assert out.stop == "limit_turns"
    assert model_of(recovered_agent).calls == 0, "the crashed run's model calls still count"
    assert out.state.messages == full.state.messages
    assert out.state.turn_metrics["cycles"] == 2


@tool
async def patient(context: ToolContext) -> str:
    """Work until an immediate cancel; a deferred one lets it finish."""
    try:
        await asyncio.wait_for(context.cancel.wait(), 0.2)
    except TimeoutError:
        return "finished"
    return "stopped early"


@pytest.mark.parametrize(("deferred", "text"), [(True, "finished"), (False, "stopped early")])
async def test_a_cooperative_tool_is_woken_by_an_immediate_cancel_only(
    deferred: bool, text: str
) -> None:
    signal = CancelSignal()

    @tool(inline=True)
    def trigger() -> str:
        """Request the cancel, then let the next tool run."""
        signal.cancel(after_current_tools=deferred)
        return "requested"

    agent = make_agent(
        [[call("trigger", "t"), call("patient", "p")], "never"],
        checkpointing=False,
        tools=[trigger, patient],
        executor="concurrent",
    )
    out = await invoke(agent, new_state(), "go", cancel=signal)
    assert out.stop == "cancelled"
    assert results_of(out.state.messages[2])[1]["content"] == [{"text": text}]


async def test_an_upgrade_to_immediate_wakes_waiters() -> None:
    signal = CancelSignal()
    waiter = asyncio.ensure_future(signal.wait())
    signal.cancel(after_current_tools=True)
    await asyncio.sleep(0)
    assert not waiter.done() and signal.deferred
    signal.cancel()
    await asyncio.wait_for(waiter, 1.0)
    assert signal.immediate and not signal.deferred
