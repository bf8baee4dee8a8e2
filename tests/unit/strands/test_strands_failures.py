"""Strands tools that fail in ways their own handling does not tell, run by Cairn's engine.

Each ends as the error result the reference gives (texts read from strands-agents 1.62's
decorator and tool executor), with the exception the reference's after-tool-call hooks see.
"""

from __future__ import annotations

from typing import Any

import strands_module_tool
from strands import tool as strands_tool

from service.agent.definition import AgentDefinition
from service.agent.events import Stopped
from service.agent.hooks import AfterToolCallEvent, HookProvider, HookRegistry
from service.agent.loop import Invocation, run_invocation
from service.agent.state import SessionState
from service.providers.scripted import ReplySpec, ScriptedModel, ToolCall
from service.strands_adapter.tools import StrandsTool, strands_tools


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for this one")


@strands_tool
def unprintable() -> str:
    """Raise an exception that cannot be turned into text."""
    raise UnprintableError


class Watch(HookProvider):
    def __init__(self) -> None:
        self.exceptions: list[BaseException | None] = []

    def register_hooks(self, registry: HookRegistry) -> None:
        registry.add_callback(AfterToolCallEvent, lambda e: self.exceptions.append(e.exception))


async def results(script: list[ReplySpec], tools: list[Any], watch: Watch) -> list[Any]:
    definition = AgentDefinition(
        name="shop", model=ScriptedModel(script), tools=tools, hooks=[watch]
    )
    state = SessionState(session_id="s-failures")
    events = [e async for e in run_invocation(definition, state, Invocation("c", "go"))]
    last = events[-1]
    assert isinstance(last, Stopped) and last.result.stop_reason == "end_turn"
    return [b["toolResult"] for m in last.state.messages for b in m["content"] if "toolResult" in b]


async def test_what_an_exceptions_str_raised_is_told_as_the_reference_tells_it() -> None:
    watch = Watch()
    script: list[ReplySpec] = [ToolCall("unprintable", {}, "t1"), "ok"]
    got = await results(script, [StrandsTool(unprintable)], watch)
    assert got == [
        {"toolUseId": "t1", "status": "error", "content": [{"text": "Error: no text for this one"}]}
    ]
    assert len(watch.exceptions) == 1 and type(watch.exceptions[0]) is RuntimeError


async def test_a_module_tools_failure_is_told_as_the_reference_tells_it() -> None:
    watch = Watch()
    tools = strands_tools(strands_module_tool)
    assert tools is not None
    # No "word" in the input: the module tool's KeyError escapes it, as a raw exception.
    got = await results([ToolCall("strands_module_tool", {}, "t1"), "ok"], tools, watch)
    assert got == [{"toolUseId": "t1", "status": "error", "content": [{"text": "Error: 'word'"}]}]
    assert len(watch.exceptions) == 1 and type(watch.exceptions[0]) is KeyError
