"""The one error the wire layer raises, and the error codes an ``error`` result may carry.

Decoding never raises anything but :class:`WireError`; its ``reason`` names the field path and
why it was refused, and it carries the ids it could read so the runtime can answer with an
``error`` result instead of a dead-letter record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

ErrorCode = Literal[
    "invalid_command",
    "unknown_agent",
    "checkpoint_incompatible",
    "checkpoint_stale",
    "checkpointing_disabled",
    "interrupt_pending",
    "no_pending_interrupt",
    "unknown_interrupt",
    "model_error",
    "context_overflow",
    "limit_exceeded",
    "tool_aborted",
    "version_unavailable",
    "session_exists",
    "internal",
]
"""Every code an ``agent_result.error.code`` may hold (the engine's codes plus the runtime's)."""

ERROR_CODES: tuple[str, ...] = get_args(ErrorCode)


@dataclass(frozen=True, slots=True)
class WireIssue:
    """One refused field: ``path`` like ``resume[0].interruptResponse.interruptId``."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class WireError(Exception):
    """A record that cannot be accepted as the message it claims to be.

    ``code`` is the error code for an ``error`` result (``invalid_command`` unless the fault is
    in a checkpoint resume, then ``checkpoint_incompatible``). ``session_id`` and
    ``command_id`` are set when the record held them as non-empty strings.
    """

    def __init__(
        self,
        reason: str,
        *,
        issues: tuple[WireIssue, ...] = (),
        code: ErrorCode = "invalid_command",
        session_id: str | None = None,
        command_id: str | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.issues = issues
        self.code: ErrorCode = code
        self.session_id = session_id
        self.command_id = command_id

    @property
    def answerable(self) -> bool:
        """True when an ``error`` result can be addressed (both ids read); else dead-letter it."""
        return self.session_id is not None and self.command_id is not None

    def __repr__(self) -> str:
        return (
            f"WireError({self.reason!r}, code={self.code!r}, "
            f"session_id={self.session_id!r}, command_id={self.command_id!r})"
        )
