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

JSON_RESULT = {"city": "Zürich", "temps": [1, 2.5], "ok": True, "note": None}
"""A tool result's JSON content the JSON-as-text tests send, non-ASCII included."""

JSON_RESULT_HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": [{"text": "Weather?"}]},
    {
        "role": "assistant",
        "content": [{"toolUse": {"toolUseId": "t1", "name": "get_weather", "input": {}}}],
    },
    {
        "role": "user",
        "content": [
            {
                "toolResult": {
                    "toolUseId": "t1",
                    "status": "success",
                    "content": [{"text": "found:"}, {"json": JSON_RESULT}, {"json": [3, "x"]}],
                }
            }
        ],
    },
]
"""A turn whose tool result holds text and two JSON contents."""


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


FAKE_AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYFAKEKEYVALUE"


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Fixed fake AWS credentials in the environment, and no other source of them."""
    for name in ("AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        # the local server must be reached directly
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFAKEFAKEFAKE0001")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_AWS_SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "fake-session-token")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
