"""Strands tools that fail in ways their own handling does not tell, run by Cairn's engine.

Each ends as the error result the reference gives (texts read from strands-agents 1.62's
decorator and tool executor), with the exception the reference's after-tool-call hooks see.
"""

from __future__ import annotations

import asyncio
from typing import Any

import strands_module_tool
from strands import tool as strands_tool
from strands.tools.tools import PythonAgentTool

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


@strands_tool
def stops() -> str:
    """Raise StopIteration from Strands' worker thread."""
    raise StopIteration("no more")


def stops_module(tool_use: dict[str, Any], **invocation_state: Any) -> dict[str, Any]:
    raise StopIteration("no more")


STOPS_SPEC: Any = {
    "name": "stops_module",
    "description": "Raise StopIteration.",
    "inputSchema": {"json": {"type": "object", "properties": {}}},
}


async def test_a_stop_iteration_is_an_ordinary_failure_where_the_reference_hangs() -> None:
    watch = Watch()
    script: list[ReplySpec] = [[ToolCall("stops", {}, "t1"), ToolCall("stops_module", {}, "t2")]]
    tools = [
        StrandsTool(stops),
        StrandsTool(PythonAgentTool("stops_module", STOPS_SPEC, stops_module)),
    ]
    got = await asyncio.wait_for(results([*script, "ok"], tools, watch), 5)
    # The texts the reference gives an ordinary exception of that type, by the kind of tool.
    assert got == [
        {
            "toolUseId": "t1",
            "status": "error",
            "content": [{"text": "Error: StopIteration - no more"}],
        },
        {"toolUseId": "t2", "status": "error", "content": [{"text": "Error: no more"}]},
    ]
    assert [type(e) for e in watch.exceptions] == [StopIteration, StopIteration]
    assert not hasattr(stops._tool_func, "__wrapped__"), "the tool itself is left as it is"


def returns(value: Any) -> PythonAgentTool:
    def tool(tool_use: dict[str, Any], **invocation_state: Any) -> Any:
        return value

    spec: Any = {**STOPS_SPEC, "name": "returns", "description": "Return a value as it is."}
    return PythonAgentTool("returns", spec, tool)


async def test_a_module_tool_returning_no_result_dict_is_told_as_the_reference_tells_it() -> None:
    """The reference reads a module tool's return with ``.get``: a value without one fails
    there, ``Error: '<type>' object has no attribute 'get'`` (read from strands-agents 1.62 and
    seen from it). Its ``None`` becomes a ``toolResult`` of null there, the same failure here."""
    for value, kind in [("plain string", "str"), (7, "int"), ([1, 2], "list"), (None, "NoneType")]:
        watch = Watch()
        got = await results(
            [ToolCall("returns", {}, "t1"), "ok"], [StrandsTool(returns(value))], watch
        )
        text = f"Error: '{kind}' object has no attribute 'get'"
        assert got == [{"toolUseId": "t1", "status": "error", "content": [{"text": text}]}]
        assert [type(e) for e in watch.exceptions] == [AttributeError]
