"""Context overflow from each provider's real error shape, played by the local wire server.

OpenAI-compatible: a 400 with code ``context_length_exceeded`` (and, from servers without the
code, the "maximum context length" message); Anthropic: the 400 "prompt is too long"
``invalid_request_error`` and the ``model_context_window_exceeded`` stop reason; Bedrock: the
400 ``ValidationException`` "Input is too long for requested model" and the same stop reason,
in the AWS event-stream framing. Each becomes
one engine error: the engine shrinks the context and retries the same call, or, when nothing
is left to cut, ends ``context_overflow`` with the session resumable.
"""

from __future__ import annotations

from typing import Any

import anthropic_wire as aw
import openai_wire as ow
import pytest
from test_engine_over_providers import (  # the fixture closes the Bedrock clients
    _close_providers,  # noqa: F401
    build_provider,
    run,
    text_reply,
)
from wire_server import Reply, WireServer

from service.agent.context import ContextPolicy
from service.agent.definition import AgentDefinition
from service.agent.errors import ContextOverflowError, ModelError
from service.agent.provider import ModelProvider
from service.agent.state import SessionState
from tests.support import bedrock_wire as bw

OVERFLOWS = [
    "openai_code",
    "openai_message",
    "anthropic_400",
    "anthropic_stop_reason",
    "bedrock_400",
    "bedrock_stop_reason",
]

# Fake AWS credentials for the Bedrock runs (the other providers ignore them).
pytestmark = pytest.mark.usefixtures("aws_env")


def kind_of(shape: str) -> str:
    if shape.startswith("bedrock"):
        return "bedrock"
    return "openai_compat" if shape.startswith("openai") else "anthropic"


def overflow(shape: str) -> Reply:
    """The provider's own answer to a request beyond the model's context window."""
    if shape == "openai_code":
        return ow.error(
            400,
            "This model's maximum context length is 128000 tokens. However, your messages "
            "resulted in 131072 tokens. Please reduce the length of the messages.",
            "invalid_request_error",
            "context_length_exceeded",
        )
    if shape == "openai_message":
        # vLLM's shape: the same failure without a code
        return ow.error(
            400,
            "This model's maximum context length is 8192 tokens. However, you requested "
            "9000 tokens (8000 in the messages, 1000 in the completion).",
            "BadRequestError",
            None,
        )
    if shape == "anthropic_400":
        return aw.error(
            400, "invalid_request_error", "prompt is too long: 212731 tokens > 200000 maximum"
        )
    if shape == "bedrock_400":
        return bw.error(400, "ValidationException", "Input is too long for requested model.")
    if shape == "bedrock_stop_reason":
        return bw.stream(
            bw.text_events("The answer starts", stop_reason="model_context_window_exceeded")
        )
    events = [
        aw.message_start(),
        *aw.text_block(0, "The answer starts"),
        *aw.finish("model_context_window_exceeded"),
    ]
    return Reply(events=events)


def provider(kind: str, server: WireServer) -> ModelProvider:
    return build_provider(kind, server)


def agent(kind: str, server: WireServer, policy: ContextPolicy) -> AgentDefinition:
    return AgentDefinition(
        name="long",
        model=provider(kind, server),
        system_prompt="You remember.",
        context=policy,
    )


def earlier_turns(turns: int) -> SessionState:
    messages: list[dict[str, Any]] = []
    for n in range(turns):
        messages.append({"role": "user", "content": [{"text": f"question {n}"}]})
        messages.append({"role": "assistant", "content": [{"text": f"answer {n}"}]})
    return SessionState(session_id="s-long", agent="long", messages=messages)


def sent(kind: str, body: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, first text) of each conversation message of a request body."""
    out = []
    for message in body["messages"]:
        if message["role"] == "system":
            continue
        content = message["content"]
        text = content if isinstance(content, str) else content[0]["text"]
        out.append((message["role"], text))
    return out


@pytest.mark.parametrize("shape", OVERFLOWS)
async def test_the_provider_raises_the_one_overflow_error(shape: str, server: WireServer) -> None:
    from conftest import collect, make_request

    server.script(overflow(shape))
    with pytest.raises(ContextOverflowError) as caught:
        await collect(provider(kind_of(shape), server), make_request())
    assert caught.value.code == "context_overflow"
    assert len(server.requests) == 1, "an overflow is never retried as it is"


async def test_other_bad_requests_stay_model_errors(server: WireServer) -> None:
    from conftest import collect, make_request

    server.script(
        ow.error(400, "Invalid 'messages'.", "invalid_request_error", None),
        aw.error(400, "invalid_request_error", "messages: roles must alternate"),
    )
    for kind in ("openai_compat", "anthropic"):
        with pytest.raises(ModelError) as caught:
            await collect(provider(kind, server), make_request())
        assert not isinstance(caught.value, ContextOverflowError)


@pytest.mark.parametrize("shape", OVERFLOWS)
async def test_overflow_is_reduced_and_the_same_call_retried(
    shape: str, server: WireServer
) -> None:
    kind = kind_of(shape)
    server.script(overflow(shape), text_reply(kind, "Still here."))
    definition = agent(kind, server, ContextPolicy())

    result, state = await run(definition, earlier_turns(3), "c1", "And now?")
    assert result.stop_reason == "end_turn"
    assert result.message == {"role": "assistant", "content": [{"text": "Still here."}]}
    first, retry = (sent(kind, r.body) for r in server.requests)
    assert len(first) == 7
    assert retry == first[4:], "the oldest messages are cut, the newest kept, in order"
    assert retry[0][0] == "user"
    # storage keeps everything; only the model's view moved, and it is kept for later calls
    assert len(state.messages) == 8
    assert state.context is not None and state.context.start == 4


@pytest.mark.parametrize("shape", OVERFLOWS)
async def test_nothing_left_to_cut_ends_context_overflow_and_the_session_goes_on(
    shape: str, server: WireServer
) -> None:
    kind = kind_of(shape)
    server.script(overflow(shape), overflow(shape), overflow(shape))
    definition = agent(kind, server, ContextPolicy())

    result, state = await run(definition, earlier_turns(3), "c1", "And now?")
    assert result.stop_reason == "error"
    assert result.error is not None and result.error.code == "context_overflow"
    assert "cannot be reduced further" in result.error.message
    # 7 messages, then 3, then the prompt alone: each one refused
    assert [len(sent(kind, r.body)) for r in server.requests] == [7, 3, 1]
    assert len(state.messages) == 7, "the prompt is kept in the history"

    server.script(text_reply(kind, "Shorter works."))
    result, state = await run(definition, state, "c2", "Short question")
    assert result.stop_reason == "end_turn"
    # the view stays where the reductions left it: the unanswered prompt and the new one
    assert [role for role, _ in sent(kind, server.requests[-1].body)] == ["user"]
    assert state.context is not None and state.context.start == 6


@pytest.mark.parametrize("shape", ["openai_code", "anthropic_400", "bedrock_400"])
async def test_strategy_none_ends_context_overflow_at_once(shape: str, server: WireServer) -> None:
    kind = kind_of(shape)
    server.script(overflow(shape))
    definition = agent(kind, server, ContextPolicy("none"))
    result, _ = await run(definition, earlier_turns(3), "c1", "And now?")
    assert result.error is not None and result.error.code == "context_overflow"
    assert len(server.requests) == 1
