"""Chat-completions wire shapes exactly as the OpenAI API streams them (chunks and errors)."""

from __future__ import annotations

from typing import Any

from wire_server import Reply, sse

MODEL = "gpt-4o-mini-2024-07-18"


def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
    return sse(
        {
            "id": "chatcmpl-9xk2Lz",
            "object": "chat.completion.chunk",
            "created": 1726000000,
            "model": MODEL,
            "system_fingerprint": "fp_e2bde5a1f6",
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
            "usage": None,
        }
    )


def usage_chunk(prompt: int, completion: int) -> bytes:
    return sse(
        {
            "id": "chatcmpl-9xk2Lz",
            "object": "chat.completion.chunk",
            "created": 1726000000,
            "model": MODEL,
            "system_fingerprint": "fp_e2bde5a1f6",
            "choices": [],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                "completion_tokens_details": {
                    "reasoning_tokens": 0,
                    "audio_tokens": 0,
                    "accepted_prediction_tokens": 0,
                    "rejected_prediction_tokens": 0,
                },
            },
        }
    )


DONE = sse("[DONE]")
ROLE = {"role": "assistant", "content": "", "refusal": None}


def text_events(
    *pieces: str, finish: str = "stop", usage: tuple[int, int] = (12, 5)
) -> list[bytes]:
    return [
        chunk(ROLE),
        *(chunk({"content": p}) for p in pieces),
        chunk({}, finish),
        usage_chunk(*usage),
        DONE,
    ]


def tool_call_start(index: int, call_id: str, name: str) -> bytes:
    return chunk(
        {
            "tool_calls": [
                {
                    "index": index,
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }
            ]
        }
    )


def tool_call_args(index: int, piece: str) -> bytes:
    return chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})


def tool_events(
    calls: list[tuple[str, str, list[str]]],
    text: str | None = None,
    usage: tuple[int, int] = (30, 9),
) -> list[bytes]:
    """``calls`` = (id, name, argument pieces); pieces stream interleaved like parallel calls do."""
    events = [chunk({"role": "assistant", "content": text, "refusal": None})]
    for index, (call_id, name, _) in enumerate(calls):
        events.append(tool_call_start(index, call_id, name))
    longest = max(len(pieces) for _, _, pieces in calls)
    for step in range(longest):
        for index, (_, _, pieces) in enumerate(calls):
            if step < len(pieces):
                events.append(tool_call_args(index, pieces[step]))
    events += [chunk({}, "tool_calls"), usage_chunk(*usage), DONE]
    return events


def stream(events: list[bytes], **kw: Any) -> Reply:
    return Reply(events=events, **kw)


def error(status: int, message: str, kind: str, code: str | None, **headers: str) -> Reply:
    return Reply(
        status=status,
        headers={"x-request-id": "req_7f3a", **headers},
        json_body={"error": {"message": message, "type": kind, "param": None, "code": code}},
    )


def rate_limited(retry_after: str = "0") -> Reply:
    return error(
        429,
        "Rate limit reached for gpt-4o-mini in organization org-x on requests per min (RPM): "
        "Limit 3, Used 3, Requested 1. Please try again in 20s.",
        "requests",
        "rate_limit_exceeded",
        **{"retry-after": retry_after},
    )


def server_error() -> Reply:
    return error(
        500,
        "The server had an error while processing your request. Sorry about that!",
        "server_error",
        None,
    )
