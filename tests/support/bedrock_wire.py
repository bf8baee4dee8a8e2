"""ConverseStream wire shapes as Bedrock sends them: AWS event-stream binary messages and the
service's JSON errors (``x-amzn-ErrorType`` header, ``{"message": ...}`` body).

An event-stream message is a prelude (total length, headers length, CRC32 of those 8 bytes),
the headers (name length, name, value type 7 = string, value length, value), the payload and a
CRC32 of everything before it; all integers big-endian.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from typing import Any

from tests.support.http_wire import Reply

MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
EVENT_STREAM = "application/vnd.amazon.eventstream"
_STRING = 7


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return (
        struct.pack(">B", len(raw_name))
        + raw_name
        + struct.pack(">BH", _STRING, len(raw_value))
        + raw_value
    )


def frame(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream message with both CRCs."""
    raw_headers = b"".join(_header(name, value) for name, value in headers.items())
    total = 4 + 4 + 4 + len(raw_headers) + len(payload) + 4
    prelude = struct.pack(">II", total, len(raw_headers))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    body = prelude + raw_headers + payload
    return body + struct.pack(">I", zlib.crc32(body))


def event(kind: str, payload: dict[str, Any]) -> bytes:
    return frame(
        {":event-type": kind, ":content-type": "application/json", ":message-type": "event"},
        json.dumps(payload, separators=(",", ":")).encode(),
    )


def exception(kind: str, message: str) -> bytes:
    """An in-stream exception, e.g. ``throttlingException`` or ``modelStreamErrorException``."""
    return frame(
        {
            ":exception-type": kind,
            ":content-type": "application/json",
            ":message-type": "exception",
        },
        json.dumps({"message": message}).encode(),
    )


def message_start() -> bytes:
    return event("messageStart", {"p": "abcdef", "role": "assistant"})


def text_deltas(index: int, *pieces: str) -> list[bytes]:
    return [
        *(
            event("contentBlockDelta", {"contentBlockIndex": index, "delta": {"text": piece}})
            for piece in pieces
        ),
        event("contentBlockStop", {"contentBlockIndex": index}),
    ]


def tool_block(index: int, tool_id: str, name: str, pieces: list[str]) -> list[bytes]:
    return [
        event(
            "contentBlockStart",
            {
                "contentBlockIndex": index,
                "start": {"toolUse": {"toolUseId": tool_id, "name": name}},
            },
        ),
        *(
            event(
                "contentBlockDelta",
                {"contentBlockIndex": index, "delta": {"toolUse": {"input": piece}}},
            )
            for piece in pieces
        ),
        event("contentBlockStop", {"contentBlockIndex": index}),
    ]


def reasoning_block(index: int, text: str, signature: str) -> list[bytes]:
    return [
        event(
            "contentBlockDelta",
            {"contentBlockIndex": index, "delta": {"reasoningContent": {"text": text}}},
        ),
        event(
            "contentBlockDelta",
            {"contentBlockIndex": index, "delta": {"reasoningContent": {"signature": signature}}},
        ),
        event("contentBlockStop", {"contentBlockIndex": index}),
    ]


def cited_block(index: int, citation: dict[str, Any], text: str) -> list[bytes]:
    return [
        event("contentBlockDelta", {"contentBlockIndex": index, "delta": {"citation": citation}}),
        *text_deltas(index, text),
    ]


def redacted_block(index: int, data: bytes) -> list[bytes]:
    encoded = base64.b64encode(data).decode()
    return [
        event(
            "contentBlockDelta",
            {
                "contentBlockIndex": index,
                "delta": {"reasoningContent": {"redactedContent": encoded}},
            },
        ),
        event("contentBlockStop", {"contentBlockIndex": index}),
    ]


def finish(
    stop_reason: str,
    *,
    input_tokens: int = 25,
    output_tokens: int = 15,
    cache_read: int | None = None,
    cache_write: int | None = None,
) -> list[bytes]:
    usage: dict[str, int] = {
        "inputTokens": input_tokens,
        "outputTokens": output_tokens,
        "totalTokens": input_tokens + output_tokens + (cache_read or 0) + (cache_write or 0),
    }
    if cache_read is not None:
        usage["cacheReadInputTokens"] = cache_read
    if cache_write is not None:
        usage["cacheWriteInputTokens"] = cache_write
    return [
        event("messageStop", {"stopReason": stop_reason}),
        event("metadata", {"usage": usage, "metrics": {"latencyMs": 412}}),
    ]


def text_events(*pieces: str, stop_reason: str = "end_turn", **usage: Any) -> list[bytes]:
    return [message_start(), *text_deltas(0, *pieces), *finish(stop_reason, **usage)]


def tool_events(
    tool_id: str, name: str, args: dict[str, Any], *, stop_reason: str = "tool_use"
) -> list[bytes]:
    raw = json.dumps(args)
    pieces = [raw[: len(raw) // 2], raw[len(raw) // 2 :]]
    return [
        message_start(),
        *text_deltas(0, "Let me check."),
        *tool_block(1, tool_id, name, pieces),
        *finish(stop_reason),
    ]


def stream(events: list[bytes], **kw: Any) -> Reply:
    return Reply(events=events, content_type=EVENT_STREAM, **kw)


def error(status: int, kind: str, message: str, **headers: str) -> Reply:
    """A service error as Bedrock returns it before any stream starts."""
    return Reply(
        status=status,
        headers={
            "x-amzn-ErrorType": f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/",
            "x-amzn-RequestId": "5b3ab6b1-9f1c-4c1e-8d0b-2f6f1a1c0d9e",
            **headers,
        },
        json_body={"message": message},
    )


def throttled(**headers: str) -> Reply:
    return error(
        429, "ThrottlingException", "Too many requests, please wait before trying again.", **headers
    )


def expired_token() -> Reply:
    return error(
        403, "ExpiredTokenException", "The security token included in the request is expired"
    )
