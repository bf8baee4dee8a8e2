"""Pause shapes on the wire: checkpoint, interrupt, and the two exact resume payloads.

The resume payloads are the reference's, exactly: ``{"checkpointResume": {"checkpoint": {...}}}``
or a non-empty list of ``{"interruptResponse": {"interruptId": ..., "response": ...}}``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag

from service.wire.base import Id, PartModel

CHECKPOINT_TAG = "<checkpoint>"
ANSWERS_TAG = "<answers>"
SHAPE_TAGS = frozenset({CHECKPOINT_TAG, ANSWERS_TAG})
"""Union tags that appear in validation paths; the error formatter leaves them out."""


class Checkpoint(PartModel):
    """``{"position", "cycle_index", "schema_version": "1.0"}``; unknown keys are kept."""

    model_config = ConfigDict(extra="allow")

    position: Literal["after_model", "after_tools"]
    cycle_index: Annotated[int, Field(ge=0)]
    schema_version: Literal["1.0"]


class Interrupt(PartModel):
    """A question raised by a tool or hook: ``{"id", "name", "reason", "response"}``."""

    id: Id
    name: str
    reason: Any
    response: Any


class CheckpointResumeBody(PartModel):
    checkpoint: Checkpoint


class CheckpointResume(PartModel):
    """``{"checkpointResume": {"checkpoint": {...}}}``: continue from the pause issued last."""

    checkpointResume: CheckpointResumeBody


class InterruptResponse(PartModel):
    interruptId: Id
    response: Any
    """Any JSON; ``null`` means "not answered" and the tool interrupts again."""


class InterruptAnswer(PartModel):
    """``{"interruptResponse": {"interruptId": ..., "response": ...}}``."""

    interruptResponse: InterruptResponse


InterruptAnswers = Annotated[list[InterruptAnswer], Field(min_length=1)]


def is_checkpoint_shape(value: Any) -> bool:
    return isinstance(value, dict) and "checkpointResume" in value


def is_answers_shape(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and any(isinstance(item, dict) and "interruptResponse" in item for item in value)
    )


def is_wrapped_checkpoint(value: Any) -> bool:
    """The list-wrapped ``[{"checkpointResume": ...}]`` form, refused as malformed."""
    return isinstance(value, list) and any(is_checkpoint_shape(item) for item in value)


def is_resume_shape(value: Any) -> bool:
    """True for anything that tries to be a resume (an ``invoke`` prompt like this resumes)."""
    return is_checkpoint_shape(value) or is_answers_shape(value) or is_wrapped_checkpoint(value)


def _resume_tag(value: Any) -> str | None:
    if isinstance(value, CheckpointResume) or is_checkpoint_shape(value):
        return CHECKPOINT_TAG
    if isinstance(value, list) and value and not is_wrapped_checkpoint(value):
        return ANSWERS_TAG
    return None


ResumeInput = Annotated[
    Annotated[CheckpointResume, Tag(CHECKPOINT_TAG)]
    | Annotated[InterruptAnswers, Tag(ANSWERS_TAG)],
    Discriminator(
        _resume_tag,
        custom_error_type="resume_shape",
        custom_error_message=(
            'must be {"checkpointResume": {"checkpoint": {...}}} or a non-empty list of '
            '{"interruptResponse": {"interruptId": ..., "response": ...}}'
        ),
    ),
]
