"""Translation between Kafka records and the runtime: commands in; results, events, DLQ out.

The one runtime module that knows the wire codec, so the rest deals only in
:class:`ParsedCommand` and :class:`OutRecord`. Every record produced is keyed by session id and
validated by the wire models before it is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from service.agent.types import AgentResult, Limits
from service.runtime.bad_input import fit_dead_letter
from service.runtime.work import InputRecord, OutRecord
from service.wire.codec import decode_command, encode, encode_result
from service.wire.dlq import dlq_headers
from service.wire.errors import ErrorCode, WireError
from service.wire.events import (
    CheckpointReachedEvent,
    InterruptRaisedEvent,
    ModelMessageEvent,
    TextDeltaEvent,
    ToolFinishedEvent,
    ToolStartedEvent,
)
from service.wire.results import error_record
from service.wire.results import result_record as wire_result

EVENT_MODELS: dict[str, Any] = {
    "text_delta": TextDeltaEvent,
    "model_message": ModelMessageEvent,
    "tool_started": ToolStartedEvent,
    "tool_finished": ToolFinishedEvent,
    "checkpoint_reached": CheckpointReachedEvent,
    "interrupt_raised": InterruptRaisedEvent,
}


@dataclass(slots=True)
class ParsedCommand:
    """An invoke or resume as the runtime needs it (``input`` is the engine's input)."""

    type: str
    command_id: str
    session_id: str
    agent: str | None
    input: Any
    checkpointing: bool | None = None
    limits: Limits | None = None
    invocation_state: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


def parse_command(record: InputRecord) -> ParsedCommand:
    """Decode a commands-topic record; raises :class:`WireError` when it is not a command."""
    if record.value is None:
        raise WireError("record has no value")
    command = decode_command(record.value, key=record.key)
    limits = None
    if command.limits is not None:
        limits = Limits(
            max_cycles=command.limits.max_cycles,
            max_tokens=command.limits.max_tokens,
            deadline_s=command.limits.deadline_s,
        )
    return ParsedCommand(
        type=command.type,
        command_id=command.command_id,
        session_id=command.session_id,
        agent=command.agent,
        input=command.engine_input(),
        checkpointing=command.checkpointing,
        limits=limits,
        invocation_state=command.invocation_state,
        metadata=command.metadata,
    )


def session_key(record: InputRecord) -> str | None:
    """The session id a record is keyed by, if its key is readable."""
    if record.key is None:
        return None
    try:
        return record.key.decode("utf-8") or None
    except UnicodeDecodeError:
        return None


def result_record(
    topic: str,
    session_id: str,
    command_id: str,
    result: AgentResult,
    metadata: dict[str, Any] | None,
    headers: list[tuple[str, bytes]] | None = None,
) -> OutRecord:
    record = wire_result(result, session_id=session_id, command_id=command_id, metadata=metadata)
    return OutRecord(
        topic=topic, key=session_id.encode(), value=encode_result(record), headers=headers or []
    )


def failure_record(
    topic: str,
    session_id: str,
    command_id: str,
    code: ErrorCode,
    message: str,
    metadata: dict[str, Any] | None,
    headers: list[tuple[str, bytes]] | None = None,
) -> OutRecord:
    record = error_record(
        session_id=session_id,
        command_id=command_id,
        code=code,
        message=message,
        metadata=metadata,
    )
    return OutRecord(
        topic=topic, key=session_id.encode(), value=encode_result(record), headers=headers or []
    )


def event_record(
    topic: str,
    session_id: str,
    command_id: str,
    seq: int,
    kind: str,
    data: dict[str, Any],
    headers: list[tuple[str, bytes]] | None = None,
) -> OutRecord:
    event = EVENT_MODELS[kind](session_id=session_id, command_id=command_id, seq=seq, **data)
    return OutRecord(
        topic=topic, key=session_id.encode(), value=encode(event), headers=headers or []
    )


def dlq_record(topic: str, record: InputRecord, reason: str, code: ErrorCode) -> OutRecord:
    """The original record unchanged, with why and where it came from in headers."""
    headers = dlq_headers(
        record.headers,
        reason=reason,
        topic=record.origin.topic,
        partition=record.origin.partition,
        offset=record.origin.offset,
        code=code,
    )
    return fit_dead_letter(
        OutRecord(topic=topic, key=record.key, value=record.value, headers=headers)
    )
