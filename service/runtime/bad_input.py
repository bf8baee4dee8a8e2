"""Bad input that needs the runtime's eye: refused checkpoint resumes and oversized dead letters.

Guarantees: a resume the wire refused as a malformed checkpoint is answered with the code the
engine's order of checks gives (interrupt pending, then checkpointing off, then malformed,
incompatible, stale); a resume naming no agent, of a session with no state, is answered as one
with nothing pending (``checkpoint_stale``, ``no_pending_interrupt``); a dead letter always fits
in one producer request, so no input record, however large, can block its partition, and what it
leaves off of the original to fit is named in its headers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from service.agent.definition import AgentDefinition
from service.agent.errors import (
    CheckpointingDisabledError,
    CheckpointStaleError,
    EngineError,
    InterruptPendingError,
    NoPendingInterruptError,
    UnknownAgentError,
)
from service.agent.invocation import Invocation, plan
from service.agent.state import SessionState
from service.runtime.work import CommandWork, Header, OutRecord
from service.sessions.store import StoredSession
from service.wire.codec import json_object
from service.wire.dlq import DLQ_HEADERS_DROPPED, DLQ_TRUNCATED_FROM, split_dlq_headers
from service.wire.errors import ErrorCode, WireError

if TYPE_CHECKING:
    from service.runtime.records import ParsedCommand

_PAYLOAD_FIELDS = ("resume", "prompt")

DEAD_LETTER_BUDGET = 1_000_000
"""Largest dead letter written (key, value and headers), safely below the 1 MiB request and
message limits of the producer and broker defaults; Cairn's headers make a dead letter larger
than the record it keeps, so the largest records a topic takes would not fit whole."""

_RECORD_OVERHEAD = 128


def no_agent_refusal(command: ParsedCommand, agent_name: str | None) -> EngineError:
    """The refusal of a command whose agent (``agent_name``: its own, or else its session's) is
    not hosted here. A resume may leave its agent out, continuing its session's; a session with
    no state (never invoked, deleted or expired) has no pause, so such a resume gets the
    engine's answer to a session with nothing to resume instead of an agent named by nobody."""
    if agent_name or command.type != "resume":
        return UnknownAgentError(f"agent {agent_name!r} is not hosted here")
    why = f"session {command.session_id!r} has no state (never invoked, deleted or expired)"
    if isinstance(command.input, list):
        return NoPendingInterruptError(f"no interrupt is pending: {why}")
    return CheckpointStaleError(f"checkpoint is not the pause this session issued last: {why}")


def foreign_agent_refusal(command: ParsedCommand, stored: StoredSession | None) -> WireError | None:
    """The refusal of a resume that names an agent other than its session's (a resume continues
    its session's agent; naming it is a check, never a switch), else ``None``."""
    session_agent = stored.state.agent if stored is not None else ""
    if command.type != "resume" or not command.agent or not session_agent:
        return None
    if command.agent == session_agent:
        return None
    return WireError(
        f"agent: {command.agent!r} is not the agent of session {command.session_id!r} "
        f"({session_agent!r}); leave it out or name that one",
        session_id=command.session_id,
        command_id=command.command_id,
    )


def classify_refusal(
    work: CommandWork,
    stored: StoredSession | None,
    agents: Mapping[str, AgentDefinition],
) -> WireError | None:
    """The error to answer ``work`` with: the engine's verdict on a refused checkpoint resume.

    The wire refuses a malformed or list-wrapped checkpoint resume before any session is looked
    at; the engine checks the session first. Only when the session passes those earlier checks
    does the wire's ``checkpoint_incompatible`` stand.
    """
    error = work.error
    if error is None or error.code != "checkpoint_incompatible":
        return error
    raw = json_object(work.record.value)
    if raw is None or error.command_id is None:
        return error
    state = stored.state if stored is not None else SessionState(session_id=work.session_id)
    name = raw.get("agent") if isinstance(raw.get("agent"), str) else state.agent
    agent = agents.get(name) if name else None
    if agent is None:
        return error
    checkpointing = raw.get("checkpointing")
    invocation = Invocation(
        command_id=error.command_id,
        input=_payload(raw),
        checkpointing=checkpointing if isinstance(checkpointing, bool) else None,
    )
    try:
        plan(agent, state, invocation)
    except (InterruptPendingError, CheckpointingDisabledError) as exc:
        code: ErrorCode = (
            "interrupt_pending"
            if isinstance(exc, InterruptPendingError)
            else "checkpointing_disabled"
        )
        # A wire error keeps the command id, so the error result can name the command.
        return WireError(
            exc.message,
            code=code,
            session_id=error.session_id,
            command_id=error.command_id,
        )
    except EngineError:
        pass
    return error


def _payload(raw: dict[str, Any]) -> Any:
    """The refused resume payload as the engine would see it (always checkpoint-shaped)."""
    for name in _PAYLOAD_FIELDS:
        value = raw.get(name)
        if isinstance(value, dict) and "checkpointResume" in value:
            return value
        if isinstance(value, list) and any(
            isinstance(item, dict) and "checkpointResume" in item for item in value
        ):
            return value
    return {"checkpointResume": None}


def fit_dead_letter(record: OutRecord, budget: int = DEAD_LETTER_BUDGET) -> OutRecord:
    """``record`` itself when it fits ``budget``; else what fits, every loss named in a header.

    What is kept, in this order: Cairn's headers; the value, whole when it fits beside them; the
    original headers, the first ones in their order, as many as fit beside those; a value too large
    to fit even alone is cut to what the kept headers leave. A value cut says so in
    ``cairn.dlq.truncated_from``, original headers left off in ``cairn.dlq.headers_dropped``, so a
    reader never takes a partial record for the original.
    """
    value = record.value or b""
    if _size(record.key, value, record.headers) <= budget:
        return record
    originals, ours = split_dlq_headers(record.headers)
    room = max(0, budget - _size(record.key, b"", [*ours, *_LOSS_HEADERS]))
    whole = len(value) <= room
    kept = _first_that_fit(originals, room - len(value) if whole else room)
    losses = []
    if not whole:
        value = value[: max(0, room - _headers_size(kept))]
        losses.append((DLQ_TRUNCATED_FROM, str(len(record.value or b"")).encode()))
    if len(kept) < len(originals):
        losses.append((DLQ_HEADERS_DROPPED, str(len(originals) - len(kept)).encode()))
    return OutRecord(
        topic=record.topic,
        key=record.key,
        value=value,
        headers=[*kept, *ours, *losses],
        partition=record.partition,
    )


_LOSS_HEADERS = [(DLQ_TRUNCATED_FROM, b"9" * 20), (DLQ_HEADERS_DROPPED, b"9" * 20)]
"""The headers naming a loss at their largest, set aside before anything else is fitted."""


def _first_that_fit(headers: list[Header], room: int) -> list[Header]:
    """The longest run of ``headers`` from the first that fits ``room``: a prefix, so that the
    count left off tells a reader exactly which ones are missing."""
    used = 0
    for index, header in enumerate(headers):
        used += _headers_size([header])
        if used > room:
            return headers[:index]
    return headers


def _headers_size(headers: Sequence[Header]) -> int:
    return sum(len(name.encode()) + len(data or b"") + 8 for name, data in headers)


def _size(key: bytes | None, value: bytes, headers: Sequence[Header]) -> int:
    return len(key or b"") + len(value) + _headers_size(headers) + _RECORD_OVERHEAD
