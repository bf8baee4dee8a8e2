"""Where a session is paused, as the client resumes it: at a checkpoint or at interrupts.

Guarantee: the pause comes from the session's committed state (the sessions topic, what
``cairn session show`` prints), never from its last result alone: a refused command's ``error``
result leaves the pause before it in force, and the client still finds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.agent.outcomes import OUTCOME_UNKNOWN, answer_problem, is_outcome_interrupt
from service.client import commands
from service.client.kafka_io import ClientError
from service.wire.commands import ResumeCommand

OUTCOME_FLAGS = "--supply-result JSON, --retry or --fail MSG"


@dataclass(frozen=True, slots=True)
class PendingInterrupt:
    id: str
    name: str
    reason: Any = None


@dataclass(frozen=True, slots=True)
class Pause:
    """A session's committed pause point; ``committed`` is False when it has no state yet."""

    session_id: str
    committed: bool = False
    checkpoint: dict[str, Any] | None = None
    interrupts: tuple[PendingInterrupt, ...] = ()
    running: str | None = None
    """The command the session is running past a boundary (not paused), if any."""

    @property
    def interrupt_ids(self) -> tuple[str, ...]:
        return tuple(i.id for i in self.interrupts)

    @property
    def outcome_ids(self) -> tuple[str, ...]:
        """The pending ``tool_outcome_unknown`` interrupts (by id, as the engine tells them)."""
        return tuple(i for i in self.interrupt_ids if is_outcome_interrupt(i))

    @classmethod
    def of(cls, session_id: str, state: dict[str, Any] | None) -> Pause:
        """The pause recorded in a session state (``SessionState.to_dict`` form, or None)."""
        if state is None:
            return cls(session_id)
        pending = state.get("pending") or {}
        inflight = state.get("inflight") or {}
        return cls(
            session_id,
            committed=True,
            checkpoint=state.get("checkpoint") or None,
            # Answered interrupts stay in the state until their batch completes; only those
            # still without an answer are pending, as the result listed them.
            interrupts=tuple(
                PendingInterrupt(str(i.get("id")), str(i.get("name")), i.get("reason"))
                for i in pending.get("interrupts") or []
                if i.get("response") is None
            ),
            running=str(inflight["command_id"]) if inflight.get("command_id") else None,
        )

    def describe(self) -> str:
        """What the session is doing, for a message that explains a refusal."""
        if not self.committed:
            return "it has no committed state yet"
        if self.interrupt_ids:
            return f"it waits for answers to interrupts {list(self.interrupt_ids)}"
        if self.checkpoint:
            return (
                f"it is paused at checkpoint {self.checkpoint.get('position')} "
                f"(cycle {self.checkpoint.get('cycle_index')})"
            )
        if self.running:
            return f"it is running command {self.running}"
        return "it is idle or finished"

    def resume(self, command_id: str | None) -> ResumeCommand:
        """A resume from the pending checkpoint; refused unless one is pending."""
        if self.interrupt_ids:
            how = "--answer ID=JSON"
            if self.outcome_ids:
                how = (
                    OUTCOME_FLAGS
                    if self.outcome_ids == self.interrupt_ids
                    else f"--answer ID=JSON, or {OUTCOME_FLAGS} for {OUTCOME_UNKNOWN}"
                )
            raise ClientError(
                f"session {self.session_id!r} waits for answers to interrupts "
                f"{list(self.interrupt_ids)}: use {how}"
            )
        if not self.checkpoint:
            raise ClientError(
                f"session {self.session_id!r} is not paused at a checkpoint: {self.describe()}"
            )
        return commands.resume_from_checkpoint(
            self.session_id, self.checkpoint, command_id=command_id
        )

    def answer(self, answers: Sequence[str], command_id: str | None) -> ResumeCommand:
        """Answers to the pending interrupts; refused unless each names one of them."""
        if not self.interrupt_ids:
            raise ClientError(
                f"session {self.session_id!r} has no pending interrupt to answer: {self.describe()}"
            )
        parsed = commands.parse_answers(answers, self.interrupt_ids)
        for interrupt_id, response in parsed.items():
            # The engine would refuse the whole resume for it (invalid_command): say so now.
            problem = answer_problem(response) if is_outcome_interrupt(interrupt_id) else None
            if problem is not None:
                raise commands.CommandInputError(
                    f"answer for {interrupt_id!r} is not an answer to {OUTCOME_UNKNOWN}: "
                    f"{problem} (use {OUTCOME_FLAGS})"
                )
        return commands.resume_with_answers(self.session_id, parsed, command_id=command_id)

    def answer_outcome(
        self, answer: dict[str, Any], interrupt_id: str | None, command_id: str | None
    ) -> ResumeCommand:
        """``answer`` to one pending ``tool_outcome_unknown`` interrupt: ``interrupt_id``, or
        the only one pending; refused unless it is pending."""
        pending = list(self.outcome_ids)
        if not pending:
            raise ClientError(
                f"session {self.session_id!r} has no pending {OUTCOME_UNKNOWN} interrupt to "
                f"answer: {self.describe()}"
            )
        if interrupt_id is None:
            if len(pending) > 1:
                raise ClientError(
                    f"session {self.session_id!r} has {len(pending)} pending {OUTCOME_UNKNOWN} "
                    f"interrupts: pick one with --interrupt ID: {pending}"
                )
            interrupt_id = pending[0]
        elif interrupt_id not in pending:
            raise ClientError(
                f"interrupt {interrupt_id!r} is not a pending {OUTCOME_UNKNOWN} interrupt of "
                f"session {self.session_id!r}; pending: {pending}"
            )
        return commands.resume_with_answers(
            self.session_id, {interrupt_id: answer}, command_id=command_id
        )
