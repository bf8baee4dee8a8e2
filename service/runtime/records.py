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
from service.runtime.partitioning import keyed_partition
from service.runtime.work import InputRecord, OutRecord
from service.wire.base import MAX_ID_LENGTH
from service.wire.codec import decode_command, encode, encode_result
from service.wire.commands import DeleteCommand, ForkCommand, HistoryCommand
from service.wire.dlq import dlq_headers
from service.wire.errors import ErrorCode, WireError
from service.wire.events import (
    CheckpointReachedEvent,
    InterruptRaisedEvent,
    ModelMessageEvent,
    SessionExpiredEvent,
    TextDeltaEvent,
    ToolFinishedEvent,
    ToolStartedEvent,
    step_event_json,
)
from service.wire.results import ResultRecord, deleted_result, error_record, history_result
from service.wire.results import result_record as wire_result

RECORD_MAX_BYTES = 900_000
"""The record limit Cairn works to by default (``runtime.state_record_max_bytes``): the largest
command value it reads and the largest result, state or event it writes."""

ERROR_MESSAGE_MAX_CHARS = 4096
"""An error result's ``message`` is cut to this length, so the answer to a failure stays small."""

EVENT_MODELS: dict[str, Any] = {
    "text_delta": TextDeltaEvent,
    "model_message": ModelMessageEvent,
    "tool_started": ToolStartedEvent,
    "tool_finished": ToolFinishedEvent,
    "checkpoint_reached": CheckpointReachedEvent,
    "interrupt_raised": InterruptRaisedEvent,
    "session_expired": SessionExpiredEvent,
}


@dataclass(slots=True)
class ParsedCommand:
    """An invoke, resume, delete, history or fork as the runtime needs it (``input`` is the
    engine's input; the others have neither ``agent`` nor ``input``, and ``options`` holds a
    history's ``limit`` and ``before`` or a fork's ``source_session_id`` and ``version``)."""

    type: str
    command_id: str
    session_id: str
    agent: str | None
    input: Any
    checkpointing: bool | None = None
    limits: Limits | None = None
    invocation_state: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)


def check_home(
    record: InputRecord, session_id: str, command_id: str, partitions: int | None
) -> None:
    """Raise :class:`WireError` (with the command's ids) when the record's key belongs on another
    partition of its topic than the one it was read from, by Kafka's default partitioner over
    ``partitions`` (``None``: not checked). Its session is owned there, so nothing here may
    answer it from, or write to, that session's state."""
    if partitions is None or record.key is None:
        return
    home = keyed_partition(record.key, partitions)
    if home != record.origin.partition:
        raise WireError(
            f"the record is on partition {record.origin.partition} of {record.origin.topic}, but "
            f"its key belongs on partition {home}: publish with Kafka's default (murmur2) "
            "partitioner",
            session_id=session_id,
            command_id=command_id,
        )


def parse_command(
    record: InputRecord, max_bytes: int = RECORD_MAX_BYTES, partitions: int | None = None
) -> ParsedCommand:
    """Decode a commands-topic record; raises :class:`WireError` when it is not a command, or
    not on the partition its key belongs on (:func:`check_home`).

    A value larger than ``max_bytes`` is refused before a byte of it is parsed.
    """
    if record.value is None:
        raise WireError("record has no value")
    command = decode_command(record.value, key=record.key, max_bytes=max_bytes)
    check_home(record, command.session_id, command.command_id, partitions)
    if isinstance(command, DeleteCommand | HistoryCommand | ForkCommand):
        options: dict[str, Any] = {}
        if isinstance(command, HistoryCommand):
            options = {"limit": command.limit, "before": command.before}
        elif isinstance(command, ForkCommand):
            options = {"source_session_id": command.source_session_id, "version": command.version}
        return ParsedCommand(
            type=command.type,
            command_id=command.command_id,
            session_id=command.session_id,
            agent=None,
            input=None,
            metadata=command.metadata,
            options=options,
        )
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


LOGGED_KEY_CHARS = 2 * MAX_ID_LENGTH
"""A key longer than this (no valid session id is) is cut short in log lines."""


def session_key(record: InputRecord) -> str | None:
    """The session id a record is keyed by, if its key is readable, for a log line: a key of a
    megabyte is cut to its first :data:`LOGGED_KEY_CHARS` characters."""
    if record.key is None:
        return None
    try:
        key = record.key.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if len(key) > LOGGED_KEY_CHARS:
        return f"{key[:LOGGED_KEY_CHARS]}... ({len(key)} characters)"
    return key or None


def result_record(
    topic: str,
    session_id: str,
    command_id: str,
    result: AgentResult,
    metadata: dict[str, Any] | None,
    headers: list[tuple[str, bytes]] | None = None,
    *,
    max_bytes: int = RECORD_MAX_BYTES,
    version: int | None = None,
    forked_from: tuple[str, int] | None = None,
) -> OutRecord:
    """The result record of ``result``; echoed metadata is dropped (and flagged) when it would
    make the record larger than ``max_bytes``. The caller checks the size of what is left."""
    record = wire_result(
        result,
        session_id=session_id,
        command_id=command_id,
        metadata=metadata,
        version=version,
        forked_from=forked_from,
    )
    return _fitted(topic, session_id, record, bool(metadata), headers, max_bytes)


def failure_record(
    topic: str,
    session_id: str,
    command_id: str,
    code: ErrorCode,
    message: str,
    metadata: dict[str, Any] | None,
    headers: list[tuple[str, bytes]] | None = None,
    *,
    max_bytes: int = RECORD_MAX_BYTES,
) -> OutRecord:
    """An ``error`` result; it always fits ``max_bytes`` (metadata dropped and flagged if not)."""
    if len(message) > ERROR_MESSAGE_MAX_CHARS:
        message = message[: ERROR_MESSAGE_MAX_CHARS - 1] + "…"
    record = error_record(
        session_id=session_id,
        command_id=command_id,
        code=code,
        message=message,
        metadata=metadata,
    )
    return _fitted(topic, session_id, record, bool(metadata), headers, max_bytes)


def deleted_record(
    topic: str,
    session_id: str,
    command_id: str,
    *,
    existed: bool,
    records: int,
    stopped: str | None,
    skipped: list[str],
    metadata: dict[str, Any] | None,
    headers: list[tuple[str, bytes]] | None = None,
    max_bytes: int = RECORD_MAX_BYTES,
) -> OutRecord:
    """A delete's result, saying what it removed and stopped; it always fits ``max_bytes``."""
    record = deleted_result(
        session_id=session_id,
        command_id=command_id,
        existed=existed,
        records=records,
        stopped=stopped,
        skipped=skipped,
        metadata=metadata,
    )
    return _fitted(topic, session_id, record, bool(metadata), headers, max_bytes)


def history_record(
    topic: str,
    session_id: str,
    command_id: str,
    *,
    versions: list[dict[str, Any]],
    next_before: int | None,
    oldest_kept: int | None,
    version: int | None,
    metadata: dict[str, Any] | None,
    headers: list[tuple[str, bytes]] | None = None,
    max_bytes: int = RECORD_MAX_BYTES,
) -> OutRecord:
    """A ``history`` command's result (a page is at most 100 small entries: it always fits)."""
    record = history_result(
        session_id=session_id,
        command_id=command_id,
        versions=versions,
        next_before=next_before,
        oldest_kept=oldest_kept,
        version=version,
        metadata=metadata,
    )
    return _fitted(topic, session_id, record, bool(metadata), headers, max_bytes)


def _fitted(
    topic: str,
    session_id: str,
    record: ResultRecord,
    has_metadata: bool,
    headers: list[tuple[str, bytes]] | None,
    max_bytes: int,
) -> OutRecord:
    """The result record, without its echoed metadata (flagged) when it would not fit."""
    value = encode_result(record)
    if len(value) > max_bytes and has_metadata:
        value = encode_result(_without_metadata(record))
    return OutRecord(topic=topic, key=session_id.encode(), value=value, headers=headers or [])


def _without_metadata(record: ResultRecord) -> ResultRecord:
    return record.model_copy(update={"metadata": {}, "metadata_truncated": True})


def event_record(
    topic: str,
    session_id: str,
    command_id: str,
    seq: int,
    kind: str,
    data: dict[str, Any],
    headers: list[tuple[str, bytes]] | None = None,
    version: int | None = None,
) -> OutRecord:
    value = step_event_json(kind, session_id, command_id, seq, version, data)
    if value is None:
        if version is not None:
            data = {**data, "version": version}
        event = EVENT_MODELS[kind](session_id=session_id, command_id=command_id, seq=seq, **data)
        value = encode(event)
    return OutRecord(topic=topic, key=session_id.encode(), value=value, headers=headers or [])


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
