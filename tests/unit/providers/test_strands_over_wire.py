"""A Strands agent carried over by ``from_strands`` runs on Cairn's real providers against their
local wire servers: the Strands model settings reach the request, and a Strands tool's interrupt,
answered, sends the model the tool's result with the answer."""

from __future__ import annotations

import json
from typing import Any

import anthropic_wire as aw
import openai_wire as ow
import pytest
from strands import Agent, ToolContext, tool
from strands.models.anthropic import AnthropicModel
from strands.models.openai import OpenAIModel
from wire_server import Reply, WireServer

from service.agent.events import Stopped
from service.agent.loop import Invocation, run_invocation
from service.agent.state import SessionState
from service.sessions.codec import decode_state, encode_state
from service.strands_adapter.agent import from_strands


@tool(context=True)
def ship(target: str, tool_context: ToolContext) -> str:
    """Ship a release once a human approves.

    Args:
        target: Where to ship.
    """
    answer = tool_context.interrupt("approval", reason={"target": target})
    return f"shipped {target}: {answer}"


def strands_agent(kind: str, server: WireServer) -> Agent:
    model: Any
    if kind == "openai_compat":
        model = OpenAIModel(
            client_args={"base_url": f"{server.url}/v1", "api_key": "sk-wire"},
            model_id="gpt-4o-mini",
            params={"temperature": 0.3, "max_completion_tokens": 300},
        )
    else:
        model = AnthropicModel(
            client_args={"base_url": server.url, "api_key": "sk-ant-wire"},
            model_id="claude-test-model",
            max_tokens=300,
            params={"metadata": {"user_id": "u-1"}},
        )
    return Agent(model=model, system_prompt="You ship.", tools=[ship], callback_handler=None)


def tool_reply(kind: str) -> Reply:
    args = json.dumps({"target": "prod"})
    if kind == "openai_compat":
        return Reply(events=ow.tool_events([("call_s", "ship", [args])]))
    events = [
        aw.message_start(),
        *aw.tool_block(0, "call_s", "ship", [args]),
        *aw.finish("tool_use"),
    ]
    return Reply(events=events)


def text_reply(kind: str) -> Reply:
    return Reply(events=(ow if kind == "openai_compat" else aw).text_events("Shipped."))


def sent_results(kind: str, body: dict[str, Any]) -> list[str]:
    if kind == "openai_compat":
        return [m["content"] for m in body["messages"] if m["role"] == "tool"]
    return [
        block["content"][0]["text"]
        for message in body["messages"]
        for block in message["content"]
        if block["type"] == "tool_result"
    ]


async def run(definition: Any, state: SessionState, input: Any) -> tuple[Any, SessionState]:
    events = [e async for e in run_invocation(definition, state, Invocation("c", input))]
    last = events[-1]
    assert isinstance(last, Stopped)
    return last.result, decode_state(encode_state(last.state))


@pytest.mark.parametrize("kind", ["openai_compat", "anthropic"])
async def test_strands_agent_over_the_wire_interrupt_then_answer(
    kind: str, server: WireServer
) -> None:
    server.script(tool_reply(kind), text_reply(kind))
    definition = from_strands(strands_agent(kind, server), name="shipper", env={})

    result, state = await run(definition, SessionState(session_id="s-w"), "Ship to prod")
    assert result.stop_reason == "interrupt"
    [interrupt] = result.interrupts
    assert (interrupt.name, interrupt.reason) == ("approval", {"target": "prod"})
    body = server.requests[0].body
    if kind == "openai_compat":
        assert body["temperature"] == 0.3
        assert body["model"] == "gpt-4o-mini"
        assert body["max_completion_tokens"] == 300
        assert body["messages"][0] == {"role": "system", "content": "You ship."}
        [function] = [t["function"] for t in body["tools"]]
        assert function["description"].startswith("Ship a release")
        assert server.requests[0].headers["authorization"] == "Bearer sk-wire"
    else:
        assert (body["model"], body["max_tokens"]) == ("claude-test-model", 300)
        assert body["system"] in ("You ship.", [{"type": "text", "text": "You ship."}])
        assert body["tools"][0]["description"].startswith("Ship a release")
        headers = server.requests[0].headers
        sent_key = headers.get("x-api-key") or headers["authorization"].removeprefix("Bearer ")
        assert sent_key == "sk-ant-wire"
        assert body["metadata"] == {"user_id": "u-1"}, "other params are sent as they are"

    answer = [{"interruptResponse": {"interruptId": interrupt.id, "response": "yes"}}]
    result, state = await run(definition, state, answer)
    assert result.stop_reason == "end_turn"
    assert result.message == {"role": "assistant", "content": [{"text": "Shipped."}]}
    assert sent_results(kind, server.requests[1].body) == ["shipped prod: yes"]
