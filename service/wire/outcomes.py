"""The ``tool_outcome_unknown`` interrupt on the wire: the reason Cairn writes and the answers.

The answer's model and schema accept what :func:`service.agent.outcomes.answer_problem`, the
engine's check, accepts (the contract tests hold all three to the same examples and refusals);
the reason is outbound, so readers ignore fields they do not know.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    RootModel,
    StringConstraints,
    WithJsonSchema,
    field_validator,
)
from pydantic_core import PydanticCustomError

from service.wire.base import Id, PartModel
from service.wire.refusal_text import json_kind

RESULT_BLOCK_SCHEMA: dict[str, Any] = {
    "title": "ToolOutcomeContentBlock",
    "description": "An object with exactly one key (text, json, image, document, ...); "
    "text, when given, is a string.",
    "type": "object",
    "minProperties": 1,
    "maxProperties": 1,
    "properties": {"text": {"type": "string"}},
}


def _check_result_block(block: dict[str, Any]) -> dict[str, Any]:
    if len(block) != 1:
        raise PydanticCustomError(
            "content_block",
            "a content block has exactly one key, got {count}",
            {"count": len(block)},
        )
    if "text" in block and not isinstance(block["text"], str):
        raise PydanticCustomError(
            "content_block", f"text must be a string, got {json_kind(block['text'])}"
        )
    return block


ResultBlock = Annotated[
    dict[str, Any], AfterValidator(_check_result_block), WithJsonSchema(RESULT_BLOCK_SCHEMA)
]
"""A block of a supplied result: checked as the engine checks a tool's own result."""


class ToolOutcomeUnknownReason(BaseModel):
    """The ``reason`` of a ``tool_outcome_unknown`` interrupt (id
    ``v1:tool_outcome_unknown:<toolUseId>``): a tool declared ``effect="once"`` was recorded as
    started, and its instance stopped before its result was recorded, so it may or may not have
    done its work. It is not run again without an answer (see ``tool_outcome_answer``)."""

    model_config = ConfigDict(
        strict=True, extra="ignore", frozen=True, use_attribute_docstrings=True
    )

    tool_name: str
    """The tool's name, as the model called it."""
    input: Any
    """The tool's input, as the model gave it."""
    tool_use_id: Id
    """The toolUseId of the call."""
    idempotency_key: str
    """What the tool was given to make its effect idempotent: ``<session_id>:<toolUseId>``."""
    started_at: float
    """When it was started, in epoch seconds."""
    instance: str
    """The instance that started it (host and process)."""


class ToolOutcomeResult(PartModel):
    """The tool's result as the caller knows it; the model sees it as the tool's result."""

    content: list[ResultBlock]
    status: Literal["success", "error"] = "success"
    """Default ``success``."""


class ToolOutcomeResultAnswer(PartModel):
    """``{"result": {"content": [...], "status": ...}}``: the tool did run, with this result."""

    result: ToolOutcomeResult


class ToolOutcomeRetry(PartModel):
    """``{"retry": true}``: run the tool again (the caller knows it did not do its work, or
    accepts that it may do it twice)."""

    retry: Literal[True]

    @field_validator("retry", mode="before")
    @classmethod
    def _only_true(cls, value: Any) -> Any:
        # A Literal takes 1 for True (they compare equal); the engine takes only true.
        if value is not True:
            raise PydanticCustomError("retry", "retry must be true")
        return value


class ToolOutcomeFail(PartModel):
    """``{"fail": "message"}``: the model sees an error result with this text."""

    fail: Annotated[str, StringConstraints(min_length=1, pattern=r"\S")]
    """A non-empty message (not only white space)."""


class ToolOutcomeAnswer(RootModel[ToolOutcomeResultAnswer | ToolOutcomeRetry | ToolOutcomeFail]):
    """The ``response`` of an answer to a ``tool_outcome_unknown`` interrupt: exactly one of
    ``{"result": {"content": [...], "status": "success"|"error"}}``, ``{"retry": true}`` or
    ``{"fail": "message"}``. Anything else is refused with ``invalid_command`` and nothing
    changes."""

    model_config = ConfigDict(strict=True, frozen=True)
