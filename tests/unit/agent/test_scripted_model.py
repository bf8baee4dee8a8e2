"""The scripted provider: replay by order or by conversation, chunks, errors, loud exhaustion."""

from __future__ import annotations

from typing import Any

import pytest

from service.agent.cancel import CancelSignal
from service.agent.errors import ModelError, ScriptExhaustedError
from service.agent.provider import ModelReply, ModelRequest, TextDelta
from service.agent.types import Usage
from service.providers.scripted import ScriptedModel, ScriptedReply, ToolCall, conversation_index


def request(messages: list[dict[str, Any]], session_id: str = "s") -> ModelRequest:
    return ModelRequest(
        messages=messages,
        system_prompt=None,
        tool_specs=[],
        cancel=CancelSignal(),
        session_id=session_id,
    )


async def collect(model: ScriptedModel, messages: list[dict[str, Any]]) -> list[Any]:
    return [chunk async for chunk in model.stream(request(messages))]


USER = {"role": "user", "content": [{"text": "hi"}]}


async def test_sequential_mode_replays_in_order_and_fails_loudly() -> None:
    model = ScriptedModel(["one", "two"])
    assert (await collect(model, [USER]))[-1].message["content"] == [{"text": "one"}]
    assert (await collect(model, [USER]))[-1].message["content"] == [{"text": "two"}]
    with pytest.raises(ScriptExhaustedError):
        await collect(model, [USER])
    assert model.calls == 3


async def test_conversation_mode_picks_by_position_for_many_sessions() -> None:
    model = ScriptedModel([ToolCall("echo", {"text": "a"}), "done"], mode="conversation")
    first = await collect(model, [USER])
    again = await collect(model, [USER])
    assert first[-1].message == again[-1].message, "same conversation, same reply"
    tool_use = first[-1].message["content"][0]["toolUse"]
    assert tool_use == {"toolUseId": "tooluse_1_0", "name": "echo", "input": {"text": "a"}}
    assert first[-1].stop_reason == "tool_use"
    history = [USER, first[-1].message, {"role": "user", "content": [{"toolResult": {}}]}]
    assert (await collect(model, history))[-1].message["content"] == [{"text": "done"}]


def test_conversation_index_counts_assistant_messages_since_the_last_prompt() -> None:
    assistant = {"role": "assistant", "content": [{"text": "a"}]}
    results = {"role": "user", "content": [{"toolResult": {}}]}
    assert conversation_index([USER]) == 0
    assert conversation_index([USER, assistant, results]) == 1
    assert conversation_index([USER, assistant, results, assistant, USER]) == 0
    assert conversation_index([USER, assistant, results, assistant, results]) == 2


async def test_chunks_usage_and_stop_reason() -> None:
    reply = ScriptedReply(
        text="abc", chunks=["a", "bc"], usage=Usage(3, 4), stop_reason="max_tokens"
    )
    chunks = await collect(ScriptedModel([reply]), [USER])
    assert [c.text for c in chunks if isinstance(c, TextDelta)] == ["a", "bc"]
    final = chunks[-1]
    assert isinstance(final, ModelReply)
    assert final.stop_reason == "max_tokens" and final.usage == Usage(3, 4)


async def test_errors_are_raised_after_chunks() -> None:
    model = ScriptedModel([ScriptedReply(chunks=["partial"], error=ModelError("boom"))])
    seen: list[Any] = []
    with pytest.raises(ModelError):
        async for chunk in model.stream(request([USER])):
            seen.append(chunk)
    assert [c.text for c in seen] == ["partial"]


async def test_records_requests_when_asked() -> None:
    model = ScriptedModel(["x"], record=True)
    await collect(model, [USER])
    assert [r.messages for r in model.requests] == [[USER]]
