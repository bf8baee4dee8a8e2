"""Plain data of the agent loop: messages, checkpoints, interrupts, results, limits, metrics.

These are the shapes the reference SDK puts on the wire; their ``to_dict`` forms are exact and
stable (clients depend on them). Nothing here does I/O.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from service.agent.errors import CheckpointIncompatibleError

logger = logging.getLogger(__name__)

Message = dict[str, Any]
"""``{"role": "user"|"assistant", "content": [block, ...]}`` (Bedrock Converse shape)."""

ContentBlock = dict[str, Any]
"""A dict with exactly one key: ``text``, ``toolUse``, ``toolResult``, ``image``, ..."""

StopReason = Literal[
    "cancelled",
    "checkpoint",
    "content_filtered",
    "end_turn",
    "guardrail_intervened",
    "interrupt",
    "limit_output_tokens",
    "limit_total_tokens",
    "limit_turns",
    "max_tokens",
    "stop_sequence",
    "tool_use",
    "error",
]
STOP_REASONS: frozenset[str] = frozenset(get_args(StopReason))

CheckpointPosition = Literal["after_model", "after_tools"]
CHECKPOINT_SCHEMA_VERSION = "1.0"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Pause-point marker; carries a position only, never conversation state."""

    position: CheckpointPosition
    cycle_index: int
    schema_version: str = CHECKPOINT_SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "cycle_index": self.cycle_index,
            "schema_version": self.schema_version,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Checkpoint:
        """Parse the serialized form; anything but an exact ``"1.0"`` version is incompatible."""
        if not isinstance(data, dict):
            raise CheckpointIncompatibleError("checkpoint must be an object")
        version = data.get("schema_version")
        if not isinstance(version, str) or version != CHECKPOINT_SCHEMA_VERSION:
            raise CheckpointIncompatibleError(
                f"checkpoint schema_version {version!r} is not {CHECKPOINT_SCHEMA_VERSION!r}"
            )
        position = data.get("position")
        if position not in ("after_model", "after_tools"):
            raise CheckpointIncompatibleError(f"checkpoint position {position!r} is not valid")
        index = data.get("cycle_index")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise CheckpointIncompatibleError(
                f"checkpoint cycle_index {index!r} is not a non-negative integer"
            )
        unknown = set(data) - {"position", "cycle_index", "schema_version"}
        if unknown:
            logger.warning("keys=<%s> | ignoring unknown checkpoint keys", sorted(unknown))
        return cls(position=position, cycle_index=index)


@dataclass(slots=True)
class Interrupt:
    """A human-in-the-loop question raised by a tool or a hook; ``response`` is the answer."""

    id: str
    name: str
    reason: Any = None
    response: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "reason": self.reason, "response": self.response}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Interrupt:
        return cls(
            id=data["id"],
            name=data["name"],
            reason=data.get("reason"),
            response=data.get("response"),
        )


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds of one turn, counted across all its invocations (paused ones included)."""

    max_cycles: int | None = None
    max_tokens: int | None = None
    deadline_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_cycles": self.max_cycles,
            "max_tokens": self.max_tokens,
            "deadline_s": self.deadline_s,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Limits:
        if not data:
            return cls()
        return cls(
            max_cycles=data.get("max_cycles"),
            max_tokens=data.get("max_tokens"),
            deadline_s=data.get("deadline_s"),
        )


@dataclass(slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def add(self, other: Usage) -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens

    def to_dict(self) -> dict[str, int]:
        return {
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
            "totalTokens": self.total_tokens,
        }


@dataclass(slots=True)
class ErrorInfo:
    """Why a command was rejected or failed; ``code`` is one of the documented error codes."""

    code: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


@dataclass(slots=True)
class AgentResult:
    """Outcome of one invocation.

    ``to_dict`` has the reference's fields (``type``, ``message``, ``stop_reason``,
    ``checkpoint``) plus ours (``interrupts``, ``metrics``, ``state``, ``error``).
    """

    stop_reason: StopReason
    message: Message | None
    checkpoint: Checkpoint | None = None
    interrupts: list[Interrupt] | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    error: ErrorInfo | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "agent_result",
            "message": self.message,
            "stop_reason": self.stop_reason,
            "checkpoint": self.checkpoint.to_dict() if self.checkpoint else None,
            "interrupts": [i.to_dict() for i in self.interrupts] if self.interrupts else None,
            "metrics": self.metrics,
            "state": self.state,
            "error": self.error.to_dict() if self.error else None,
        }
