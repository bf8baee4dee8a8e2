"""Session state: all a fresh process needs to continue a session's conversation exactly.

What the runtime records about delivering the session's commands (applied command ids, cancel
coverage) is not here but in :mod:`service.sessions.delivery`, stored beside it.

Plain data with a lossless ``to_dict``/``from_dict``; the byte codec and version upcasters live
in :mod:`service.sessions.codec`. The engine never mutates a state it was given: an invocation
works on a copy and returns the new state, so a rejected input changes nothing.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from service.agent.context import ContextState
from service.agent.messages import NameCheck, answered_ids
from service.agent.types import Checkpoint, ContentBlock, Interrupt, Message

SESSION_STATE_VERSION = 2


def clone_json(value: Any) -> Any:
    """Copy nested dicts and lists; leaves (str, numbers, None) are immutable and shared."""
    if not value:
        return {} if isinstance(value, dict) else [] if isinstance(value, list) else value
    if isinstance(value, dict):
        return {k: clone_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clone_json(v) for v in value]
    return value


@dataclass(slots=True)
class PendingBatch:
    """A tool batch that has not produced its results message yet.

    ``results`` holds the toolResult blocks already completed, by toolUseId; ``interrupts`` is
    non-empty while the session waits for answers (interrupt state). ``started`` is the ledger
    of ``once`` tools: by toolUseId, when (``at``, epoch seconds) and where (``instance``) each
    one without a result yet was started.
    """

    assistant_message: Message
    results: dict[str, ContentBlock] = field(default_factory=dict)
    interrupts: list[Interrupt] = field(default_factory=list)
    started: dict[str, dict[str, Any]] = field(default_factory=dict)

    def resume_answered(self) -> frozenset[str]:
        """The toolUseIds a resume of this batch runs and answers no more
        (:func:`~service.agent.messages.resume_skipped`): those with a result once it paused on
        an interrupt (its interrupts stay listed, answered, until it completes); none before.

        Taken when the batch starts again, so after a crash in a resumed batch it also holds
        the ids the resume answered before the crash: a toolUseId that had no result at the
        pause and was given twice, with one call done before the crash, is then left with that
        one result, as at an interrupt pause.
        """
        return answered_ids(self.results) if self.interrupts else frozenset()

    def copy(self) -> PendingBatch:
        """Independent copy; blocks and messages are shared (the engine never mutates them)."""
        return PendingBatch(
            assistant_message=self.assistant_message,
            results=dict(self.results),
            interrupts=[Interrupt(i.id, i.name, i.reason, i.response) for i in self.interrupts],
            started=dict(self.started),
        )

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "assistant_message": self.assistant_message,
            "results": self.results,
            "interrupts": [i.to_dict() for i in self.interrupts],
        }
        if self.started:
            # Only while a once tool runs or its outcome is unknown; older layouts stay exact.
            data["started"] = self.started
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PendingBatch:
        return cls(
            assistant_message=data["assistant_message"],
            results=dict(data.get("results") or {}),
            interrupts=[Interrupt.from_dict(i) for i in data.get("interrupts") or []],
            started=dict(data.get("started") or {}),
        )


@dataclass(slots=True)
class Inflight:
    """A running invocation that passed a boundary without pausing (durability marker).

    Committed at every boundary so that, after a crash, the redelivered command continues from
    ``position`` of cycle ``cycle_index`` instead of from the start.
    """

    command_id: str
    position: str
    cycle_index: int
    checkpointing: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "command_id": self.command_id,
            "position": self.position,
            "cycle_index": self.cycle_index,
            "checkpointing": self.checkpointing,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Inflight:
        return cls(
            command_id=data["command_id"],
            position=data["position"],
            cycle_index=int(data["cycle_index"]),
            checkpointing=bool(data.get("checkpointing", False)),
        )


@dataclass(slots=True)
class SessionState:
    session_id: str
    agent: str = ""
    messages: list[Message] = field(default_factory=list)
    agent_state: dict[str, Any] = field(default_factory=dict)
    checkpoint: Checkpoint | None = None
    """The pause issued last; a resume must present exactly this (one-shot)."""
    cycle_index: int = 0
    """The turn's cycle counter (0-based), kept across invocations and interrupt answers."""
    pending: PendingBatch | None = None
    inflight: Inflight | None = None
    turn_metrics: dict[str, Any] = field(default_factory=dict)
    turn_started_at: float | None = None
    """Wall-clock (epoch seconds) start of the current turn, for the turn deadline."""
    schema_version: int = SESSION_STATE_VERSION
    turn_checkpointing: bool | None = None
    """Checkpointing of the current turn, so resumes need not repeat it."""
    turn_limits: dict[str, Any] | None = None
    """Limits of the current turn (``Limits.to_dict`` form), so resumes need not repeat them."""
    context: ContextState | None = None
    """Where the model's view of the history starts, and the summary of what is before it;
    None while the model sees the whole history."""
    names: NameCheck = field(default_factory=NameCheck, compare=False, repr=False)
    """What is known of the history's tool names (kept in memory only)."""

    @property
    def interrupted(self) -> bool:
        return self.pending is not None and bool(self.pending.interrupts)

    def copy(self) -> SessionState:
        return copy.deepcopy(self)

    def snapshot(self) -> SessionState:
        """A copy that shares only what the engine never mutates in place (messages, blocks).

        Much cheaper than :meth:`copy`; what the engine or tools do change in place (agent
        state, pending batch) is copied; turn metrics are only ever replaced, never changed.
        """
        return SessionState(
            session_id=self.session_id,
            agent=self.agent,
            messages=list(self.messages),
            agent_state=clone_json(self.agent_state),
            checkpoint=self.checkpoint,
            cycle_index=self.cycle_index,
            pending=self.pending.copy() if self.pending is not None else None,
            inflight=self.inflight,
            turn_metrics=self.turn_metrics,
            turn_started_at=self.turn_started_at,
            schema_version=self.schema_version,
            turn_checkpointing=self.turn_checkpointing,
            turn_limits=dict(self.turn_limits) if self.turn_limits is not None else None,
            context=(
                ContextState(self.context.start, self.context.summary)
                if self.context is not None
                else None
            ),
            names=self.names,
        )

    def to_dict(self) -> dict[str, Any]:
        data = {
            "schema_version": self.schema_version,
            "session_id": self.session_id,
            "agent": self.agent,
            "messages": self.messages,
            "agent_state": self.agent_state,
            "checkpoint": self.checkpoint.to_dict() if self.checkpoint else None,
            "cycle_index": self.cycle_index,
            "pending": self.pending.to_dict() if self.pending else None,
            "inflight": self.inflight.to_dict() if self.inflight else None,
            "turn_metrics": self.turn_metrics,
            "turn_started_at": self.turn_started_at,
            "turn_checkpointing": self.turn_checkpointing,
            "turn_limits": self.turn_limits,
        }
        if self.context is not None:
            # Only once the view was reduced; states without it keep the earlier layout exactly.
            data["context"] = self.context.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SessionState:
        """Load the current version; older versions go through the upcasters first."""
        checkpoint = data.get("checkpoint")
        pending = data.get("pending")
        inflight = data.get("inflight")
        context = data.get("context")
        return cls(
            schema_version=int(data.get("schema_version", SESSION_STATE_VERSION)),
            session_id=data["session_id"],
            agent=data.get("agent", ""),
            messages=list(data.get("messages") or []),
            agent_state=dict(data.get("agent_state") or {}),
            checkpoint=Checkpoint.from_dict(checkpoint) if checkpoint else None,
            cycle_index=int(data.get("cycle_index", 0)),
            pending=PendingBatch.from_dict(pending) if pending else None,
            inflight=Inflight.from_dict(inflight) if inflight else None,
            turn_metrics=dict(data.get("turn_metrics") or {}),
            turn_started_at=data.get("turn_started_at"),
            turn_checkpointing=data.get("turn_checkpointing"),
            turn_limits=data.get("turn_limits"),
            context=ContextState.from_dict(context) if context else None,
        )
