"""The Bedrock provider against a local server speaking ConverseStream's wire format."""

from __future__ import annotations

import asyncio
import base64
import struct
import time
import zlib
from typing import Any

import pytest
from botocore.eventstream import ChecksumMismatch, EventStreamBuffer
from conftest import FAKE_AWS_SECRET, WEATHER, collect, make_request
from pydantic import ValidationError
from wire_server import WireServer

from service.agent.cancel import CancelSignal
from service.agent.errors import ContextOverflowError, ModelError
from service.agent.provider import ModelReply, TextDelta
from service.providers.bedrock import BedrockProvider
from service.providers.config import BedrockConfig, RetryConfig
from tests.support import bedrock_wire as wire

FAST = RetryConfig(max_retries=3, initial_backoff_s=0.01, max_backoff_s=0.05)

pytestmark = pytest.mark.usefixtures("aws_env")


def provider(server: WireServer, **kw: Any) -> BedrockProvider:
    options: dict[str, Any] = {
        "model_id": wire.MODEL,
        "endpoint_url": server.url,
        "retry": FAST,
        **kw,
    }
    return BedrockProvider(BedrockConfig(**options))


async def run(prov: BedrockProvider, **kw: Any) -> tuple[list[str], ModelReply]:
    try:
        return await collect(prov, make_request(**kw))
    finally:
        await prov.aclose()


def test_frames_are_what_botocore_reads() -> None:
    payload = b'{"contentBlockIndex":0,"delta":{"text":"hi"}}'
    data = wire.event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "hi"}})
    buffer = EventStreamBuffer()
    # fed in two pieces, split inside the headers, as a chunked response may deliver it
    buffer.add_data(data[:20])
    assert list(buffer) == []
    buffer.add_data(data[20:])
    [message] = list(buffer)
    assert message.headers == {
        ":event-type": "contentBlockDelta",
        ":content-type": "application/json",
        ":message-type": "event",
    }
    assert message.payload == payload
    assert message.to_response_dict()["status_code"] == 200
    exception = next(iter(_buffer(wire.exception("throttlingException", "slow down"))))
    assert exception.headers[":exception-type"] == "throttlingException"
    assert exception.to_response_dict()["status_code"] == 400


def test_botocore_checks_both_crcs_of_a_frame() -> None:
    data = wire.event("messageStop", {"stopReason": "end_turn"})
    (total, headers_length, prelude_crc) = struct.unpack(">III", data[:12])
    assert total == len(data)
    assert prelude_crc == zlib.crc32(data[:8])
    assert struct.unpack(">I", data[-4:])[0] == zlib.crc32(data[:-4])
    broken_payload = data[:-6] + bytes([data[-6] ^ 1]) + data[-5:]
    with pytest.raises(ChecksumMismatch):
        list(_buffer(broken_payload))
    broken_prelude = data[:4] + struct.pack(">I", headers_length + 1) + data[8:]
    with pytest.raises(ChecksumMismatch):
        list(_buffer(broken_prelude))


def _buffer(data: bytes) -> EventStreamBuffer:
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    return buffer


async def test_text_reply_streams_deltas_and_signs_with_the_chain(server: WireServer) -> None:
    server.script(wire.stream(wire.text_events("It is ", "sunny.")))
    deltas, reply = await run(provider(server))

    assert deltas == ["It is ", "sunny."]
    assert reply.message == {"role": "assistant", "content": [{"text": "It is sunny."}]}
    assert reply.stop_reason == "end_turn"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (25, 15)
    [seen] = server.requests
    assert seen.method == "POST"
    assert seen.path == "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse-stream"
    authorization = seen.headers["authorization"]
    assert authorization.startswith("AWS4-HMAC-SHA256 Credential=AKIAFAKEFAKEFAKE0001/")
    assert "/us-east-1/bedrock/aws4_request" in authorization
    assert seen.headers["x-amz-security-token"] == "fake-session-token"
    assert FAKE_AWS_SECRET not in str(seen.headers)
    assert seen.body == {
        "messages": [{"role": "user", "content": [{"text": "What is the weather in Paris?"}]}],
        "system": [{"text": "You are terse."}],
        "toolConfig": {
            "tools": [
                {
                    "toolSpec": {
                        "name": "get_weather",
                        "description": WEATHER.description,
                        "inputSchema": {"json": WEATHER.input_schema},
                    }
                }
            ]
        },
    }


async def test_every_request_option_reaches_the_body(server: WireServer) -> None:
    server.script(wire.stream(wire.text_events("ok")))
    prov = provider(
        server,
        region="eu-west-1",
        max_tokens=512,
        temperature=0.3,
        top_p=0.9,
        stop_sequences=["END"],
        guardrail_id="gr-123",
        guardrail_version="2",
        guardrail_trace="enabled",
        additional_model_request_fields={"top_k": 40},
        cache_system_prompt=True,
        cache_tools=True,
        max_connections=7,
    )
    await collect(prov, make_request())
    client_config = prov._client.meta.config
    assert (client_config.max_pool_connections, client_config.retries["total_max_attempts"]) == (
        7,
        1,
    )
    await prov.aclose()
    [seen] = server.requests
    assert "/eu-west-1/bedrock/aws4_request" in seen.headers["authorization"]
    body = seen.body
    assert body["inferenceConfig"] == {
        "maxTokens": 512,
        "temperature": 0.3,
        "topP": 0.9,
        "stopSequences": ["END"],
    }
    assert body["guardrailConfig"] == {
        "guardrailIdentifier": "gr-123",
        "guardrailVersion": "2",
        "trace": "enabled",
    }
    assert body["additionalModelRequestFields"] == {"top_k": 40}
    assert body["system"] == [{"text": "You are terse."}, {"cachePoint": {"type": "default"}}]
    assert body["toolConfig"]["tools"][-1] == {"cachePoint": {"type": "default"}}


async def test_cache_usage_counts_as_input(server: WireServer) -> None:
    server.script(wire.stream(wire.text_events("ok", cache_read=100, cache_write=7)))
    _, reply = await run(provider(server))
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (132, 15)


async def test_tool_call_with_streamed_input(server: WireServer) -> None:
    server.script(wire.stream(wire.tool_events("tooluse_1", "get_weather", {"city": "Paris"})))
    deltas, reply = await run(provider(server))
    assert deltas == ["Let me check."]
    assert reply.stop_reason == "tool_use"
    assert reply.message["content"] == [
        {"text": "Let me check."},
        {"toolUse": {"toolUseId": "tooluse_1", "name": "get_weather", "input": {"city": "Paris"}}},
    ]


@pytest.mark.parametrize(
    "reason",
    ["end_turn", "max_tokens", "stop_sequence", "guardrail_intervened", "content_filtered"],
)
async def test_stop_reasons_map(server: WireServer, reason: str) -> None:
    server.script(wire.stream(wire.text_events("x", stop_reason=reason)))
    _, reply = await run(provider(server))
    assert reply.stop_reason == reason


async def test_tool_call_of_an_end_turn_reply_is_kept_as_tool_use(server: WireServer) -> None:
    events = wire.tool_events("tooluse_e", "get_weather", {"city": "Oslo"}, stop_reason="end_turn")
    server.script(wire.stream(events))
    _, reply = await run(provider(server))
    assert reply.stop_reason == "tool_use"
    assert reply.message["content"] == [
        {"text": "Let me check."},
        {"toolUse": {"toolUseId": "tooluse_e", "name": "get_weather", "input": {"city": "Oslo"}}},
    ]


async def test_tool_call_under_an_unknown_stop_reason_is_kept(server: WireServer) -> None:
    events = wire.tool_events("tooluse_u", "get_weather", {"city": "Oslo"}, stop_reason="novel")
    server.script(wire.stream(events))
    _, reply = await run(provider(server))
    assert (reply.stop_reason, reply.unknown_stop_reason) == ("end_turn", "novel")
    # Kept, never run: the engine does not run the calls of a reply it cannot read.
    assert reply.message["content"] == [
        {"text": "Let me check."},
        {"toolUse": {"toolUseId": "tooluse_u", "name": "get_weather", "input": {"city": "Oslo"}}},
    ]


async def test_cut_tool_call_of_an_unfinished_reply_is_kept_without_its_arguments(
    server: WireServer,
) -> None:
    events = [
        wire.message_start(),
        *wire.text_deltas(0, "Checking"),
        *wire.tool_block(1, "tooluse_2", "get_weather", ['{"ci']),
        *wire.finish("max_tokens"),
    ]
    server.script(wire.stream(events))
    _, reply = await run(provider(server))
    assert reply.stop_reason == "max_tokens"
    # The engine turns it into a line saying it was cut off; it never runs.
    assert reply.message["content"] == [
        {"text": "Checking"},
        {"toolUse": {"toolUseId": "tooluse_2", "name": "get_weather", "input": {}}},
    ]


async def test_reasoning_round_trips(server: WireServer) -> None:
    secret = b"\x00opaque-redacted"
    events = [
        wire.message_start(),
        *wire.reasoning_block(0, "The user wants weather.", "sig-abc"),
        *wire.redacted_block(1, secret),
        *wire.text_deltas(2, "Sunny."),
        *wire.finish("end_turn"),
    ]
    server.script(wire.stream(events), wire.stream(wire.text_events("ok")))
    _, reply = await run(provider(server))
    assert reply.message["content"] == [
        {
            "reasoningContent": {
                "reasoningText": {"text": "The user wants weather.", "signature": "sig-abc"}
            }
        },
        {"reasoningContent": {"redactedContent": base64.b64encode(secret).decode()}},
        {"text": "Sunny."},
    ]
    history = [
        {"role": "user", "content": [{"text": "Weather?"}]},
        reply.message,
        {"role": "user", "content": [{"text": "Thanks"}]},
    ]
    await run(provider(server), messages=history)
    sent = server.requests[1].body["messages"][1]["content"]
    assert sent[:2] == reply.message["content"][:2]


async def test_citations_are_kept_as_a_citations_content_block(server: WireServer) -> None:
    """As Strands' stream processor keeps them; they went back as plain text before."""
    citation = {
        "title": "Handbook",
        "sourceContent": [{"text": "It rains in Bergen."}],
        "location": {"documentChar": {"documentIndex": 0, "start": 0, "end": 19}},
    }
    events = [
        wire.message_start(),
        *wire.text_deltas(0, "Look: "),
        *wire.cited_block(1, citation, "Bergen is rainy."),
        *wire.finish("end_turn"),
    ]
    server.script(wire.stream(events), wire.stream(wire.text_events("ok")))
    deltas, reply = await run(provider(server))
    assert deltas == ["Look: ", "Bergen is rainy."]
    cited = {"citations": [citation], "content": [{"text": "Bergen is rainy."}]}
    assert reply.message["content"] == [{"text": "Look: "}, {"citationsContent": cited}]
    history = [
        {"role": "user", "content": [{"text": "Weather?"}]},
        reply.message,
        {"role": "user", "content": [{"text": "Thanks"}]},
    ]
    await run(provider(server), messages=history)
    assert server.requests[1].body["messages"][1]["content"] == reply.message["content"]


async def test_citations_of_a_block_without_text_are_dropped(server: WireServer) -> None:
    """Strands hands them on to the reply's next text block, which they do not cite."""
    citation = {"title": "Handbook", "location": {"documentChar": {"documentIndex": 0}}}
    events = [
        wire.message_start(),
        *wire.cited_block(0, citation, ""),
        *wire.text_deltas(1, "Bergen is rainy."),
        *wire.finish("end_turn"),
    ]
    server.script(wire.stream(events))
    _, reply = await run(provider(server))
    assert reply.message["content"] == [{"text": "Bergen is rainy."}]


async def test_history_maps_to_converse_blocks(server: WireServer) -> None:
    png = b"\x89PNG-bytes"
    history = [
        {
            "role": "user",
            "content": [
                {"text": "Look"},
                {"text": ""},
                {"image": {"format": "png", "source": {"bytes": png}}},
                {"cachePoint": {"type": "default"}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"toolUse": {"toolUseId": "t1", "name": "get_weather", "input": {"city": "Oslo"}}}
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": "t1",
                        "status": "error",
                        "content": [
                            {"json": {"temp": -3}},
                            {
                                "image": {
                                    "format": "png",
                                    "source": {"bytes": base64.b64encode(png).decode()},
                                }
                            },
                        ],
                    }
                }
            ],
        },
    ]
    server.script(wire.stream(wire.text_events("ok")))
    await run(provider(server), messages=history)
    encoded = base64.b64encode(png).decode()
    assert server.requests[0].body["messages"] == [
        {
            "role": "user",
            "content": [
                {"text": "Look"},
                {"image": {"format": "png", "source": {"bytes": encoded}}},
                {"cachePoint": {"type": "default"}},
            ],
        },
        history[1],
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": "t1",
                        "status": "error",
                        "content": [
                            {"json": {"temp": -3}},
                            {"image": {"format": "png", "source": {"bytes": encoded}}},
                        ],
                    }
                }
            ],
        },
    ]


async def test_unsupported_block_is_a_model_error(server: WireServer) -> None:
    history = [{"role": "user", "content": [{"audio": {"format": "mp3"}}]}]
    with pytest.raises(ModelError, match=r"\['audio'\] is not supported by bedrock"):
        await run(provider(server), messages=history)
    assert server.requests == []


async def test_throttling_then_success(server: WireServer) -> None:
    server.script(
        wire.throttled(),
        wire.error(
            503, "ServiceUnavailableException", "Bedrock is unable to process your request."
        ),
        wire.stream(wire.text_events("ok")),
    )
    _, reply = await run(provider(server))
    assert reply.message["content"] == [{"text": "ok"}]
    assert len(server.requests) == 3


async def test_retry_after_header_is_honoured(server: WireServer) -> None:
    server.script(wire.throttled(**{"Retry-After": "0.4"}), wire.stream(wire.text_events("ok")))
    started = time.monotonic()
    await run(provider(server))
    assert time.monotonic() - started >= 0.4
    assert len(server.requests) == 2


@pytest.mark.parametrize("kind", ["throttlingException", "modelStreamErrorException"])
async def test_exception_event_mid_stream_is_retried(server: WireServer, kind: str) -> None:
    server.script(
        wire.stream(
            [wire.message_start(), *wire.text_deltas(0, "Hel"), wire.exception(kind, "try again")]
        ),
        wire.stream(wire.text_events("Hello")),
    )
    deltas, reply = await run(provider(server))
    assert deltas == ["Hel", "Hello"]
    assert reply.message["content"] == [{"text": "Hello"}]


async def test_retry_budget_exhausted(server: WireServer) -> None:
    server.script(wire.throttled(), wire.throttled())
    prov = provider(server, retry=RetryConfig(max_retries=1, initial_backoff_s=0.01))
    with pytest.raises(ModelError) as caught:
        await run(prov)
    assert caught.value.retryable
    assert "gave up after 2 attempts" in caught.value.message
    assert "ThrottlingException" in caught.value.message


async def test_validation_error_is_not_retried(server: WireServer) -> None:
    server.script(
        wire.error(
            400,
            "ValidationException",
            "The model returned the following errors: messages: roles must alternate",
        )
    )
    with pytest.raises(
        ModelError, match="HTTP 400 ValidationException: The model returned"
    ) as caught:
        await run(provider(server))
    assert not caught.value.retryable
    assert not isinstance(caught.value, ContextOverflowError)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("reply", "hint"),
    [
        (wire.expired_token(), "the AWS credentials have expired; refresh them"),
        (
            wire.error(
                403,
                "AccessDeniedException",
                "You don't have access to the model with the specified model ID.",
            ),
            "may not invoke this model",
        ),
        (
            wire.error(
                403,
                "UnrecognizedClientException",
                "The security token included in the request is invalid.",
            ),
            "access key is not known",
        ),
    ],
)
async def test_credential_errors_are_clear_and_not_retried(
    server: WireServer, reply: Any, hint: str
) -> None:
    server.script(reply)
    with pytest.raises(ModelError) as caught:
        await run(provider(server))
    assert hint in caught.value.message
    assert caught.value.message.startswith("bedrock: HTTP 403 ")
    assert not caught.value.retryable
    assert len(server.requests) == 1


async def test_no_credentials_is_a_clear_model_error(
    server: WireServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    with pytest.raises(ModelError, match="no AWS credentials"):
        await run(provider(server))
    assert server.requests == []


@pytest.mark.parametrize(
    "message",
    [
        "Input is too long for requested model.",
        "The model returned the following errors: input length and `max_tokens` exceed "
        "context limit: 199000 + 4096 > 200000",
    ],
)
async def test_overflow_is_a_context_overflow(server: WireServer, message: str) -> None:
    server.script(wire.error(400, "ValidationException", message))
    with pytest.raises(ContextOverflowError):
        await run(provider(server))
    assert len(server.requests) == 1


async def test_context_window_stop_reason_is_a_context_overflow(server: WireServer) -> None:
    server.script(
        wire.stream(wire.text_events("partial", stop_reason="model_context_window_exceeded"))
    )
    with pytest.raises(ContextOverflowError, match="model_context_window_exceeded"):
        await run(provider(server))


async def test_dropped_connection_mid_stream_is_retried(server: WireServer) -> None:
    server.script(
        wire.stream(wire.text_events("a", "b", "c"), drop_after=3),
        wire.stream(wire.text_events("abc")),
    )
    _, reply = await run(provider(server))
    assert reply.message["content"] == [{"text": "abc"}]
    assert len(server.requests) == 2


async def test_stream_without_message_stop_is_retried(server: WireServer) -> None:
    server.script(
        wire.stream([wire.message_start(), *wire.text_deltas(0, "a")]),
        wire.stream(wire.text_events("abc")),
    )
    _, reply = await run(provider(server))
    assert reply.message["content"] == [{"text": "abc"}]
    assert len(server.requests) == 2


async def test_cancel_mid_stream_closes_the_http_stream(server: WireServer) -> None:
    events = [
        wire.message_start(),
        *wire.text_deltas(0, "one ", "two ", "three"),
        *wire.finish("end_turn"),
    ]
    server.script(wire.stream(events, hang_after=2))
    cancel = CancelSignal()
    chunks: list[Any] = []
    prov = provider(server)
    async for chunk in prov.stream(make_request(cancel=cancel)):
        chunks.append(chunk)
        if isinstance(chunk, TextDelta):
            await asyncio.wait_for(server.hanging.wait(), 5)
            cancel.cancel("stop now")
    await asyncio.wait_for(server.closed_mid_stream.wait(), 5)
    await prov.aclose()
    final = chunks[-1]
    assert isinstance(final, ModelReply)
    assert final.stop_reason == "cancelled"
    assert [c.text for c in chunks[:-1]] == ["one "]


async def test_closing_the_generator_closes_the_http_stream(server: WireServer) -> None:
    events = [wire.message_start(), *wire.text_deltas(0, "a", "b"), *wire.finish("end_turn")]
    server.script(wire.stream(events, hang_after=2))
    prov = provider(server)
    stream = prov.stream(make_request())
    assert await anext(stream) == TextDelta("a")
    await stream.aclose()  # type: ignore[attr-defined]
    await asyncio.wait_for(server.closed_mid_stream.wait(), 5)
    await prov.aclose()


def test_options_are_validated() -> None:
    with pytest.raises(ValidationError, match="guardrail_id and guardrail_version go together"):
        BedrockConfig(model_id="m", guardrail_id="gr-1")
    with pytest.raises(ValidationError, match="guardrail_trace needs"):
        BedrockConfig(model_id="m", guardrail_trace="enabled")
    with pytest.raises(ValidationError, match="endpoint_url must start with http"):
        BedrockConfig(model_id="m", endpoint_url="localhost:8080")
    with pytest.raises(ValidationError, match="aws_secret_access_key"):
        BedrockConfig(model_id="m", aws_secret_access_key="x")  # type: ignore[call-arg]


def test_repr_names_model_and_endpoint() -> None:
    prov = BedrockProvider(BedrockConfig(model_id="m", region="us-west-2"))
    assert repr(prov) == "BedrockProvider(model_id='m', region='us-west-2', endpoint_url=None)"


def test_one_provider_serves_two_event_loops() -> None:
    """Each loop gets its own client: the first loop's HTTP session is unusable in the next."""
    port = 0
    prov: BedrockProvider | None = None

    async def one_call(*, close: bool) -> ModelReply:
        nonlocal port, prov
        server = WireServer()
        await server.start(port)
        port = int(server.url.rsplit(":", 1)[1])
        if prov is None:
            prov = provider(server)
        server.script(wire.stream(wire.text_events("ok")))
        try:
            _, reply = await collect(prov, make_request())
        finally:
            if close:
                await prov.aclose()
            await server.stop()
        assert len(server.requests) == 1
        return reply

    # the first loop ends with the client open, as a service's loop would
    first = asyncio.run(one_call(close=False))
    second = asyncio.run(one_call(close=True))
    assert first.message == second.message == {"role": "assistant", "content": [{"text": "ok"}]}


RESULTS_HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": [{"text": "Weather?"}]},
    {
        "role": "assistant",
        "content": [
            {"toolUse": {"toolUseId": "t1", "name": "get_weather", "input": {"city": "Oslo"}}},
            {"toolUse": {"toolUseId": "t2", "name": "get_weather", "input": {"city": "Rome"}}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"toolResult": {"toolUseId": "t1", "status": "error", "content": [{"text": "down"}]}},
            {"toolResult": {"toolUseId": "t2", "status": "success", "content": []}},
        ],
    },
]


@pytest.mark.parametrize(
    ("model_id", "status"),
    [
        ("anthropic.claude-3-5-haiku-20241022-v1:0", True),
        ("us.anthropic.claude-sonnet-4-20250514-v1:0", True),
        ("amazon.nova-lite-v1:0", False),
        ("meta.llama3-1-70b-instruct-v1:0", False),
    ],
)
def test_tool_results_go_as_strands_sends_them(model_id: str, status: bool) -> None:
    """A result's status only to Claude models (others may refuse the request), and a result
    without content with one empty text (some models refuse an empty list), as under Strands."""
    prov = BedrockProvider(BedrockConfig(model_id=model_id, region="us-east-1"))
    params = prov.request_params(make_request(messages=RESULTS_HISTORY))
    failed = {"toolUseId": "t1", "content": [{"text": "down"}]}
    empty = {"toolUseId": "t2", "content": [{"text": ""}]}
    if status:
        failed["status"], empty["status"] = "error", "success"
    assert params["messages"][2]["content"] == [{"toolResult": failed}, {"toolResult": empty}]


SIGNED = {"reasoningContent": {"reasoningText": {"text": "plan", "signature": "sig"}}}
UNSIGNED = {"reasoningContent": {"reasoningText": {"text": "plan"}}}
REDACTED = {"reasoningContent": {"redactedContent": base64.b64encode(b"opaque").decode()}}


@pytest.mark.parametrize(
    ("model_id", "kept"),
    [
        ("anthropic.claude-3-7-sonnet-20250219-v1:0", ["signed", "redacted"]),
        ("us.deepseek.r1-v1:0", []),
        ("amazon.nova-pro-v1:0", ["redacted"]),
        ("openai.gpt-oss-120b-1:0", ["unsigned", "redacted"]),
        ("openai.gpt-5-mini-v1:0", ["redacted"]),
        ("us.qwen.qwen3-coder-30b-a3b-v1:0", ["redacted"]),
        ("xai.grok-4-v1:0", ["redacted"]),
        ("writer.palmyra-x5-v1:0", ["redacted"]),
        ("arn:aws:bedrock:us-east-1:1:inference-profile/x", ["signed", "unsigned", "redacted"]),
    ],
)
def test_reasoning_the_model_refuses_is_left_out(model_id: str, kept: list[str]) -> None:
    """As Strands' BedrockModel does: such a block in the history makes Converse refuse the
    request, so a tool loop with that model would fail at its second call."""
    blocks = {"signed": SIGNED, "unsigned": UNSIGNED, "redacted": REDACTED}
    history = [
        {"role": "user", "content": [{"text": "Weather?"}]},
        {"role": "assistant", "content": [*blocks.values(), {"text": "Sunny."}]},
        {"role": "user", "content": [{"text": "Thanks"}]},
    ]
    prov = BedrockProvider(BedrockConfig(model_id=model_id, region="us-east-1"))
    sent = prov.request_params(make_request(messages=history))["messages"][1]["content"]
    expected = [{"text": "Sunny."}]
    for name in reversed(kept):
        block = blocks[name]["reasoningContent"]
        if name == "redacted":
            block = {"redactedContent": b"opaque"}
        expected.insert(0, {"reasoningContent": block})
    assert sent == expected
