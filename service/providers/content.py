"""Conversions of Converse content pieces shared by the provider message mappings.

Guarantee: pure functions; binary payloads come out base64-encoded whether the history holds
raw bytes or an already-encoded string (the session codec stores JSON, so both occur); a toolUse
goes out with a valid name and an object input whatever the history holds (:func:`sent_tool_use`);
a tool result's JSON or a tool call's arguments sent as text are the text Strands writes
(:func:`json_text`).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import orjson

from service.agent.errors import ModelError
from service.agent.messages import model_tool_name

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


def json_text(value: Any, *, ascii_only: bool = False) -> str:
    """JSON a model is sent as text (a tool result's ``json`` content, a tool call's arguments):
    Python's default JSON text (``", "`` and ``": "``), as Strands writes it, so a model reads
    the same history under either. Strands' Anthropic and OpenAI formatters keep non-ASCII
    characters; its Bedrock formatter (for Nova) escapes them, hence ``ascii_only``."""
    return json.dumps(value, ensure_ascii=ascii_only)


def result_text(item: dict[str, Any]) -> str | None:
    """Text of a toolResult content item that is text or JSON; None for anything else."""
    if "text" in item:
        return str(item["text"])
    if "json" in item:
        return json_text(item["json"])
    return None


def cited_text(cited: Any) -> str:
    """The text of a ``citationsContent`` block's body (its generated parts joined), which is
    what providers that take no citations back are sent, as the reference sends it."""
    parts = cited.get("content") if isinstance(cited, dict) else None
    if not isinstance(parts, list):
        return ""
    return "".join(str(part["text"]) for part in parts if isinstance(part, dict) and "text" in part)


def sent_tool_use(use: Any) -> tuple[str, str, dict[str, Any]]:
    """``(toolUseId, name, input)`` of a history's toolUse as a provider sends it.

    A toolUse may come from a custom provider or a prompt of messages: a name no tool can have,
    or none, is sent as the reference's placeholder (the engine already sends it so); an input
    that is not an object, or none, is sent as ``{}`` (as the reference's Bedrock formatter
    does; the call was refused with an error result). Only a toolUse without an id is refused:
    its result could not name it.
    """
    tool_use_id = use.get("toolUseId") if isinstance(use, dict) else None
    if not isinstance(tool_use_id, str) or not tool_use_id:
        raise ModelError("a toolUse block without a toolUseId cannot be sent to the model")
    tool_input = use.get("input")
    return tool_use_id, model_tool_name(use), tool_input if isinstance(tool_input, dict) else {}


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
