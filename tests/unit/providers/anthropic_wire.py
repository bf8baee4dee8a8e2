"""Messages API wire shapes exactly as the Anthropic API streams them (events and errors)."""

from __future__ import annotations

import json
from typing import Any

from wire_server import Reply, sse

MODEL = "claude-sonnet-4-5-20250929"


def ev(kind: str, **fields: Any) -> bytes:
    return sse({"type": kind, **fields}, event=kind)


def message_start(input_tokens: int = 25, cache_read: int = 0) -> bytes:
    return ev(
        "message_start",
        message={
            "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": MODEL,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": input_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": cache_read,
                "output_tokens": 1,
                "service_tier": "standard",
            },
        },
    )


PING = ev("ping")


def text_block(index: int, *pieces: str) -> list[bytes]:
    return [
        ev("content_block_start", index=index, content_block={"type": "text", "text": ""}),
        *(
            ev(
                "content_block_delta",
                index=index,
                delta={"type": "text_delta", "text": piece},
            )
            for piece in pieces
        ),
        ev("content_block_stop", index=index),
    ]


def tool_block(index: int, tool_id: str, name: str, pieces: list[str]) -> list[bytes]:
    return [
        ev(
            "content_block_start",
            index=index,
            content_block={"type": "tool_use", "id": tool_id, "name": name, "input": {}},
        ),
        ev(
            "content_block_delta",
            index=index,
            delta={"type": "input_json_delta", "partial_json": ""},
        ),
        *(
            ev(
                "content_block_delta",
                index=index,
                delta={"type": "input_json_delta", "partial_json": piece},
            )
            for piece in pieces
        ),
        ev("content_block_stop", index=index),
    ]


def thinking_block(index: int, thinking: str, signature: str) -> list[bytes]:
    return [
        ev(
            "content_block_start",
            index=index,
            content_block={"type": "thinking", "thinking": "", "signature": ""},
        ),
        ev(
            "content_block_delta",
            index=index,
            delta={"type": "thinking_delta", "thinking": thinking},
        ),
        ev(
            "content_block_delta",
            index=index,
            delta={"type": "signature_delta", "signature": signature},
        ),
        ev("content_block_stop", index=index),
    ]


def finish(stop_reason: str, output_tokens: int = 15) -> list[bytes]:
    return [
        ev(
            "message_delta",
            delta={"stop_reason": stop_reason, "stop_sequence": None},
            usage={"output_tokens": output_tokens},
        ),
        ev("message_stop"),
    ]


def text_events(*pieces: str, stop_reason: str = "end_turn") -> list[bytes]:
    return [message_start(), *text_block(0, *pieces), PING, *finish(stop_reason)]


def tool_args(value: dict[str, Any], parts: int = 3) -> list[str]:
    raw = json.dumps(value)
    size = max(1, len(raw) // parts + 1)
    return [raw[i : i + size] for i in range(0, len(raw), size)]


def stream(events: list[bytes], **kw: Any) -> Reply:
    return Reply(events=events, **kw)


def error(status: int, kind: str, message: str, **headers: str) -> Reply:
    return Reply(
        status=status,
        headers={"request-id": "req_011CSHoEeqs5C35K2UUqR7Fy", **headers},
        json_body={
            "type": "error",
            "error": {"type": kind, "message": message},
            "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy",
        },
    )


def rate_limited(retry_after: str = "0") -> Reply:
    return error(
        429,
        "rate_limit_error",
        "This request would exceed the rate limit for your organization of 50 requests per minute.",
        **{"retry-after": retry_after},
    )


def overloaded() -> Reply:
    return error(529, "overloaded_error", "Overloaded")


def stream_error_event(kind: str = "overloaded_error", message: str = "Overloaded") -> bytes:
    return sse({"type": "error", "error": {"type": kind, "message": message}}, event="error")
