"""Conversation shapes on the wire: content blocks and messages (Bedrock Converse form).

A block is an object with exactly one key; ``text``, ``toolUse`` and ``toolResult`` are checked
field by field, every other kind (``image``, ``document``, ...) is carried through untouched.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, WithJsonSchema
from pydantic_core import PydanticCustomError

from service.wire.base import JsonObject, PartModel
from service.wire.refusal_text import json_kind

TOOL_RESULT_STATUSES = ("success", "error")
RESUME_KEYS = ("checkpointResume", "interruptResponse")
"""Keys of resume payloads; never content blocks, so a resume is never mistaken for a prompt."""
MESSAGE_KEYS = ("role", "content")
"""Keys of a message; never content blocks, so a message short of a key is refused as a message
(naming the key it lacks), not carried to the model as a block of an unknown kind."""

_TOOL_USE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["toolUseId", "name", "input"],
    "properties": {
        "toolUseId": {"type": "string", "minLength": 1},
        "name": {"type": "string", "minLength": 1},
        "input": {},
    },
}
_TOOL_RESULT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["toolUseId", "status", "content"],
    "properties": {
        "toolUseId": {"type": "string", "minLength": 1},
        "status": {"enum": list(TOOL_RESULT_STATUSES)},
        "content": {"type": "array", "items": {"type": "object", "minProperties": 1}},
    },
}
CONTENT_BLOCK_SCHEMA: dict[str, Any] = {
    "title": "ContentBlock",
    "description": "An object with exactly one key: text, toolUse, toolResult, image, ...",
    "type": "object",
    "minProperties": 1,
    "maxProperties": 1,
    "properties": {
        "text": {"type": "string"},
        "toolUse": _TOOL_USE_SCHEMA,
        "toolResult": _TOOL_RESULT_SCHEMA,
    },
    "not": {"anyOf": [{"required": [key]} for key in (*RESUME_KEYS, *MESSAGE_KEYS)]},
}


def _fail(message: str) -> PydanticCustomError:
    return PydanticCustomError("content_block", message)


def _check_id(value: Any, where: str) -> None:
    if not isinstance(value, str):
        raise _fail(f"{where} must be a non-empty string, got {json_kind(value)}")
    if not value:
        raise _fail(f"{where} must be a non-empty string")


def _check_tool_use(body: Any) -> None:
    if not isinstance(body, dict):
        raise _fail(f"toolUse must be an object, got {json_kind(body)}")
    missing = [k for k in ("toolUseId", "name", "input") if k not in body]
    if missing:
        raise _fail(f"toolUse is missing {', '.join(missing)}")
    _check_id(body["toolUseId"], "toolUse.toolUseId")
    _check_id(body["name"], "toolUse.name")


def _check_tool_result(body: Any) -> None:
    if not isinstance(body, dict):
        raise _fail(f"toolResult must be an object, got {json_kind(body)}")
    missing = [k for k in ("toolUseId", "status", "content") if k not in body]
    if missing:
        raise _fail(f"toolResult is missing {', '.join(missing)}")
    _check_id(body["toolUseId"], "toolResult.toolUseId")
    if body["status"] not in TOOL_RESULT_STATUSES:
        raise _fail("toolResult.status must be 'success' or 'error'")
    content = body["content"]
    if not isinstance(content, list) or not all(
        isinstance(item, dict) and item for item in content
    ):
        raise _fail("toolResult.content must be a list of non-empty objects")


def check_block(block: dict[str, Any]) -> dict[str, Any]:
    """Refuse anything but a one-key object; check the inside of the kinds the engine reads."""
    if len(block) != 1:
        raise _fail(f"a content block has exactly one key, got {len(block)}")
    ((kind, body),) = block.items()
    if kind in RESUME_KEYS:
        raise _fail(f"{kind} is a resume payload, not a content block")
    if kind in MESSAGE_KEYS:
        raise _fail(f"{kind} is a message's key, not a content block")
    if kind == "text":
        if not isinstance(body, str):
            raise _fail(f"text must be a string, got {json_kind(body)}")
    elif kind == "toolUse":
        _check_tool_use(body)
    elif kind == "toolResult":
        _check_tool_result(body)
    return block


ContentBlock = Annotated[
    dict[str, Any], AfterValidator(check_block), WithJsonSchema(CONTENT_BLOCK_SCHEMA)
]
"""A block given as input: checked field by field (precise errors for clients)."""

WrittenBlock = Annotated[
    dict[str, Any], Field(min_length=1, max_length=1), WithJsonSchema(CONTENT_BLOCK_SCHEMA)
]
"""A block the engine wrote: only its one-key form is re-checked on the hot path; the contract
tests prove the engine's blocks satisfy the full published schema."""


class Message(PartModel):
    """A conversation message: `{"role": "user"|"assistant", "content": [block, ...]}`."""

    role: Literal["user", "assistant"]
    content: list[WrittenBlock]


class PromptMessage(PartModel):
    """A message given as input: as Message, with every block checked and content non-empty.
    It may also hold the keys the Strands SDK adds to the messages it keeps, tracking_id and
    metadata: accepted, so its messages can be given as they are, and not kept (a model never
    sees them, as under Strands)."""

    role: Literal["user", "assistant"]
    content: Annotated[list[ContentBlock], Field(min_length=1)]
    tracking_id: str | None = None
    """The Strands SDK's id of the message; not kept."""
    metadata: JsonObject | None = None
    """The Strands SDK's usage and metrics of the message; not kept."""

    def engine_message(self) -> dict[str, Any]:
        """The message as the engine keeps it: role and content."""
        return self.model_dump(include={"role", "content"})
