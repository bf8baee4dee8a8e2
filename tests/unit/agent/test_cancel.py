"""Cancel (SEMANTICS §5): every observation point, deferred mode, message, precedence."""

from __future__ import annotations

import asyncio
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
    texts,
)

from service.agent.cancel import CancelSignal
from service.agent.errors import CheckpointStaleError
from service.agent.events import ModelTextDelta, ToolFinished
from service.agent.loop import Invocation, resolve_cancel, run_invocation
from service.agent.state import SessionState
from service.agent.tools import ToolContext, tool
from service.providers.scripted import ScriptedReply

CANCELLED = [{"text": "Tool execution cancelled"}]
RAN: list[str] = []


def new_state() -> SessionState:
    return SessionState(session_id="s-cancel")


@pytest.fixture(autouse=True)
def _clear() -> None:
    RAN.clear()


SIGNAL: dict[str, CancelSignal] = {}


@tool(inline=True)
def cancels(label: str, deferred: bool = False) -> str:
    """Cancel the running invocation from inside a tool, then finish normally."""
    RAN.append(label)
    SIGNAL["current"].cancel("stop now", after_current_tools=deferred)
    return f"done {label}"


@tool(inline=True)
def record(label: str) -> str:
    """Record that it ran."""
    RAN.append(label)
    return label


@tool
async def cooperative(context: ToolContext) -> str:
    """Wait for the cancel and return a real result."""
    RAN.append("cooperative")
    await context.cancel.wait()
    return "saw cancel, saved partial work"


@tool(inline=True)
def ask_and_cancel(context: ToolContext) -> str:
    """Cancel and interrupt in the same call."""
    SIGNAL["current"].cancel()
    return str(context.interrupt("question"))


ALL = [*TOOLS, cancels, record, cooperative, ask_and_cancel]


def signal() -> CancelSignal:
    SIGNAL["current"] = CancelSignal()
    return SIGNAL["current"]


async def test_cancel_before_invocation_opens_no_model_request() -> None:
    agent = make_agent(["never"], checkpointing=False)
    cancel = signal()
    cancel.cancel()
    out = await invoke(agent, new_state(), "hi", cancel=cancel)
    assert out.stop == "cancelled"
    assert model_of(agent).calls == 0
    assert out.state.messages[-1] == {
        "role": "assistant",
        "content": [{"text": "Cancelled by user"}],
    }
    assert out.result.message == out.state.messages[-1]
    check_history(out.state)


async def test_cancel_with_its_own_message() -> None:
    cancel = signal()
    cancel.cancel("user pressed stop")
    out = await invoke(make_agent(["x"]), new_state(), "hi", cancel=cancel)
    assert texts(out.state.messages[-1]) == ["user pressed stop"]


async def test_cancel_mid_stream_discards_partial_reply() -> None:
    reply = ScriptedReply(text="abc", chunks=["a", "b", "c"], chunk_latency=0.001)
    agent = make_agent([reply], checkpointing=False)
    cancel = signal()
    invocation = Invocation("c1", "hi")
    seen: list[Any] = []
    async for event in run_invocation(agent, new_state(), invocation, cancel=cancel):
        seen.append(event)
        if isinstance(event, ModelTextDelta):
            cancel.cancel()
    stopped = seen[-1]
    assert stopped.result.stop_reason == "cancelled"
    assert [e.text for e in seen if isinstance(e, ModelTextDelta)] == ["a"]
    assert stopped.state.messages[-1] == {
        "role": "assistant",
        "content": [{"text": "Cancelled by user"}],
    }
    assert all("abc" not in str(m) for m in stopped.state.messages)


async def test_cancel_during_model_latency_is_prompt() -> None:
    agent = make_agent([ScriptedReply(text="late", latency=30.0)], checkpointing=False)
    cancel = signal()

    async def later() -> None:
        await asyncio.sleep(0.05)
        cancel.cancel()

    task = asyncio.create_task(later())
    out = await asyncio.wait_for(invoke(agent, new_state(), "hi", cancel=cancel), 5)
    await task
    assert out.stop == "cancelled"


async def test_cancel_at_after_model_boundary_beats_checkpoint() -> None:
    script = [[call("record", "a", label="a"), call("record", "b", label="b")], "done"]
    agent = make_agent(script, tools=ALL)
    cancel = signal()
    original = agent.model.stream

    async def stream_then_cancel(request: Any) -> Any:
        async for chunk in original(request):
            yield chunk
        cancel.cancel()

    agent.model.stream = stream_then_cancel  # type: ignore[method-assign]
    out = await invoke(agent, new_state(), "go", cancel=cancel)
    assert out.stop == "cancelled" and out.result.checkpoint is None
    assert RAN == []
    assert [r["content"] for r in results_of(out.state.messages[2])] == [CANCELLED, CANCELLED]
    assert out.state.checkpoint is None and out.state.pending is None
    check_history(out.state)


async def test_cancel_before_the_batch_on_resume() -> None:
    agent = make_agent([call("record", "a", label="a"), "done"], tools=ALL)
    paused = await invoke(agent, new_state(), "go")
    cancel = signal()
    cancel.cancel()
    out = await invoke(agent, paused.state, resume(paused), cancel=cancel)
    assert out.stop == "cancelled" and RAN == []
    assert results_of(out.state.messages[2])[0]["content"] == CANCELLED
    check_history(out.state)


async def test_cancel_between_tools_sequential() -> None:
    script = [[call("cancels", "a", label="a"), call("record", "b", label="b")], "done"]
    agent = make_agent(script, checkpointing=False, tools=ALL)
    out = await invoke(agent, new_state(), "go", cancel=signal())
    assert out.stop == "cancelled"
    assert RAN == ["a"]
    results = results_of(out.state.messages[2])
    assert results[0]["content"] == [{"text": "done a"}], "the running tool's real result is kept"
    assert results[1]["content"] == CANCELLED
    assert texts(out.state.messages[-1]) == ["stop now"]
    check_history(out.state)


async def test_cancel_inside_a_tool_keeps_its_result() -> None:
    agent = make_agent([call("cooperative", "c"), "never"], checkpointing=False, tools=ALL)
    cancel = signal()

    async def later() -> None:
        while "cooperative" not in RAN:
            await asyncio.sleep(0.001)
        cancel.cancel()

    task = asyncio.create_task(later())
    out = await asyncio.wait_for(invoke(agent, new_state(), "go", cancel=cancel), 5)
    await task
    assert out.stop == "cancelled"
    assert results_of(out.state.messages[2])[0] == {
        "toolUseId": "c",
        "status": "success",
        "content": [{"text": "saw cancel, saved partial work"}],
    }
    assert model_of(agent).calls == 1


async def test_cancel_after_the_batch_beats_after_tools_checkpoint() -> None:
    agent = make_agent([call("cancels", "a", label="a"), "never"], tools=ALL)
    paused = await invoke(agent, new_state(), "go")
    out = await invoke(agent, paused.state, resume(paused), cancel=signal())
    assert out.stop == "cancelled" and out.result.checkpoint is None
    assert results_of(out.state.messages[2])[0]["status"] == "success"
    assert out.state.checkpoint is None


async def test_deferred_cancel_lets_the_batch_finish() -> None:
    script = [
        [call("cancels", "a", label="a", deferred=True), call("record", "b", label="b")],
        "never",
    ]
    agent = make_agent(script, checkpointing=False, tools=ALL)
    out = await invoke(agent, new_state(), "go", cancel=signal())
    assert out.stop == "cancelled"
    assert RAN == ["a", "b"]
    assert [r["status"] for r in results_of(out.state.messages[2])] == ["success", "success"]
    assert model_of(agent).calls == 1


async def test_immediate_cancel_upgrades_a_deferred_one() -> None:
    cancel = CancelSignal()
    cancel.cancel("first", after_current_tools=True)
    assert cancel.deferred and not cancel.immediate
    cancel.cancel("second")
    assert cancel.immediate and cancel.message == "second", "the last message wins"
    cancel.cancel(after_current_tools=True)
    assert cancel.immediate and cancel.message == "second", "never downgraded nor cleared"


async def test_cancel_beats_interrupt_in_the_same_batch() -> None:
    script = [[call("ask_and_cancel", "q"), call("record", "b", label="b")], "never"]
    for executor in ("sequential", "concurrent"):
        agent = make_agent(script, checkpointing=False, tools=ALL, executor=executor)
        out = await invoke(agent, new_state(), "go", cancel=signal())
        assert out.stop == "cancelled", executor
        assert out.result.interrupts is None
        assert not out.state.interrupted and out.state.pending is None
        assert results_of(out.state.messages[2])[0]["content"] == CANCELLED
        check_history(out.state)


async def test_cancel_while_answering_an_interrupt_clears_it() -> None:
    script = [[call("record", "a", label="a"), call("approve", "b", action="x")], "never"]
    agent = make_agent(script, checkpointing=False, tools=ALL, executor="concurrent")
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "interrupt"
    cancel = signal()
    cancel.cancel()
    out = await invoke(agent, out.state, answers((out.result.interrupts[0].id, "y")), cancel=cancel)
    assert out.stop == "cancelled"
    assert not out.state.interrupted and out.state.pending is None
    result_messages = [m for m in out.state.messages if results_of(m)]
    assert len(result_messages) == 1, "exactly one results message for the batch"
    assert [r["content"] for r in results_of(result_messages[0])] == [[{"text": "a"}], CANCELLED]
    check_history(out.state)
    follow = await invoke(make_agent(["fresh"]), out.state, "new prompt")
    assert follow.stop == "end_turn"
    check_history(follow.state)


async def test_resolve_cancel_of_a_checkpoint_pause() -> None:
    agent = make_agent([call("record", "a", label="a"), "never"], tools=ALL)
    paused = await invoke(agent, new_state(), "go")
    before = roundtrip(paused.state)
    result, state = resolve_cancel(paused.state, "operator stop")
    assert paused.state == before, "resolve_cancel does not mutate its input"
    assert result.stop_reason == "cancelled"
    assert results_of(state.messages[2])[0]["content"] == CANCELLED
    assert texts(state.messages[-1]) == ["operator stop"]
    assert result.message == state.messages[-1]
    assert state.checkpoint is None and state.pending is None
    check_history(state)
    with pytest.raises(CheckpointStaleError):
        await invoke(agent, state, resume(paused))


async def test_resolve_cancel_of_an_interrupt_pause_keeps_completed_results() -> None:
    script = [[call("record", "a", label="a"), call("approve", "b", action="x")], "never"]
    agent = make_agent(script, checkpointing=False, tools=ALL, executor="concurrent")
    out = await invoke(agent, new_state(), "go")
    result, state = resolve_cancel(out.state, None)
    assert [r["content"] for r in results_of(state.messages[2])] == [[{"text": "a"}], CANCELLED]
    # As a cancel while answering would: no text without a message, the toolUse message returned.
    assert state.messages[-1] == state.messages[2]
    assert result.message == state.messages[1]
    assert not state.interrupted
    assert result.to_dict()["stop_reason"] == "cancelled"


async def test_resolve_cancel_of_an_after_tools_pause_and_of_an_idle_session() -> None:
    agent = make_agent([call("record", "a", label="a"), "never"], tools=ALL)
    paused = await invoke(agent, new_state(), "go")
    paused = await invoke(agent, paused.state, resume(paused))
    _, state = resolve_cancel(paused.state)
    assert state.checkpoint is None and state.messages[-1]["role"] == "assistant"
    check_history(state)
    result, same = resolve_cancel(state)
    assert result.message is None and same.messages == state.messages


async def test_tool_finished_reports_cancelled_tools_only_when_they_ran() -> None:
    script = [[call("cancels", "a", label="a"), call("record", "b", label="b")], "done"]
    agent = make_agent(script, checkpointing=False, tools=ALL)
    out = await invoke(agent, new_state(), "go", cancel=signal())
    assert [(e.tool_use_id, e.status) for e in out.of(ToolFinished)] == [("a", "success")]


@pytest.mark.parametrize("checkpointing", [False, True])
async def test_deferred_cancel_during_the_model_stream_starts_no_batch(checkpointing: bool) -> None:
    script = [[call("record", "a", label="a"), call("record", "b", label="b")], "never"]
    agent = make_agent(script, checkpointing=checkpointing, tools=ALL)
    cancel = signal()
    original = agent.model.stream

    async def stream_with_cancel(request: Any) -> Any:
        async for chunk in original(request):
            # Arrives while the reply streams: a deferred cancel does not cut the stream.
            cancel.cancel(after_current_tools=True)
            yield chunk

    agent.model.stream = stream_with_cancel  # type: ignore[method-assign]
    out = await invoke(agent, new_state(), "go", cancel=cancel)
    assert out.stop == "cancelled" and out.result.checkpoint is None
    assert RAN == [], "no new batch starts"
    reply = out.state.messages[1]
    assert [b["toolUse"]["toolUseId"] for b in reply["content"]] == ["a", "b"]
    assert out.result.message == reply, "the model's reply is kept"
    assert [r["content"] for r in results_of(out.state.messages[2])] == [CANCELLED, CANCELLED]
    assert len(out.state.messages) == 3
    assert out.state.checkpoint is None and out.state.pending is None
    assert model_of(agent).calls == 1
    check_history(out.state)


async def test_resolve_cancel_of_an_interrupt_pause_keeps_the_name_errors_first() -> None:
    script = [
        [call("record", "a", label="a"), call("approve", "b", action="x"), call("no such", "c")],
        "never",
    ]
    agent = make_agent(script, checkpointing=False, tools=ALL)
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "interrupt"
    _, state = resolve_cancel(out.state, None)
    assert [(r["toolUseId"], r["content"]) for r in results_of(state.messages[2])] == [
        ("c", [{"text": "Error: tool_name=<no such> | invalid tool name pattern"}]),
        ("a", [{"text": "a"}]),
        ("b", CANCELLED),
    ]


async def test_an_empty_cancel_message_is_kept_and_sent_as_the_references_blank_text() -> None:
    # strands-agents 1.62.0 appends the cancel message as given, "" included, and its
    # _normalize_messages sends blank assistant text as "[blank text]" (left out beside a
    # toolUse): a provider refuses an empty text block.
    agent = make_agent([call("record", "a", label="a"), "after"], tools=ALL)
    paused = await invoke(agent, new_state(), "go")
    _, state = resolve_cancel(paused.state, "")
    assert state.messages[-1] == {"role": "assistant", "content": [{"text": ""}]}
    follow = await invoke(agent, state, "again")
    sent = model_of(agent).requests[-1].messages
    assert sent[3] == {"role": "assistant", "content": [{"text": "[blank text]"}]}
    assert follow.state.messages[3] == state.messages[-1]
