"""The typed events one invocation yields, in order; :class:`Stopped` is always the last.

The loop only reports; the runtime decides what to publish and what to commit. A
:class:`Boundary` is a durability point that does not pause: committing its ``state`` lets a
crashed invocation continue from there.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.agent.state import SessionState
from service.agent.types import AgentResult, Checkpoint, Interrupt, Message


@dataclass(frozen=True, slots=True)
class ModelTextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ModelMessage:
    """The complete assistant message of one model call, already appended to history."""

    message: Message


@dataclass(frozen=True, slots=True)
class ToolStarted:
    tool_use_id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolFinished:
    tool_use_id: str
    name: str
    status: str


@dataclass(frozen=True, slots=True)
class InterruptRaised:
    interrupts: list[Interrupt]


@dataclass(frozen=True, slots=True)
class CheckpointReached:
    """The invocation pauses at this checkpoint; :class:`Stopped` follows immediately."""

    checkpoint: Checkpoint


@dataclass(frozen=True, slots=True)
class Boundary:
    """Passed ``position`` of cycle ``cycle_index`` without pausing; ``state`` is a snapshot."""

    position: str
    cycle_index: int
    state: SessionState


@dataclass(frozen=True, slots=True)
class ToolLedger:
    """The batch's ledger of ``once`` tools changed: one was recorded as started (``durable``:
    it starts only once ``state`` is committed) or got its result (commit it soon, before the
    rest of a long batch). ``state`` is a snapshot whose in-flight marker continues the batch.
    """

    state: SessionState
    durable: bool


@dataclass(frozen=True, slots=True)
class Stopped:
    result: AgentResult
    state: SessionState


Event = (
    ModelTextDelta
    | ModelMessage
    | ToolStarted
    | ToolFinished
    | InterruptRaised
    | CheckpointReached
    | Boundary
    | ToolLedger
    | Stopped
)
