"""Fixtures of the provider tests: a local wire server and request helpers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from wire_server import WireServer

from service.agent.cancel import CancelSignal
from service.agent.provider import ModelReply, ModelRequest, TextDelta, ToolSpec

WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather of a city.",
    input_schema={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)


@pytest.fixture
async def server() -> AsyncIterator[WireServer]:
    srv = WireServer()
    await srv.start()
    yield srv
    await srv.stop()
    assert not srv.unexpected, f"requests beyond the script: {srv.unexpected}"


def make_request(
    prompt: str = "What is the weather in Paris?",
    *,
    tools: list[ToolSpec] | None = None,
    cancel: CancelSignal | None = None,
    deadline: float | None = None,
    messages: list[dict[str, Any]] | None = None,
) -> ModelRequest:
    return ModelRequest(
        messages=messages or [{"role": "user", "content": [{"text": prompt}]}],
        system_prompt="You are terse.",
        tool_specs=tools if tools is not None else [WEATHER],
        cancel=cancel or CancelSignal(),
        deadline=deadline,
        session_id="s-1",
    )


async def collect(provider: Any, request: ModelRequest) -> tuple[list[str], ModelReply]:
    """Run one stream to its end; exactly one ModelReply must come last."""
    deltas: list[str] = []
    replies: list[ModelReply] = []
    async for chunk in provider.stream(request):
        assert not replies, "nothing may follow the ModelReply"
        if isinstance(chunk, TextDelta):
            deltas.append(chunk.text)
        else:
            assert isinstance(chunk, ModelReply)
            replies.append(chunk)
    assert len(replies) == 1
    return deltas, replies[0]
