"""The chat-completions provider against a local server speaking the OpenAI streaming protocol."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from typing import Any

import openai_wire as wire
import pytest
from conftest import WEATHER, collect, make_request
from pydantic import SecretStr
from wire_server import WireServer, sse

from service.agent.cancel import CancelSignal
from service.agent.errors import ModelError
from service.agent.provider import ModelReply, TextDelta
from service.providers.config import OpenAICompatConfig, RetryConfig
from service.providers.openai_compat import OpenAICompatProvider

KEY = "sk-test-0123456789abcdef"
FAST = RetryConfig(max_retries=3, initial_backoff_s=0.01, max_backoff_s=0.05)


def provider(server: WireServer, **kw: Any) -> OpenAICompatProvider:
    options: dict[str, Any] = {
        "model_id": "gpt-4o-mini",
        "base_url": f"{server.url}/v1",
        "api_key": SecretStr(KEY),
        "retry": FAST,
        **kw,
    }
    return OpenAICompatProvider(OpenAICompatConfig(**options))


async def test_text_reply_streams_deltas_and_reports_usage(server: WireServer) -> None:
    server.script(wire.stream(wire.text_events("It is ", "sunny", " in Paris.")))
    deltas, reply = await collect(provider(server, max_tokens=256), make_request())

    assert deltas == ["It is ", "sunny", " in Paris."]
    assert reply.message == {"role": "assistant", "content": [{"text": "It is sunny in Paris."}]}
    assert reply.stop_reason == "end_turn"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (12, 5)
    [seen] = server.requests
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    assert seen.body["model"] == "gpt-4o-mini"
    assert seen.body["stream"] is True
    assert seen.body["stream_options"] == {"include_usage": True}
    assert seen.body["max_completion_tokens"] == 256
    assert seen.body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    assert seen.body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": WEATHER.description,
                "parameters": WEATHER.input_schema,
            },
        }
    ]


async def test_single_tool_call_with_arguments_in_pieces(server: WireServer) -> None:
    server.script(
        wire.stream(wire.tool_events([("call_a1", "get_weather", ['{"ci', 'ty": "Pa', 'ris"}'])]))
    )
    deltas, reply = await collect(provider(server), make_request())

    assert deltas == []
    assert reply.stop_reason == "tool_use"
    assert reply.message["content"] == [
        {"toolUse": {"toolUseId": "call_a1", "name": "get_weather", "input": {"city": "Paris"}}}
    ]
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (30, 9)


async def test_parallel_tool_calls_keep_their_order_and_arguments(server: WireServer) -> None:
    calls = [
        ("call_p", "get_weather", ['{"city"', ': "Paris"}']),
        ("call_r", "get_weather", ['{"ci', 'ty": "Ro', 'me"}']),
    ]
    server.script(wire.stream(wire.tool_events(calls, text="Checking both.")))
    deltas, reply = await collect(provider(server), make_request())

    assert deltas == ["Checking both."]
    assert reply.stop_reason == "tool_use"
    assert reply.message["content"] == [
        {"text": "Checking both."},
        {"toolUse": {"toolUseId": "call_p", "name": "get_weather", "input": {"city": "Paris"}}},
        {"toolUse": {"toolUseId": "call_r", "name": "get_weather", "input": {"city": "Rome"}}},
    ]


async def test_tool_call_reported_with_stop_finish_reason_is_still_tool_use(
    server: WireServer,
) -> None:
    events = wire.tool_events([("call_x", "get_weather", ['{"city": "Oslo"}'])])
    events = [e.replace(b'"finish_reason":"tool_calls"', b'"finish_reason":"stop"') for e in events]
    server.script(wire.stream(events))
    _, reply = await collect(provider(server), make_request())
    assert reply.stop_reason == "tool_use"
    assert reply.message["content"][0]["toolUse"]["input"] == {"city": "Oslo"}


async def test_length_stop_maps_to_max_tokens_and_keeps_cut_tool_call(server: WireServer) -> None:
    server.script(
        wire.stream(
            [
                wire.chunk(wire.ROLE),
                wire.chunk({"content": "Let me"}),
                wire.tool_call_start(0, "call_cut", "get_weather"),
                wire.tool_call_args(0, '{"ci'),
                wire.chunk({}, "length"),
                wire.usage_chunk(10, 16),
                wire.DONE,
            ]
        )
    )
    _, reply = await collect(provider(server), make_request())
    assert reply.stop_reason == "max_tokens"
    assert reply.message["content"] == [
        {"text": "Let me"},
        {"toolUse": {"toolUseId": "call_cut", "name": "get_weather", "input": {}}},
    ]


async def test_content_filter_maps_to_content_filtered(server: WireServer) -> None:
    server.script(wire.stream(wire.text_events("I can", finish="content_filter")))
    _, reply = await collect(provider(server), make_request())
    assert reply.stop_reason == "content_filtered"


async def test_retries_throttling_and_server_errors_then_succeeds(server: WireServer) -> None:
    server.script(
        wire.rate_limited("0"),
        wire.server_error(),
        wire.stream(wire.text_events("ok")),
    )
    _, reply = await collect(provider(server), make_request())
    assert reply.message["content"] == [{"text": "ok"}]
    assert len(server.requests) == 3
    assert all(r.body == server.requests[0].body for r in server.requests)


async def test_retry_after_header_is_honoured(server: WireServer) -> None:
    server.script(wire.rate_limited("0.4"), wire.stream(wire.text_events("ok")))
    started = time.monotonic()
    await collect(provider(server), make_request())
    assert time.monotonic() - started >= 0.4
    assert len(server.requests) == 2


async def test_retry_budget_exhausted_raises_retryable_model_error(server: WireServer) -> None:
    server.script(*(wire.server_error() for _ in range(3)))
    prov = provider(server, retry=RetryConfig(max_retries=2, initial_backoff_s=0.01))
    with pytest.raises(ModelError) as caught:
        await collect(prov, make_request())
    assert caught.value.retryable
    assert caught.value.code == "model_error"
    assert "gave up after 3 attempts" in caught.value.message
    assert len(server.requests) == 3


async def test_client_error_is_not_retried_and_never_shows_the_key(server: WireServer) -> None:
    server.script(
        wire.error(401, f"Incorrect API key provided: {KEY}.", "invalid_request_error", "x")
    )
    with pytest.raises(ModelError) as caught:
        await collect(provider(server), make_request())
    assert not caught.value.retryable
    assert "HTTP 401" in caught.value.message
    assert KEY not in str(caught.value)
    assert caught.value.__cause__ is None
    assert len(server.requests) == 1


async def test_retry_after_beyond_the_deadline_gives_up_at_once(server: WireServer) -> None:
    server.script(wire.rate_limited("5"))
    started = time.monotonic()
    with pytest.raises(ModelError, match="deadline"):
        await collect(provider(server), make_request(deadline=time.monotonic() + 1.0))
    assert time.monotonic() - started < 1.0
    assert len(server.requests) == 1


async def test_dropped_connection_mid_stream_is_retried(server: WireServer) -> None:
    server.script(
        wire.stream(wire.text_events("Hel", "lo", " world"), drop_after=2),
        wire.stream(wire.text_events("Hello", " world")),
    )
    deltas, reply = await collect(provider(server), make_request())
    assert deltas[-2:] == ["Hello", " world"]
    assert reply.message["content"] == [{"text": "Hello world"}]
    assert len(server.requests) == 2


async def test_stream_ending_without_finish_reason_is_retried(server: WireServer) -> None:
    server.script(
        wire.stream([wire.chunk(wire.ROLE), wire.chunk({"content": "Hel"}), wire.DONE]),
        wire.stream(wire.text_events("Hello")),
    )
    _, reply = await collect(provider(server), make_request())
    assert reply.message["content"] == [{"text": "Hello"}]
    assert len(server.requests) == 2


async def test_error_event_mid_stream_is_retried_when_transient(server: WireServer) -> None:
    err = {"error": {"message": "The server had an error.", "type": "server_error", "code": None}}
    server.script(
        wire.stream([wire.chunk(wire.ROLE), sse(err)]),
        wire.stream(wire.text_events("fine")),
    )
    _, reply = await collect(provider(server), make_request())
    assert reply.message["content"] == [{"text": "fine"}]


async def test_cancel_mid_stream_closes_the_http_stream(server: WireServer) -> None:
    server.script(wire.stream(wire.text_events("one ", "two ", "three"), hang_after=3))
    cancel = CancelSignal()
    chunks: list[Any] = []
    async for chunk in provider(server).stream(make_request(cancel=cancel)):
        chunks.append(chunk)
        if isinstance(chunk, TextDelta):
            await asyncio.wait_for(server.hanging.wait(), 5)
            cancel.cancel()
    await asyncio.wait_for(server.closed_mid_stream.wait(), 5)
    # "two " was already on the wire, but the cancel is seen before the next chunk is taken
    assert [c.text for c in chunks[:-1]] == ["one "]
    final = chunks[-1]
    assert isinstance(final, ModelReply)
    assert final.stop_reason == "cancelled"
    assert final.message["content"] == [{"text": "one "}]


async def test_cancel_while_waiting_for_the_first_token(server: WireServer) -> None:
    server.script(wire.stream(wire.text_events("late"), hang_after=0))
    cancel = CancelSignal()

    async def cancel_when_hanging() -> None:
        await server.hanging.wait()
        cancel.cancel()

    canceller = asyncio.create_task(cancel_when_hanging())
    _, reply = await asyncio.wait_for(collect(provider(server), make_request(cancel=cancel)), 5)
    await canceller
    assert reply.stop_reason == "cancelled"
    await asyncio.wait_for(server.closed_mid_stream.wait(), 5)


async def test_closing_the_generator_closes_the_http_stream(server: WireServer) -> None:
    server.script(wire.stream(wire.text_events("a", "b", "c"), hang_after=2))
    stream = provider(server).stream(make_request())
    first = await anext(stream)
    assert first == TextDelta("a")
    await stream.aclose()  # type: ignore[attr-defined]
    await asyncio.wait_for(server.closed_mid_stream.wait(), 5)


async def test_cancel_during_backoff_returns_without_another_request(server: WireServer) -> None:
    server.script(wire.rate_limited("30"))
    cancel = CancelSignal()
    prov = provider(server, retry=RetryConfig(max_retry_after_s=60))

    async def cancel_after_first_request() -> None:
        while not server.requests:
            await asyncio.sleep(0.01)
        cancel.cancel()

    canceller = asyncio.create_task(cancel_after_first_request())
    _, reply = await asyncio.wait_for(collect(prov, make_request(cancel=cancel)), 5)
    await canceller
    assert reply.stop_reason == "cancelled"
    assert len(server.requests) == 1


async def test_cancel_before_the_call_opens_no_request(server: WireServer) -> None:
    cancel = CancelSignal()
    cancel.cancel()
    _, reply = await collect(provider(server), make_request(cancel=cancel))
    assert reply.stop_reason == "cancelled"
    assert server.requests == []


async def test_history_with_tools_and_images_maps_to_chat_messages(server: WireServer) -> None:
    png = b"\x89PNG\r\n\x1a\n0000"
    history = [
        {
            "role": "user",
            "content": [
                {"text": "Weather here?"},
                {"image": {"format": "png", "source": {"bytes": png}}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"text": "Checking."},
                {"toolUse": {"toolUseId": "c1", "name": "get_weather", "input": {"city": "Oslo"}}},
                {"toolUse": {"toolUseId": "c2", "name": "get_weather", "input": {"city": "Rome"}}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": "c1",
                        "status": "success",
                        "content": [{"text": "cold"}, {"json": {"c": -3}}],
                    }
                },
                {
                    "toolResult": {
                        "toolUseId": "c2",
                        "status": "error",
                        "content": [{"text": "Error: no data"}],
                    }
                },
                {"text": "And tomorrow?"},
            ],
        },
    ]
    server.script(wire.stream(wire.text_events("Sunny.")))
    await collect(provider(server), make_request(messages=history))

    data_url = "data:image/png;base64," + base64.b64encode(png).decode()
    assert server.requests[0].body["messages"][1:] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Weather here?"},
                {"type": "image_url", "image_url": {"url": data_url}},
            ],
        },
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": 'cold\n{"c": -3}'},
        {"role": "tool", "tool_call_id": "c2", "content": "Error: no data"},
        {"role": "user", "content": "And tomorrow?"},
    ]


async def test_unsupported_block_is_a_clear_model_error(server: WireServer) -> None:
    history = [{"role": "user", "content": [{"video": {"format": "mp4"}}]}]
    with pytest.raises(ModelError, match="not supported"):
        await collect(provider(server), make_request(messages=history))
    assert server.requests == []


async def test_server_without_key_gets_no_real_credentials(server: WireServer) -> None:
    server.script(wire.stream(wire.text_events("hi")))
    prov = OpenAICompatProvider(OpenAICompatConfig(model_id="llama3", base_url=server.url))
    await collect(prov, make_request(tools=[]))
    [seen] = server.requests
    assert seen.headers["authorization"] == "Bearer no-key"
    assert "tools" not in seen.body


async def test_key_never_reaches_the_logs(
    server: WireServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    echoed = wire.error(500, f"upstream rejected {KEY}", "server_error", None)
    server.script(echoed, wire.stream(wire.text_events("ok")))
    await collect(provider(server), make_request())
    assert "retrying model call" in caplog.text
    assert KEY not in caplog.text
