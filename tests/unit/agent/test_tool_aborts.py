"""A tool raising KeyboardInterrupt or SystemExit ends its invocation, never the process.

The command is answered (``error``, code ``tool_aborted``) and the history is the one the
reference leaves when its invocation raises: the prompt and the model's tool calls kept, the
calls unanswered until the next prompt answers them ``Tool was interrupted.``.
"""

from __future__ import annotations

import pytest
from engine_helpers import (
    call,
    check_history,
    echo,
    invoke,
    make_agent,
    results_of,
    resume,
    roundtrip,
    texts,
)

from service.agent.errors import CheckpointStaleError
from service.agent.events import ToolFinished
from service.agent.hooks import AfterToolCallEvent, AfterToolsEvent, HookProvider, HookRegistry
from service.agent.state import SessionState
from service.agent.tools import tool

ABORTS: dict[str, BaseException] = {
    "keyboard": KeyboardInterrupt("stop"),
    "exit": SystemExit(2),
}


@tool
def in_thread(kind: str) -> str:
    """Raise the abort from a worker thread."""
    raise ABORTS[kind]


@tool
async def in_coroutine(kind: str) -> str:
    """Raise the abort on the event loop."""
    raise ABORTS[kind]


@tool(timeout_s=5)
async def in_own_task(kind: str) -> str:
    """Raise the abort in the task a timeout runs the tool in."""
    raise ABORTS[kind]


TOOLS = [echo, in_thread, in_coroutine, in_own_task]


class Watch(HookProvider):
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.batches = 0

    def register_hooks(self, registry: HookRegistry) -> None:
        registry.add_callback(AfterToolCallEvent, lambda e: self.calls.append(e.tool_use["name"]))
        registry.add_callback(AfterToolsEvent, lambda e: setattr(self, "batches", 1))


@pytest.mark.parametrize("executor", ["sequential", "concurrent"])
@pytest.mark.parametrize("name", ["in_thread", "in_coroutine", "in_own_task"])
@pytest.mark.parametrize("kind", sorted(ABORTS))
async def test_an_aborting_tool_ends_the_invocation_as_the_reference_leaves_it(
    executor: str, name: str, kind: str
) -> None:
    watch = Watch()
    script = [[call("echo", "e1", text="first"), call(name, "t1", kind=kind)], "never"]
    agent = make_agent(script, checkpointing=False, tools=TOOLS, executor=executor, hooks=[watch])
    out = await invoke(agent, SessionState(session_id="s-aborts"), "go")
    assert out.stop == "error"
    assert out.result.error is not None and out.result.error.code == "tool_aborted"
    assert type(ABORTS[kind]).__name__ in out.result.error.message
    # The prompt and the tool calls, unanswered: no result of the batch is kept.
    assert [m["role"] for m in out.state.messages] == ["user", "assistant"]
    assert out.state.pending is None and out.state.checkpoint is None
    assert "in_" not in "".join(watch.calls) and watch.batches == 0
    finished = {e.tool_use_id: e.status for e in out.of(ToolFinished)}
    assert finished["t1"] == "error"
    state = roundtrip(out.state)
    nxt = await invoke(make_agent(["hello again"], tools=TOOLS), state, "again")
    assert nxt.stop == "end_turn"
    interrupted = [{"text": "Tool was interrupted."}]
    assert [r["content"] for r in results_of(nxt.state.messages[2])] == [interrupted] * 2
    assert texts(nxt.state.messages[2]) == ["again"]
    check_history(nxt.state)


async def test_an_aborted_resume_leaves_no_pause_to_resume_again() -> None:
    agent = make_agent([call("in_thread", "t1", kind="exit"), "never"], tools=TOOLS)
    paused = await invoke(agent, SessionState(session_id="s-aborts"), "go")
    assert paused.stop == "checkpoint"
    out = await invoke(agent, paused.state, resume(paused))
    assert out.stop == "error" and out.result.error is not None
    assert out.result.error.code == "tool_aborted"
    assert [m["role"] for m in out.state.messages] == ["user", "assistant"]
    with pytest.raises(CheckpointStaleError):
        await invoke(agent, out.state, resume(paused))
