"""The per-message maximum of a tool result: ``Invocation.result_max_bytes``.

A result whose JSON encoding is longer reaches the model as an error result with the documented
text, whichever way it was made (the tool, an after-tool-call hook, a skipping before-hook, an
interrupt answer, the check of the tool's name); one exactly at the maximum passes unchanged;
the session stays usable.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest
from engine_helpers import (
    answers,
    call,
    check_history,
    echo,
    invoke,
    make_agent,
    model_of,
    results_of,
    roundtrip,
)

from service.agent.definition import AgentDefinition
from service.agent.hooks import (
    AfterToolCallEvent,
    BeforeToolCallEvent,
    HookProvider,
    HookRegistry,
)
from service.agent.results import (
    RESULT_TOO_LARGE_TEXT,
    error_result,
    result_too_large_text,
    tool_result,
)
from service.agent.state import SessionState
from service.agent.tools import ToolContext, tool

SESSION = "s-result-size"


@tool(inline=True)
def blob(size: int) -> str:
    """Return ``size`` characters of text."""
    return "x" * size


@tool(inline=True)
def ask(context: ToolContext) -> Any:
    """Return what a human answered."""
    return context.interrupt("paste")


TOOLS = [blob, echo, ask]


def new_state() -> SessionState:
    return SessionState(session_id=SESSION)


def encoded_size(tool_use_id: str, text: str) -> int:
    return len(orjson.dumps(tool_result(tool_use_id, text)))


def too_large(tool_use_id: str, size: int, limit: int) -> dict[str, Any]:
    text = f"tool result of {size} bytes exceeds the maximum of {limit} bytes; it was not kept"
    return {"toolUseId": tool_use_id, "status": "error", "content": [{"text": text}]}


def seen_by_model(agent: AgentDefinition) -> list[dict[str, Any]]:
    """The toolResults of the last message the model was sent."""
    return results_of(model_of(agent).requests[-1].messages[-1])


def test_the_text_and_its_format_function() -> None:
    assert result_too_large_text(12, 10) == RESULT_TOO_LARGE_TEXT.format(size=12, limit=10)
    assert result_too_large_text(12, 10) == (
        "tool result of 12 bytes exceeds the maximum of 10 bytes; it was not kept"
    )


@pytest.mark.parametrize("executor", ["sequential", "concurrent"])
async def test_a_result_above_the_maximum_becomes_the_error_result(
    executor: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="service.agent")
    size = encoded_size("a", "x" * 500)
    limit = size - 1
    script = [[call("blob", "a", size=500), call("echo", "b", text="small")], "done", "again"]
    agent = make_agent(
        script, checkpointing=False, tools=TOOLS, executor=executor, mode="sequential"
    )
    out = await invoke(agent, new_state(), "go", result_max_bytes=limit)
    assert out.stop == "end_turn"
    first, second = seen_by_model(agent)
    assert first == too_large("a", size, limit)
    assert second == {"toolUseId": "b", "status": "success", "content": [{"text": "small"}]}
    assert results_of(out.state.messages[2]) == [first, second]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"session_id=<{SESSION}>, tool_use_id=<a>, size=<{size}>, limit=<{limit}> | tool result"
        " too large, replaced by an error result"
    ]
    # The session stays usable: stored, restored and prompted again.
    check_history(out.state)
    out = await invoke(agent, roundtrip(out.state), "more", result_max_bytes=limit)
    assert out.stop == "end_turn"
    assert out.result.message == {"role": "assistant", "content": [{"text": "again"}]}
    check_history(out.state)


@pytest.mark.parametrize("executor", ["sequential", "concurrent"])
async def test_a_result_exactly_at_the_maximum_passes_unchanged(executor: str) -> None:
    size = encoded_size("a", "x" * 500)
    script = [[call("blob", "a", size=500), call("blob", "b", size=499)], "done"]
    agent = make_agent(script, checkpointing=False, tools=TOOLS, executor=executor)
    out = await invoke(agent, new_state(), "go", result_max_bytes=size)
    assert out.stop == "end_turn"
    first, second = seen_by_model(agent)
    assert first == {"toolUseId": "a", "status": "success", "content": [{"text": "x" * 500}]}
    assert second == {"toolUseId": "b", "status": "success", "content": [{"text": "x" * 499}]}


class Inflate(HookProvider):
    """Replace the result of toolUse ``a`` by a large text."""

    def register_hooks(self, registry: HookRegistry) -> None:
        registry.add_callback(AfterToolCallEvent, self.inflate)

    @staticmethod
    def inflate(event: AfterToolCallEvent) -> None:
        if event.tool_use["toolUseId"] == "a":
            event.result = tool_result("a", "y" * 1000)


@pytest.mark.parametrize("executor", ["sequential", "concurrent"])
async def test_a_hook_replacing_a_result_by_a_too_large_one_is_caught(executor: str) -> None:
    limit = encoded_size("a", "y" * 100)
    script = [[call("echo", "a", text="tiny"), call("echo", "b", text="tiny")], "done"]
    agent = make_agent(
        script, checkpointing=False, tools=TOOLS, executor=executor, hooks=[Inflate()]
    )
    out = await invoke(agent, new_state(), "go", result_max_bytes=limit)
    assert out.stop == "end_turn"
    first, second = seen_by_model(agent)
    assert first == too_large("a", encoded_size("a", "y" * 1000), limit)
    assert second == {"toolUseId": "b", "status": "success", "content": [{"text": "tiny"}]}
    check_history(out.state)


@pytest.mark.parametrize("executor", ["sequential", "concurrent"])
async def test_without_a_maximum_nothing_changes(executor: str) -> None:
    script = [[call("blob", "a", size=100_000), call("echo", "b", text="tiny")], "done"]
    agent = make_agent(
        script, checkpointing=False, tools=TOOLS, executor=executor, hooks=[Inflate()]
    )
    out = await invoke(agent, new_state(), "go", result_max_bytes=None)
    assert out.stop == "end_turn"
    first, second = seen_by_model(agent)
    assert first == {"toolUseId": "a", "status": "success", "content": [{"text": "y" * 1000}]}
    assert second == {"toolUseId": "b", "status": "success", "content": [{"text": "tiny"}]}


async def test_a_skipping_before_hooks_long_text_is_caught() -> None:
    class Skip(HookProvider):
        def register_hooks(self, registry: HookRegistry) -> None:
            registry.add_callback(BeforeToolCallEvent, self.skip)

        @staticmethod
        def skip(event: BeforeToolCallEvent) -> None:
            event.cancel_tool = "z" * 1000

    agent = make_agent([call("echo", "a", text="tiny"), "done"], tools=TOOLS, hooks=[Skip()])
    out = await invoke(agent, new_state(), "go", checkpointing=False, result_max_bytes=200)
    assert out.stop == "end_turn"
    (result,) = seen_by_model(agent)
    skipped = {
        "toolResult": {"toolUseId": "a", "status": "error", "content": [{"text": "z" * 1000}]}
    }
    assert result == too_large("a", len(orjson.dumps(skipped)), 200)


async def test_an_interrupt_answer_returned_by_the_tool_is_caught_on_resume() -> None:
    agent = make_agent([call("ask", "a"), "done"], checkpointing=False, tools=TOOLS)
    out = await invoke(agent, new_state(), "go", result_max_bytes=200)
    assert out.stop == "interrupt"
    answer = "w" * 1000
    out = await invoke(
        agent,
        roundtrip(out.state),
        answers((out.result.interrupts[0].id, answer)),
        result_max_bytes=200,
    )
    assert out.stop == "end_turn"
    (result,) = seen_by_model(agent)
    assert result == too_large("a", encoded_size("a", answer), 200)
    check_history(out.state)
    roundtrip(out.state)


async def test_a_too_large_name_error_is_caught_and_keeps_its_place_first() -> None:
    name = "bad name " * 40
    text = f"Error: tool_name=<{name}> | invalid tool name pattern"
    limit = encoded_size("a", "x" * 100)
    script = [[call("echo", "b", text="small"), call(name, "a")], "done"]
    agent = make_agent(script, checkpointing=False, tools=TOOLS)
    out = await invoke(agent, new_state(), "go", result_max_bytes=limit)
    assert out.stop == "end_turn"
    first, second = seen_by_model(agent)
    assert first == too_large("a", len(orjson.dumps(error_result("a", text))), limit)
    assert second == {"toolUseId": "b", "status": "success", "content": [{"text": "small"}]}
    check_history(out.state)
