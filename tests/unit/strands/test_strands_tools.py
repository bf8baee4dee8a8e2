"""Strands tools named in an agent file run by Cairn's engine, against the real strands-agents.

Their spec is the one Strands derives; the Strands tool context carries the tool use, the
invocation state and a stand-in agent; an interrupt raised through it pauses the invocation with
the id Strands gives it, and the resume that answers it completes the tool with the answer.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import strands_sample_tools as sample
from strands import tool as strands_tool
from strands.types.tools import ToolContext as StrandsToolContext

from service.agent.definition import AgentDefinition
from service.agent.events import Stopped
from service.agent.loop import Invocation, run_invocation
from service.agent.state import SessionState
from service.agent.tools import Tool
from service.agent.tools import tool as cairn_tool
from service.agent_config import AgentConfigError, load_agents
from service.providers.scripted import ReplySpec, ScriptedModel, ToolCall
from service.sessions.codec import decode_state, encode_state
from service.strands_adapter.tools import AgentStateView, StrandsTool

FILE = """
[[agents]]
name = "shop"
model = "gpt-4o-mini"
tools = [
    "strands_sample_tools:lookup_order",
    "strands_module_tool",
    {{ path = "strands_sample_tools:flaky", retries = 1, backoff = 0 }},
    {extra}
]
[agents.provider]
type = "openai_compat"
base_url = "http://127.0.0.1:9/v1"
"""


def load(tmp_path: Path, extra: str = "") -> dict[str, AgentDefinition]:
    path = tmp_path / "agents.toml"
    path.write_text(FILE.format(extra=extra), encoding="utf-8")
    return load_agents(path, {})


def tools_of(tmp_path: Path, extra: str = "") -> dict[str, Tool]:
    return dict(load(tmp_path, extra)["shop"].tool_map)


def test_an_agent_file_names_strands_tools_and_gets_their_spec(tmp_path: Path) -> None:
    tools = tools_of(tmp_path)
    assert list(tools) == ["lookup_order", "strands_module_tool", "flaky"]
    assert all(isinstance(t, StrandsTool) for t in tools.values())
    spec = tools["lookup_order"].spec
    strands_spec = sample.lookup_order.tool_spec
    assert spec.name == strands_spec["name"] == "lookup_order"
    assert spec.description == strands_spec["description"]
    assert spec.input_schema == strands_spec["inputSchema"]["json"]
    assert spec.input_schema["properties"]["order_id"]["description"] == "The order's number."
    assert tools["strands_module_tool"].spec.description == "Shout a word."
    assert tools["flaky"].policy.retries == 1


def test_a_module_path_names_every_strands_tool_in_it(tmp_path: Path) -> None:
    path = tmp_path / "agents.toml"
    text = FILE.format(extra="").replace('"strands_sample_tools:lookup_order",', "")
    text = text.replace('{ path = "strands_sample_tools:flaky"', '{ path = "strands_sample_tools"')
    path.write_text(text, encoding="utf-8")
    tools = load_agents(path, {})["shop"].tool_map
    assert set(tools) == {
        "strands_module_tool",
        "lookup_order",
        "refund",
        "remember",
        "flaky",
        "peek",
    }
    assert tools["refund"].policy.retries == 1, "the table's options apply to every tool"


def test_a_strands_tool_spec_cairn_cannot_use_is_refused_naming_the_path(
    tmp_path: Path,
) -> None:
    with pytest.raises(AgentConfigError) as caught:
        load(tmp_path, '"strands_sample_tools:MIXED"')
    assert "tool 'strands_sample_tools:MIXED' is a sequence holding something other" in str(
        caught.value
    )


# The engine.


def agent(script: list[ReplySpec], *tools: Any) -> AgentDefinition:
    return AgentDefinition(
        name="shop",
        model=ScriptedModel(script, record=True),
        tools=[StrandsTool(t) for t in tools],
    )


async def run(
    definition: AgentDefinition, state: SessionState, input: Any, **kw: Any
) -> tuple[Any, SessionState]:
    events = [e async for e in run_invocation(definition, state, Invocation("c", input, **kw))]
    last = events[-1]
    assert isinstance(last, Stopped)
    return last.result, decode_state(encode_state(last.state))


def results(state: SessionState) -> list[dict[str, Any]]:
    return [b["toolResult"] for m in state.messages for b in m["content"] if "toolResult" in b]


async def test_a_strands_interrupt_pauses_and_the_answer_completes_the_tool() -> None:
    sample.CALLS.clear()
    definition = agent(
        [ToolCall("refund", {"order_id": "A1", "amount": 10}, "t1"), "Refunded."], sample.refund
    )
    result, state = await run(definition, SessionState(session_id="s1"), "refund A1")
    assert result.stop_reason == "interrupt"
    [raised] = result.interrupts
    # The id Strands itself gives this interrupt, so a Strands client's bookkeeping holds.
    strands_id = StrandsToolContext(
        tool_use={"toolUseId": "t1", "name": "refund", "input": {}},
        agent=None,
        invocation_state={},
    )._interrupt_id("approval")
    assert (
        raised.id == strands_id == f"v1:tool_call:t1:{uuid.uuid5(uuid.NAMESPACE_OID, 'approval')}"
    )
    assert raised.name == "approval"
    assert raised.reason == {"order_id": "A1", "amount": 10.0}
    assert results(state) == []

    answer = [{"interruptResponse": {"interruptId": raised.id, "response": "approve"}}]
    result, state = await run(definition, state, answer)
    assert result.stop_reason == "end_turn"
    assert results(state) == [
        {"toolUseId": "t1", "status": "success", "content": [{"text": "refunded 10.0 on A1"}]}
    ]
    assert sample.CALLS == ["refund A1", "refund A1"], "the tool runs again from its start"


async def test_another_answer_reaches_the_tool_as_it_is() -> None:
    definition = agent(
        [ToolCall("refund", {"order_id": "B2", "amount": 1}, "t1"), "Declined."], sample.refund
    )
    result, state = await run(definition, SessionState(session_id="s2"), "refund B2")
    answer = [{"interruptResponse": {"interruptId": result.interrupts[0].id, "response": "no"}}]
    result, state = await run(definition, state, answer)
    assert results(state)[0]["content"] == [{"text": "refund of B2 declined"}]


async def test_the_strands_context_carries_tool_use_invocation_state_and_agent_state() -> None:
    definition = agent([ToolCall("remember", {"note": "blue"}, "t7"), "ok"], sample.remember)
    result, state = await run(
        definition, SessionState(session_id="s3"), "go", invocation_state={"user": "ana"}
    )
    assert result.stop_reason == "end_turn"
    assert results(state)[0]["content"] == [
        {"text": "t7 remember user=ana agent=shop cancelled=False"}
    ]
    assert state.agent_state == {"note": "blue"}


@strands_tool(context=True)
def tally(step: str, tool_context: StrandsToolContext) -> str:
    """Add a step to the invocation state and report the steps seen so far.

    Args:
        step: The step's name.
    """
    seen = tool_context.invocation_state.setdefault("steps", [])
    seen.append(step)
    return ",".join(seen)


async def test_the_tools_of_an_invocation_share_its_invocation_state() -> None:
    calls = [ToolCall("tally", {"step": "a"}, "t1"), ToolCall("tally", {"step": "b"}, "t2")]
    definition = agent([calls, ToolCall("tally", {"step": "c"}, "t3"), "ok"], tally)
    given: dict[str, Any] = {"user": "ana"}
    _, state = await run(definition, SessionState(session_id="s5"), "go", invocation_state=given)
    assert [r["content"] for r in results(state)] == [
        [{"text": "a"}],
        [{"text": "a,b"}],
        [{"text": "a,b,c"}],
    ]
    assert "agent" not in given, "the stand-in is there only while a tool runs"


async def test_a_raising_strands_tool_is_retried_and_ends_with_strands_error_text(
    tmp_path: Path,
) -> None:
    sample.CALLS.clear()
    flaky = tools_of(tmp_path)["flaky"]
    definition = AgentDefinition(
        name="shop",
        model=ScriptedModel([ToolCall("flaky", {"order_id": "C3"}, "t1"), "sorry"]),
        tools=[flaky],
    )
    _, state = await run(definition, SessionState(session_id="s4"), "go")
    assert sample.CALLS == ["flaky C3", "flaky C3"], "retries = 1 from the agent file"
    assert results(state) == [
        {"toolUseId": "t1", "status": "error", "content": [{"text": "Error: order C3 is locked"}]}
    ]


async def test_bad_input_gets_strands_validation_error_and_the_stand_in_says_what_it_lacks() -> (
    None
):
    definition = agent(
        [ToolCall("lookup_order", {}, "t1"), ToolCall("peek", {}, "t2"), "done"],
        sample.lookup_order,
        sample.peek,
    )
    _, state = await run(definition, SessionState(session_id="s5"), "go")
    first, second = results(state)
    assert first["status"] == "error"
    assert first["content"][0]["text"].startswith("Error: Validation failed for input parameters")
    assert second["status"] == "error"
    assert "stand-in" in second["content"][0]["text"]
    assert "'messages'" in second["content"][0]["text"]


async def test_a_module_tool_runs_with_the_invocation_state(tmp_path: Path) -> None:
    module_tool = tools_of(tmp_path)["strands_module_tool"]
    definition = AgentDefinition(
        name="shop",
        model=ScriptedModel([ToolCall("strands_module_tool", {"word": "hi"}, "t1"), "ok"]),
        tools=[module_tool],
    )
    _, state = await run(definition, SessionState(session_id="s6"), "go")
    assert results(state) == [
        {"toolUseId": "t1", "status": "success", "content": [{"text": "HI! (agent shop)"}]}
    ]


@pytest.mark.parametrize("value", [None, [1], "s"])
async def test_input_that_is_not_an_object_gets_the_same_text_from_strands_and_cairn(
    value: Any,
) -> None:
    def lookup_order(order_id: str) -> dict[str, Any]:
        """Look an order up."""
        return {}

    reply = {
        "role": "assistant",
        "content": [{"toolUse": {"toolUseId": "t1", "name": "lookup_order", "input": value}}],
    }
    sample.CALLS.clear()
    texts = []
    for one in (StrandsTool(sample.lookup_order), cairn_tool(lookup_order)):
        definition = AgentDefinition(name="shop", model=ScriptedModel([reply, "done"]), tools=[one])
        _, state = await run(definition, SessionState(session_id="s6"), "go")
        [result] = results(state)
        assert result["status"] == "error"
        texts.append(result["content"][0]["text"])
    expected = (
        "Error: Validation failed for input parameters: strands.tools.decorator.Lookup_orderTool()"
        f" argument after ** must be a mapping, not {type(value).__name__}"
    )
    assert texts == [expected, expected]
    assert sample.CALLS == [], "neither ran the function"


def test_agent_state_goes_in_and_out_as_copies_and_refuses_what_is_not_json() -> None:
    stored: dict[str, Any] = {"k": [1]}
    view = AgentStateView(stored)
    got = view.get("k")
    got.append("x")
    whole = view.get()
    whole["k"].append("y")
    assert stored == {"k": [1]}
    value = {"a": [1]}
    view.set("v", value)
    value["a"].append(2)
    assert stored["v"] == {"a": [1]}
    with pytest.raises(ValueError, match=r"^Value is not JSON serializable: set\. Only"):
        view.set("bad", {1, 2})
    for key, says in ((5, "Key must be a string"), ("  ", "Key cannot be empty")):
        with pytest.raises(ValueError, match=says):
            view.set(key, 1)  # type: ignore[arg-type]
    assert set(stored) == {"k", "v"}
