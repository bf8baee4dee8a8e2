"""Conversions of Converse content pieces shared by the provider message mappings.

Guarantee: pure functions; binary payloads come out base64-encoded whether the history holds
raw bytes or an already-encoded string (the session codec stores JSON, so both occur).
"""

from __future__ import annotations

import base64
from typing import Any

import orjson

from service.agent.errors import ModelError

IMAGE_MEDIA_TYPES = {
    "png": "image/png",
    "jpeg": "image/jpeg",
    "jpg": "image/jpeg",
    "gif": "image/gif",
    "webp": "image/webp",
}


def source_base64(block: dict[str, Any], kind: str) -> str:
    """The base64 payload of an ``image``/``document`` block's ``source.bytes``."""
    source = block.get("source")
    data = source.get("bytes") if isinstance(source, dict) else None
    if isinstance(data, bytes | bytearray):
        return base64.b64encode(data).decode("ascii")
    if isinstance(data, str):
        return data
    raise ModelError(f"{kind} block has no source.bytes")


def image_media_type(image: dict[str, Any]) -> str:
    fmt = str(image.get("format", "")).lower()
    media_type = IMAGE_MEDIA_TYPES.get(fmt)
    if media_type is None:
        raise ModelError(f"image format {fmt!r} is not supported")
    return media_type


def json_text(value: Any) -> str:
    return orjson.dumps(value).decode()


def result_text(item: dict[str, Any]) -> str | None:
    """Text of a toolResult content item that is text or JSON; None for anything else."""
    if "text" in item:
        return str(item["text"])
    if "json" in item:
        return json_text(item["json"])
    return None


def kept_tool_input(raw: str) -> dict[str, Any]:
    """The arguments of a tool call kept but never run (its reply stopped for another reason
    than using tools, perhaps mid-call): parsed when they can be, else empty."""
    try:
        value = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def parse_tool_input(raw: str, name: str) -> dict[str, Any]:
    """Parse streamed tool arguments; an empty string means no arguments."""
    if not raw.strip():
        return {}
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ModelError(f"model sent invalid JSON arguments for tool {name!r}: {exc}") from exc
    if not isinstance(value, dict):
        raise ModelError(f"model sent non-object arguments for tool {name!r}")
    return value
