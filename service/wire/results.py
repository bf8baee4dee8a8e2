"""The ``agent_result`` record: one per accepted command, keyed by session id.

Its body is exactly ``AgentResult.to_dict()`` of the engine plus ``schema_version``,
``session_id``, ``command_id`` and ``metadata``; the pause fields agree with ``stop_reason``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from service.agent.types import AgentResult, StopReason
from service.wire.base import (
    WIRE_SCHEMA_VERSION,
    Id,
    JsonObject,
    OutboundModel,
    PartModel,
    WireVersion,
    require_envelope,
)
from service.wire.blocks import Message
from service.wire.errors import ErrorCode
from service.wire.pauses import Checkpoint, Interrupt


class ErrorBody(PartModel):
    """Why the command was rejected or failed; ``code`` is one of the documented codes."""

    code: ErrorCode
    message: str


class CancelReport(PartModel):
    """What a cancel covered, on its own result; all empty when it found nothing to cancel."""

    model_config = ConfigDict(extra="ignore")

    stopped: Id | None
    """The running invocation it told to stop; that command's own result, ahead of this one,
    says how it ended."""
    skipped: list[Id]
    """The commands it answered ``cancelled`` without running them, in the order answered."""
    resolved: Literal["checkpoint", "interrupt"] | None
    """The kind of pause it resolved (the pause's checkpoint is stale from then on)."""


class DeletedReport(PartModel):
    """What a delete removed, on its own result; ``existed`` is false when nothing was there."""

    model_config = ConfigDict(extra="ignore")

    existed: bool
    """The session had state to delete."""
    records: Annotated[int, Field(ge=0)]
    """How many state records it tombstoned."""
    stopped: Id | None
    """The running invocation it stopped; that command's own result, ahead of this one, says
    how it ended."""
    skipped: list[Id]
    """The queued commands of the session it answered ``cancelled`` without running them, in
    the order answered."""


class ForkedFrom(PartModel):
    """Where a fork came from, on its first result."""

    model_config = ConfigDict(extra="ignore")

    session_id: Id
    """The session forked from (left unchanged)."""
    version: Annotated[int, Field(ge=1)]
    """Its version the fork started from."""


class VersionEntry(PartModel):
    """One version of a session, as ``history`` lists it."""

    model_config = ConfigDict(extra="ignore")

    version: Annotated[int, Field(ge=1)]
    at: Annotated[float, Field(ge=0)]
    """When the step committed (epoch seconds)."""
    command_id: str
    """The command whose step it was."""
    position: Literal["after_model", "after_tools"] | None = None
    """The boundary the step reached (also set for a pause there); absent at an end."""
    stop_reason: StopReason | None = None
    """How the command's run ended, when the step was its result; absent at a boundary the
    run went on from."""
    cycle_index: Annotated[int, Field(ge=0)]
    messages: Annotated[int, Field(ge=0)]
    """Messages of the conversation at that version."""
    forked_from: ForkedFrom | None = None
    """On the first version of a fork."""


class HistoryPage(PartModel):
    """A page of a session's versions, on a ``history`` command's result."""

    model_config = ConfigDict(extra="ignore")

    versions: list[VersionEntry]
    """Newest first."""
    next_before: Annotated[int, Field(ge=1)] | None
    """Send as ``before`` for the next (older) page; ``null`` on the last."""
    oldest_kept: Annotated[int, Field(ge=1)] | None
    """The oldest version still kept (older ones were compacted away); ``null`` when the session
    has none."""


def _result_schema(schema: dict[str, Any]) -> None:
    require_envelope(schema)
    schema["allOf"] = [
        _iff("checkpoint", {"type": "object"}, {"type": "null"}),
        _iff("interrupt", {"type": "array", "minItems": 1}, {"type": "null"}),
        {
            "if": {"properties": {"stop_reason": {"const": "error"}}},
            "then": {"properties": {"error": {"type": "object"}}},
        },
    ]


def _iff(reason: str, when: dict[str, Any], otherwise: dict[str, Any]) -> dict[str, Any]:
    field = "interrupts" if reason == "interrupt" else reason
    return {
        "if": {"properties": {"stop_reason": {"const": reason}}},
        "then": {"properties": {field: when}},
        "else": {"properties": {field: otherwise}},
    }


class ResultRecord(OutboundModel):
    """What a client reads from the results topic for each command it published."""

    model_config = ConfigDict(json_schema_extra=_result_schema)

    type: Literal["agent_result"] = "agent_result"
    schema_version: WireVersion = WIRE_SCHEMA_VERSION
    session_id: Id
    command_id: Id
    """The command this result answers (the correlation id)."""
    message: Message | None
    stop_reason: StopReason
    checkpoint: Checkpoint | None
    """Set exactly when ``stop_reason`` is ``checkpoint``; send it back to resume."""
    interrupts: Annotated[list[Interrupt], Field(min_length=1)] | None
    """Set exactly when ``stop_reason`` is ``interrupt``; answer each by its ``id``."""
    metrics: JsonObject
    """This invocation's metrics and the running totals of the turn."""
    state: JsonObject
    """The agent state (a JSON object) after this invocation."""
    error: ErrorBody | None
    """Set when ``stop_reason`` is ``error``: the command was rejected or failed."""
    metadata: JsonObject
    """The command's ``metadata``, unchanged (``{}`` when it had none, or when echoing it would
    make the result larger than the record limit: then ``metadata_truncated`` is true)."""
    metadata_truncated: bool = False
    """True when the command's metadata was left out to keep the result within the record
    limit; written only then."""
    cancel: CancelReport | None = None
    """On a cancel's own result only (written only there): what the cancel covered."""
    deleted: DeletedReport | None = None
    """On a delete's own result only (written only there): what the delete removed."""
    version: Annotated[int, Field(ge=1)] | None = None
    """Cairn extension: the session's version after this command (written only when the
    session has one); the step of an engine result is a new version."""
    forked_from: ForkedFrom | None = None
    """Cairn extension, on a fork's own result only: the session and version it came from."""
    history: HistoryPage | None = None
    """Cairn extension, on a ``history`` command's result only: a page of the versions."""

    @model_validator(mode="after")
    def _pause_fields_agree(self) -> ResultRecord:
        if (self.stop_reason == "checkpoint") != (self.checkpoint is not None):
            raise ValueError("checkpoint is set exactly when stop_reason is 'checkpoint'")
        if (self.stop_reason == "interrupt") != (self.interrupts is not None):
            raise ValueError("interrupts are set exactly when stop_reason is 'interrupt'")
        if self.stop_reason == "error" and self.error is None:
            raise ValueError("error is required when stop_reason is 'error'")
        return self


def result_record(
    result: AgentResult,
    *,
    session_id: str,
    command_id: str,
    metadata: JsonObject | None = None,
    version: int | None = None,
    forked_from: tuple[str, int] | None = None,
) -> ResultRecord:
    """Wrap an engine result for the wire; raises ``pydantic.ValidationError`` on a bad shape."""
    body = result.to_dict()
    body.update(
        schema_version=WIRE_SCHEMA_VERSION,
        session_id=session_id,
        command_id=command_id,
        metadata=metadata if metadata is not None else {},
    )
    if version is not None:
        body["version"] = version
    if forked_from is not None:
        body["forked_from"] = {"session_id": forked_from[0], "version": forked_from[1]}
    return ResultRecord.model_validate(body)


def history_result(
    *,
    session_id: str,
    command_id: str,
    versions: Sequence[JsonObject],
    next_before: int | None,
    oldest_kept: int | None,
    version: int | None,
    metadata: JsonObject | None = None,
) -> ResultRecord:
    """A ``history`` command's result: ``end_turn`` with nothing else set, and the page."""
    body: JsonObject = {
        "session_id": session_id,
        "command_id": command_id,
        "message": None,
        "stop_reason": "end_turn",
        "checkpoint": None,
        "interrupts": None,
        "metrics": {},
        "state": {},
        "error": None,
        "metadata": metadata if metadata is not None else {},
        "history": {
            "versions": list(versions),
            "next_before": next_before,
            "oldest_kept": oldest_kept,
        },
    }
    if version is not None:
        body["version"] = version
    return ResultRecord.model_validate(body)


def error_record(
    *,
    session_id: str,
    command_id: str,
    code: ErrorCode,
    message: str,
    metadata: JsonObject | None = None,
    state: JsonObject | None = None,
) -> ResultRecord:
    """An ``error`` result for a command that was rejected before or while it ran."""
    return ResultRecord(
        session_id=session_id,
        command_id=command_id,
        message=None,
        stop_reason="error",
        checkpoint=None,
        interrupts=None,
        metrics={},
        state=state if state is not None else {},
        error=ErrorBody(code=code, message=message),
        metadata=metadata if metadata is not None else {},
    )


def deleted_result(
    *,
    session_id: str,
    command_id: str,
    existed: bool,
    records: int,
    stopped: str | None,
    skipped: Sequence[str],
    metadata: JsonObject | None = None,
) -> ResultRecord:
    """A delete's own result: ``end_turn`` with nothing else set, and its ``deleted`` report."""
    return ResultRecord(
        session_id=session_id,
        command_id=command_id,
        message=None,
        stop_reason="end_turn",
        checkpoint=None,
        interrupts=None,
        metrics={},
        state={},
        error=None,
        metadata=metadata if metadata is not None else {},
        deleted=DeletedReport(
            existed=existed, records=records, stopped=stopped, skipped=list(skipped)
        ),
    )
