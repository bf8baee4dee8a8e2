"""Engine scenarios end to end over each real provider and its local wire server.

One tool cycle paused at both checkpoints, an interrupt answered, a cancel mid-stream and a
model error: the session stays valid and resumable after each, whichever provider runs it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic_wire as aw
import openai_wire as ow
import pytest
from pydantic import SecretStr
from wire_server import Reply, WireServer

from service.agent.cancel import CancelSignal
from service.agent.definition import AgentDefinition
from service.agent.events import Stopped
from service.agent.loop import Invocation, run_invocation
from service.agent.provider import ModelProvider
from service.agent.state import SessionState
from service.agent.tools import ToolContext, tool
from service.agent.types import AgentResult
from service.providers.anthropic import AnthropicProvider
from service.providers.bedrock import BedrockProvider
from service.providers.config import (
    AnthropicConfig,
    BedrockConfig,
    OpenAICompatConfig,
    RetryConfig,
)
from service.providers.openai_compat import OpenAICompatProvider
from service.sessions.codec import decode_state, encode_state
from tests.support import bedrock_wire as bw

KINDS = ["openai_compat", "anthropic", "bedrock"]
FAST = RetryConfig(max_retries=2, initial_backoff_s=0.01, max_backoff_s=0.02)

# Fake AWS credentials for the Bedrock runs (the other providers ignore them).
pytestmark = pytest.mark.usefixtures("aws_env")

_opened: list[BedrockProvider] = []


@pytest.fixture(autouse=True)
async def _close_providers() -> AsyncIterator[None]:
    """The AWS client holds an HTTP session that must be closed in the test's own loop."""
    yield
    while _opened:
        await _opened.pop().aclose()


@tool(inline=True)
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool(inline=True)
def deploy(target: str, context: ToolContext) -> str:
    """Deploy after a human approves."""
    answer = context.interrupt("approval", reason={"target": target})
    return f"deployed {target}: {answer}"


def build_provider(kind: str, server: WireServer) -> ModelProvider:
    if kind == "openai_compat":
        return OpenAICompatProvider(
            OpenAICompatConfig(
                model_id="gpt-4o-mini",
                base_url=f"{server.url}/v1",
                api_key=SecretStr("sk-e2e"),
                retry=FAST,
            )
        )
    if kind == "bedrock":
        provider = BedrockProvider(
            BedrockConfig(model_id=bw.MODEL, endpoint_url=server.url, retry=FAST)
        )
        _opened.append(provider)
        return provider
    return AnthropicProvider(
        AnthropicConfig(
            model_id="claude-test-model",
            base_url=server.url,
            api_key=SecretStr("sk-ant-e2e"),
            retry=FAST,
        )
    )


def text_reply(kind: str, *pieces: str, **kw: Any) -> Reply:
    if kind == "openai_compat":
        return Reply(events=ow.text_events(*pieces), **kw)
    if kind == "bedrock":
        return bw.stream(bw.text_events(*pieces), **kw)
    return Reply(events=aw.text_events(*pieces), **kw)


def tool_reply(kind: str, call_id: str, name: str, args: dict[str, Any]) -> Reply:
    raw = json.dumps(args)
    pieces = [raw[: len(raw) // 2], raw[len(raw) // 2 :]]
    if kind == "openai_compat":
        return Reply(events=ow.tool_events([(call_id, name, pieces)]))
    if kind == "bedrock":
        return bw.stream(bw.tool_events(call_id, name, args))
    events = [aw.message_start(), *aw.tool_block(0, call_id, name, pieces), *aw.finish("tool_use")]
    return Reply(events=events)


def bad_request(kind: str) -> Reply:
    if kind == "openai_compat":
        return ow.error(400, "Invalid 'messages'.", "invalid_request_error", None)
    if kind == "bedrock":
        return bw.error(400, "ValidationException", "messages: invalid")
    return aw.error(400, "invalid_request_error", "messages: invalid")


def tool_results_sent(kind: str, body: dict[str, Any]) -> list[tuple[str, str]]:
    """(tool call id, result text) pairs of the last request, in the provider's format."""
    if kind == "openai_compat":
        return [(m["tool_call_id"], m["content"]) for m in body["messages"] if m["role"] == "tool"]
    out = []
    if kind == "bedrock":
        for message in body["messages"]:
            for block in message["content"]:
                if "toolResult" in block:
                    result = block["toolResult"]
                    out.append((result["toolUseId"], result["content"][0]["text"]))
        return out
    for message in body["messages"]:
        for block in message["content"]:
            if block["type"] == "tool_result":
                out.append((block["tool_use_id"], block["content"][0]["text"]))
    return out


def agent(kind: str, server: WireServer, *, checkpointing: bool) -> AgentDefinition:
    return AgentDefinition(
        name="e2e",
        model=build_provider(kind, server),
        system_prompt="You test.",
        tools=[add, deploy],
        checkpointing=checkpointing,
    )


async def run(
    definition: AgentDefinition,
    state: SessionState,
    command: str,
    input: Any,
    cancel: CancelSignal | None = None,
) -> tuple[AgentResult, SessionState]:
    events = [
        e
        async for e in run_invocation(definition, state, Invocation(command, input), cancel=cancel)
    ]
    last = events[-1]
    assert isinstance(last, Stopped)
    # every result travels through the session codec, as it does between instances
    return last.result, decode_state(encode_state(last.state))


def roles(state: SessionState) -> list[str]:
    return [m["role"] for m in state.messages]


@pytest.mark.parametrize("kind", KINDS)
async def test_one_tool_cycle_with_checkpoints(kind: str, server: WireServer) -> None:
    server.script(
        tool_reply(kind, "call_1", "add", {"a": 2, "b": 3}), text_reply(kind, "It is ", "5.")
    )
    definition = agent(kind, server, checkpointing=True)
    state = SessionState(session_id="s-e2e")

    result, state = await run(definition, state, "c1", "What is 2 + 3?")
    assert result.stop_reason == "checkpoint"
    assert result.checkpoint is not None and result.checkpoint.position == "after_model"
    assert result.message is not None
    assert result.message["content"][-1]["toolUse"]["input"] == {"a": 2, "b": 3}
    assert len(server.requests) == 1

    resume = {"checkpointResume": {"checkpoint": result.checkpoint.to_dict()}}
    result, state = await run(definition, state, "c2", resume)
    assert result.stop_reason == "checkpoint"
    assert result.checkpoint is not None and result.checkpoint.position == "after_tools"
    assert len(server.requests) == 1, "running the tools needs no model call"

    resume = {"checkpointResume": {"checkpoint": result.checkpoint.to_dict()}}
    result, state = await run(definition, state, "c3", resume)
    assert result.stop_reason == "end_turn"
    assert result.message == {"role": "assistant", "content": [{"text": "It is 5."}]}
    assert tool_results_sent(kind, server.requests[1].body) == [("call_1", "5")]
    assert roles(state) == ["user", "assistant", "user", "assistant"]
    usage = result.metrics["turn"]
    assert usage, "turn metrics are kept"


@pytest.mark.parametrize("kind", KINDS)
async def test_interrupt_then_answer(kind: str, server: WireServer) -> None:
    server.script(
        tool_reply(kind, "call_d", "deploy", {"target": "prod"}), text_reply(kind, "Done.")
    )
    definition = agent(kind, server, checkpointing=False)
    state = SessionState(session_id="s-int")

    result, state = await run(definition, state, "c1", "Deploy to prod")
    assert result.stop_reason == "interrupt"
    assert result.interrupts is not None
    [interrupt] = result.interrupts
    assert (interrupt.name, interrupt.reason) == ("approval", {"target": "prod"})

    answer = [{"interruptResponse": {"interruptId": interrupt.id, "response": "yes"}}]
    result, state = await run(definition, state, "c2", answer)
    assert result.stop_reason == "end_turn"
    assert tool_results_sent(kind, server.requests[1].body) == [("call_d", "deployed prod: yes")]
    assert len(server.requests) == 2


@pytest.mark.parametrize("kind", KINDS)
async def test_cancel_mid_stream_then_continue(kind: str, server: WireServer) -> None:
    server.script(
        text_reply(kind, "Once ", "upon ", "a time", hang_after=3),
        text_reply(kind, "Sure."),
    )
    definition = agent(kind, server, checkpointing=False)
    cancel = CancelSignal()

    async def cancel_when_streaming() -> None:
        await server.hanging.wait()
        cancel.cancel("user left")

    canceller = asyncio.create_task(cancel_when_streaming())
    result, state = await asyncio.wait_for(
        run(definition, SessionState(session_id="s-c"), "c1", "Tell a story", cancel), 10
    )
    await canceller
    assert result.stop_reason == "cancelled"
    assert result.message == {"role": "assistant", "content": [{"text": "user left"}]}
    await asyncio.wait_for(server.closed_mid_stream.wait(), 5)

    result, state = await run(definition, state, "c2", "Something shorter")
    assert result.stop_reason == "end_turn"
    assert roles(state) == ["user", "assistant", "user", "assistant"]
    assert len(server.requests) == 2


@pytest.mark.parametrize("kind", KINDS)
async def test_model_error_leaves_the_session_resumable(kind: str, server: WireServer) -> None:
    server.script(bad_request(kind), text_reply(kind, "Fine now."))
    definition = agent(kind, server, checkpointing=False)

    result, state = await run(definition, SessionState(session_id="s-e"), "c1", "Hello")
    assert result.stop_reason == "error"
    assert result.error is not None and result.error.code == "model_error"
    assert "HTTP 400" in result.error.message

    result, state = await run(definition, state, "c2", "Hello again")
    assert result.stop_reason == "end_turn"
    assert result.message == {"role": "assistant", "content": [{"text": "Fine now."}]}


async def test_bedrock_throttling_then_success(server: WireServer) -> None:
    server.script(
        bw.throttled(),
        bw.stream([bw.message_start(), bw.exception("throttlingException", "Too many tokens")]),
        text_reply("bedrock", "Fine."),
    )
    definition = agent("bedrock", server, checkpointing=False)

    result, state = await run(definition, SessionState(session_id="s-t"), "c1", "Hello")
    assert result.stop_reason == "end_turn"
    assert result.message == {"role": "assistant", "content": [{"text": "Fine."}]}
    assert roles(state) == ["user", "assistant"]
    assert len(server.requests) == 3


async def test_bedrock_guardrail_intervention(server: WireServer) -> None:
    blocked = "Sorry, I cannot help with that."
    server.script(
        bw.stream(bw.text_events(blocked, stop_reason="guardrail_intervened")),
        text_reply("bedrock", "Paris is sunny."),
    )
    definition = agent("bedrock", server, checkpointing=False)

    result, state = await run(definition, SessionState(session_id="s-g"), "c1", "Something bad")
    assert result.stop_reason == "guardrail_intervened"
    assert result.error is None
    assert result.message == {"role": "assistant", "content": [{"text": blocked}]}

    result, state = await run(definition, state, "c2", "The weather in Paris?")
    assert result.stop_reason == "end_turn"
    assert roles(state) == ["user", "assistant", "user", "assistant"]


async def test_bedrock_expired_credentials_end_in_model_error(server: WireServer) -> None:
    server.script(bw.expired_token(), text_reply("bedrock", "Back again."))
    definition = agent("bedrock", server, checkpointing=False)

    result, state = await run(definition, SessionState(session_id="s-x"), "c1", "Hello")
    assert result.stop_reason == "error"
    assert result.error is not None and result.error.code == "model_error"
    assert "ExpiredTokenException" in result.error.message
    assert "the AWS credentials have expired; refresh them" in result.error.message
    assert len(server.requests) == 1, "expired credentials are not retried"
    assert roles(state) == ["user"], "the prompt is kept; the history stays valid"

    # once the credentials are refreshed the same session goes on
    result, state = await run(definition, state, "c2", "Hello again")
    assert result.stop_reason == "end_turn"
    assert result.message == {"role": "assistant", "content": [{"text": "Back again."}]}
    assert roles(state) == ["user", "assistant"]
    assert state.messages[0]["content"] == [{"text": "Hello"}, {"text": "Hello again"}]
    assert server.requests[1].body["messages"] == [
        {"role": "user", "content": [{"text": "Hello"}, {"text": "Hello again"}]}
    ]
