"""Every error the engine reports, in one place, each with its documented wire ``code``.

An :class:`EngineError` raised by the engine before it yields its first event means the input
was rejected and nothing changed: no message appended, no state written, no hook fired.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base of the documented rejections; ``code`` is what an ``error`` result carries."""

    code = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInputError(EngineError):
    """The input has none of the accepted shapes (prompt, checkpoint resume, interrupt answers)."""

    code = "invalid_command"


class CheckpointIncompatibleError(EngineError):
    """Malformed checkpoint resume payload or a ``schema_version`` other than ``"1.0"``."""

    code = "checkpoint_incompatible"


class CheckpointStaleError(EngineError):
    """The checkpoint is not the pause the session issued last (stale, replayed, other turn)."""

    code = "checkpoint_stale"


class CheckpointingDisabledError(EngineError):
    """A checkpoint resume reached an agent or invocation with checkpointing off."""

    code = "checkpointing_disabled"


class InterruptPendingError(EngineError):
    """An interrupt is pending: only interrupt answers are accepted."""

    code = "interrupt_pending"


class NoPendingInterruptError(EngineError):
    """Interrupt answers arrived while no interrupt is pending."""

    code = "no_pending_interrupt"


class UnknownInterruptError(EngineError):
    """An answer names an interrupt id that is not pending; the whole answer is rejected."""

    code = "unknown_interrupt"


class UnknownAgentError(EngineError):
    code = "unknown_agent"


class VersionUnavailableError(EngineError):
    """A fork's source version is not kept: never reached, compacted away or deleted."""

    code = "version_unavailable"


class SessionExistsError(EngineError):
    """A fork's target session already exists."""

    code = "session_exists"


class ModelError(EngineError):
    """The model provider failed; ``retryable`` says whether the provider may try again."""

    code = "model_error"

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class ContextOverflowError(ModelError):
    """The model refused the request because its context window is exceeded.

    Providers raise it for their own overflow shape; the engine reduces the context by the
    agent's strategy and retries, and reports this code when nothing more can be reduced.
    """

    code = "context_overflow"


class ToolAbortedError(EngineError):
    """A tool raised ``KeyboardInterrupt`` or ``SystemExit``, which ends its invocation (never
    the process): the loop reports it with this code (:mod:`service.agent.aborts`)."""

    code = "tool_aborted"


class LimitExceededError(EngineError):
    code = "limit_exceeded"


class ScriptExhaustedError(AssertionError):
    """The scripted model was asked for more replies than its script holds (a test bug)."""


class UnstorableError(ValueError):
    """A value the session state cannot hold (its codec cannot encode it); never leaves the engine.

    The engine turns it into the tool's error result or reverts the write that made it.
    """
