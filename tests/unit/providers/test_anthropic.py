"""The Anthropic provider against a local server speaking the Messages streaming protocol."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from typing import Any

import anthropic_wire as wire
import pytest
from conftest import WEATHER, collect, make_request
from pydantic import SecretStr, ValidationError
from wire_server import WireServer

from service.agent.cancel import CancelSignal
from service.agent.errors import ModelError
from service.agent.provider import ModelReply, TextDelta
from service.providers.anthropic import AnthropicProvider
from service.providers.config import AnthropicConfig, RetryConfig

KEY = "sk-ant-api03-test-secret-value"
FAST = RetryConfig(max_retries=3, initial_backoff_s=0.01, max_backoff_s=0.05)


def provider(server: WireServer, **kw: Any) -> AnthropicProvider:
    options: dict[str, Any] = {
        "model_id": "claude-test-model",
        "base_url": server.url,
        "api_key": SecretStr(KEY),
        "retry": FAST,
        **kw,
    }
    return AnthropicProvider(AnthropicConfig(**options))


async def test_text_reply_streams_deltas_and_reports_usage(server: WireServer) -> None:
    server.script(wire.stream(wire.text_events("It is ", "sunny.")))
    deltas, reply = await collect(provider(server, max_tokens=512), make_request())

    assert deltas == ["It is ", "sunny."]
    assert reply.message == {"role": "assistant", "content": [{"text": "It is sunny."}]}
    assert reply.stop_reason == "end_turn"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (25, 15)
    [seen] = server.requests
    assert seen.path == "/v1/messages"
    sent_key = seen.headers.get("x-api-key") or seen.headers["authorization"].removeprefix(
        "Bearer "
    )
    assert sent_key == KEY
    assert "anthropic-version" in seen.headers
    assert seen.body["stream"] is True
    assert seen.body["max_tokens"] == 512
    assert seen.body["system"] == "You are terse."
    assert seen.body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "What is the weather in Paris?"}]}
    ]
    assert seen.body["tools"] == [
        {
            "name": "get_weather",
            "description": WEATHER.description,
            "input_schema": WEATHER.input_schema,
        }
    ]


async def test_sampling_options_reach_the_request_body(server: WireServer) -> None:
    server.script(wire.stream(wire.text_events("ok")))
    options = {"temperature": 0.2, "top_p": 0.9, "top_k": 40, "extra_body": {"x": 1}}
    await collect(provider(server, **options), make_request())
    [seen] = server.requests
    assert {k: seen.body[k] for k in ("temperature", "top_p", "top_k", "x")} == {
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "x": 1,
    }


async def test_cached_input_tokens_count_as_input(server: WireServer) -> None:
    events = [
        wire.message_start(10, cache_read=90),
        *wire.text_block(0, "ok"),
        *wire.finish("end_turn", 3),
    ]
    server.script(wire.stream(events))
    _, reply = await collect(provider(server), make_request())
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (100, 3)


async def test_single_tool_call_with_streamed_input_json(server: WireServer) -> None:
    events = [
        wire.message_start(),
        *wire.text_block(0, "Let me check."),
        *wire.tool_block(1, "toolu_01A", "get_weather", ['{"ci', 'ty": "Pa', 'ris"}']),
        *wire.finish("tool_use"),
    ]
    server.script(wire.stream(events))
    deltas, reply = await collect(provider(server), make_request())

    assert deltas == ["Let me check."]
    assert reply.stop_reason == "tool_use"
    assert reply.message["content"] == [
        {"text": "Let me check."},
        {"toolUse": {"toolUseId": "toolu_01A", "name": "get_weather", "input": {"city": "Paris"}}},
    ]


async def test_parallel_tool_calls(server: WireServer) -> None:
    events = [
        wire.message_start(),
        *wire.tool_block(0, "toolu_P", "get_weather", wire.tool_args({"city": "Paris"})),
        *wire.tool_block(1, "toolu_R", "get_weather", wire.tool_args({"city": "Rome"})),
        *wire.finish("tool_use"),
    ]
    server.script(wire.stream(events))
    _, reply = await collect(provider(server), make_request())
    assert [b["toolUse"]["input"] for b in reply.message["content"]] == [
        {"city": "Paris"},
        {"city": "Rome"},
    ]
    assert [b["toolUse"]["toolUseId"] for b in reply.message["content"]] == ["toolu_P", "toolu_R"]


async def test_tool_without_arguments_gets_empty_input(server: WireServer) -> None:
    events = [
        wire.message_start(),
        *wire.tool_block(0, "toolu_N", "now", []),
        *wire.finish("tool_use"),
    ]
    server.script(wire.stream(events))
    _, reply = await collect(provider(server), make_request())
    assert reply.message["content"][0]["toolUse"]["input"] == {}


async def test_tool_call_of_a_reply_ending_the_turn_is_kept_as_tool_use(
    server: WireServer,
) -> None:
    events = [
        wire.message_start(),
        *wire.text_block(0, "Let me check."),
        *wire.tool_block(1, "toolu_E", "get_weather", wire.tool_args({"city": "Oslo"})),
        *wire.finish("end_turn"),
    ]
    server.script(wire.stream(events))
    _, reply = await collect(provider(server), make_request())
    assert reply.stop_reason == "tool_use"
    assert reply.message["content"] == [
        {"text": "Let me check."},
        {"toolUse": {"toolUseId": "toolu_E", "name": "get_weather", "input": {"city": "Oslo"}}},
    ]


async def test_stop_sequence_stop_keeps_tool_call_for_the_engine(server: WireServer) -> None:
    events = [
        wire.message_start(),
        *wire.tool_block(0, "toolu_S", "get_weather", wire.tool_args({"city": "Oslo"})),
        *wire.finish("stop_sequence"),
    ]
    server.script(wire.stream(events))
    _, reply = await collect(provider(server), make_request())
    assert reply.stop_reason == "stop_sequence"
    # Kept (the engine does not run it: the reply did not stop to use tools).
    assert reply.message["content"] == [
        {"toolUse": {"toolUseId": "toolu_S", "name": "get_weather", "input": {"city": "Oslo"}}}
    ]


async def test_max_tokens_stop_keeps_cut_tool_call_without_its_arguments(
    server: WireServer,
) -> None:
    events = [
        wire.message_start(),
        *wire.text_block(0, "Checking"),
        *wire.tool_block(1, "toolu_cut", "get_weather", ['{"ci'])[:-1],
        *wire.finish("max_tokens"),
    ]
    server.script(wire.stream(events))
    _, reply = await collect(provider(server), make_request())
    assert reply.stop_reason == "max_tokens"
    assert reply.message["content"] == [
        {"text": "Checking"},
        {"toolUse": {"toolUseId": "toolu_cut", "name": "get_weather", "input": {}}},
    ]


@pytest.mark.parametrize(
    ("api_reason", "ours"),
    [
        ("refusal", "content_filtered"),
        ("stop_sequence", "stop_sequence"),
    ],
)
async def test_stop_reasons_map(server: WireServer, api_reason: str, ours: str) -> None:
    server.script(wire.stream(wire.text_events("x", stop_reason=api_reason)))
    _, reply = await collect(provider(server), make_request())
    assert reply.stop_reason == ours


async def test_thinking_blocks_round_trip_with_signature(server: WireServer) -> None:
    events = [
        wire.message_start(),
        *wire.thinking_block(0, "The user wants weather.", "sig-abc"),
        *wire.tool_block(1, "toolu_T", "get_weather", ['{"city": "Oslo"}']),
        *wire.finish("tool_use"),
    ]
    server.script(wire.stream(events), wire.stream(wire.text_events("Cold.")))
    prov = provider(server, max_tokens=4096, thinking_budget_tokens=2048)
    _, reply = await collect(prov, make_request())
    assert reply.message["content"][0] == {
        "reasoningContent": {
            "reasoningText": {"text": "The user wants weather.", "signature": "sig-abc"}
        }
    }
    history = [
        {"role": "user", "content": [{"text": "Weather in Oslo?"}]},
        reply.message,
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": "toolu_T",
                        "status": "success",
                        "content": [{"text": "-3C"}],
                    }
                }
            ],
        },
    ]
    await collect(prov, make_request(messages=history))
    sent = server.requests[1].body
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert sent["messages"][1]["content"][0] == {
        "type": "thinking",
        "thinking": "The user wants weather.",
        "signature": "sig-abc",
    }


async def test_retries_rate_limit_and_overload_then_succeeds(server: WireServer) -> None:
    server.script(wire.rate_limited("0"), wire.overloaded(), wire.stream(wire.text_events("ok")))
    _, reply = await collect(provider(server), make_request())
    assert reply.message["content"] == [{"text": "ok"}]
    assert len(server.requests) == 3


async def test_retry_after_header_is_honoured(server: WireServer) -> None:
    server.script(wire.rate_limited("0.4"), wire.stream(wire.text_events("ok")))
    started = time.monotonic()
    await collect(provider(server), make_request())
    assert time.monotonic() - started >= 0.4


async def test_retry_budget_exhausted(server: WireServer) -> None:
    server.script(*(wire.overloaded() for _ in range(2)))
    prov = provider(server, retry=RetryConfig(max_retries=1, initial_backoff_s=0.01))
    with pytest.raises(ModelError) as caught:
        await collect(prov, make_request())
    assert caught.value.retryable
    assert "gave up after 2 attempts" in caught.value.message
    assert "overloaded_error" in caught.value.message
    assert len(server.requests) == 2


async def test_invalid_request_is_not_retried(server: WireServer) -> None:
    server.script(wire.error(400, "invalid_request_error", "messages: roles must alternate"))
    with pytest.raises(ModelError, match="invalid_request_error: messages: roles") as caught:
        await collect(provider(server), make_request())
    assert not caught.value.retryable
    assert len(server.requests) == 1


async def test_authentication_error_never_shows_the_key(server: WireServer) -> None:
    server.script(wire.error(401, "authentication_error", f"invalid x-api-key {KEY}"))
    with pytest.raises(ModelError) as caught:
        await collect(provider(server), make_request())
    assert KEY not in str(caught.value)
    assert "authentication_error" in caught.value.message


async def test_deadline_bounds_the_retries(server: WireServer) -> None:
    server.script(wire.rate_limited("3"))
    with pytest.raises(ModelError, match="deadline"):
        await collect(provider(server), make_request(deadline=time.monotonic() + 0.5))
    assert len(server.requests) == 1


async def test_error_event_mid_stream_is_retried(server: WireServer) -> None:
    server.script(
        wire.stream([wire.message_start(), *wire.text_block(0, "Hel"), wire.stream_error_event()]),
        wire.stream(wire.text_events("Hello")),
    )
    deltas, reply = await collect(provider(server), make_request())
    assert deltas == ["Hel", "Hello"]
    assert reply.message["content"] == [{"text": "Hello"}]


async def test_dropped_connection_mid_stream_is_retried(server: WireServer) -> None:
    server.script(
        wire.stream(wire.text_events("a", "b", "c"), drop_after=3),
        wire.stream(wire.text_events("abc")),
    )
    _, reply = await collect(provider(server), make_request())
    assert reply.message["content"] == [{"text": "abc"}]
    assert len(server.requests) == 2


async def test_cancel_mid_stream_closes_the_http_stream(server: WireServer) -> None:
    events = [
        wire.message_start(),
        *wire.text_block(0, "one ", "two ", "three"),
        *wire.finish("end_turn"),
    ]
    server.script(wire.stream(events, hang_after=4))
    cancel = CancelSignal()
    chunks: list[Any] = []
    async for chunk in provider(server).stream(make_request(cancel=cancel)):
        chunks.append(chunk)
        if isinstance(chunk, TextDelta):
            await asyncio.wait_for(server.hanging.wait(), 5)
            cancel.cancel("stop now")
    await asyncio.wait_for(server.closed_mid_stream.wait(), 5)
    final = chunks[-1]
    assert isinstance(final, ModelReply)
    assert final.stop_reason == "cancelled"
    assert [c.text for c in chunks[:-1]] == ["one "]
    assert final.usage.input_tokens == 25


async def test_closing_the_generator_closes_the_http_stream(server: WireServer) -> None:
    events = [wire.message_start(), *wire.text_block(0, "a", "b"), *wire.finish("end_turn")]
    server.script(wire.stream(events, hang_after=3))
    stream = provider(server).stream(make_request())
    assert await anext(stream) == TextDelta("a")
    await stream.aclose()  # type: ignore[attr-defined]
    await asyncio.wait_for(server.closed_mid_stream.wait(), 5)


async def test_history_maps_to_anthropic_blocks(server: WireServer) -> None:
    png = b"\x89PNG-bytes"
    history = [
        {
            "role": "user",
            "content": [
                {"text": "Look"},
                {"image": {"format": "png", "source": {"bytes": png}}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"text": ""},
                {"toolUse": {"toolUseId": "t1", "name": "get_weather", "input": {"city": "Oslo"}}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": "t1",
                        "status": "error",
                        "content": [{"text": "Error: down"}, {"json": {"retry": True}}],
                    }
                },
                {"text": "Try again"},
            ],
        },
    ]
    server.script(wire.stream(wire.text_events("ok")))
    await collect(provider(server), make_request(messages=history))
    encoded = base64.b64encode(png).decode()
    assert server.requests[0].body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": encoded},
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}}
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [
                        {"type": "text", "text": "Error: down"},
                        {"type": "text", "text": '{"retry": true}'},
                    ],
                    "is_error": True,
                },
                {"type": "text", "text": "Try again"},
            ],
        },
    ]


def test_thinking_options_are_validated() -> None:
    with pytest.raises(ValidationError, match="below max_tokens"):
        AnthropicConfig(
            model_id="m", api_key=SecretStr("k"), max_tokens=2000, thinking_budget_tokens=4000
        )
    with pytest.raises(ValidationError, match="temperature"):
        AnthropicConfig(
            model_id="m", api_key=SecretStr("k"), thinking_budget_tokens=2048, temperature=0.5
        )


async def test_key_never_reaches_the_logs(
    server: WireServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    server.script(wire.error(500, "api_error", f"bad {KEY}"), wire.stream(wire.text_events("ok")))
    await collect(provider(server), make_request())
    assert "retrying model call" in caplog.text
    assert KEY not in caplog.text
