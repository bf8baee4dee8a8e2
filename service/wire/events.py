"""Progress events on the events topic: coalesced text, tool activity, boundaries, interrupts.

Every event names its session and command and carries ``seq``, increasing by one per session,
so a reader that reconnects can tell what it missed; the final word is always the result.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from service.wire.base import WIRE_SCHEMA_VERSION, Id, OutboundModel, WireVersion
from service.wire.blocks import Message
from service.wire.pauses import Interrupt


class _Event(OutboundModel):
    type: str
    schema_version: WireVersion = WIRE_SCHEMA_VERSION
    session_id: Id
    command_id: Id
    """The command whose invocation produced this event."""
    seq: Annotated[int, Field(ge=0)]
    """Position of this event in its session's event stream."""
    version: Annotated[int, Field(ge=1)] | None = None
    """Cairn extension: the session version of the step this event belongs to (the version
    its boundary or result commits); written only by steps of the engine."""


class TextDeltaEvent(_Event):
    """Model text streamed since the previous event (deltas are coalesced)."""

    type: Literal["text_delta"] = "text_delta"
    text: str


class ModelMessageEvent(_Event):
    """A complete assistant message, as appended to the conversation."""

    type: Literal["model_message"] = "model_message"
    message: Message


class ToolStartedEvent(_Event):
    type: Literal["tool_started"] = "tool_started"
    tool_use_id: Id
    name: str


ToolStatus = Literal["success", "error", "interrupted"]
"""How a started tool ended; a closed set (see ``ToolFinishedEvent.status``)."""


class ToolFinishedEvent(_Event):
    type: Literal["tool_finished"] = "tool_finished"
    tool_use_id: Id
    name: str
    status: ToolStatus
    """Its result block's status, or ``interrupted`` (no result until the interrupt is answered)."""


class CheckpointReachedEvent(_Event):
    """A boundary was made durable; ``paused`` tells whether the invocation stops here."""

    type: Literal["checkpoint_reached"] = "checkpoint_reached"
    position: Literal["after_model", "after_tools"]
    cycle_index: Annotated[int, Field(ge=0)]
    paused: bool


class InterruptRaisedEvent(_Event):
    type: Literal["interrupt_raised"] = "interrupt_raised"
    interrupts: Annotated[list[Interrupt], Field(min_length=1)]


class SessionExpiredEvent(_Event):
    """The session was idle longer than the deployment's ``sessions.idle_ttl_s`` and was
    deleted (as a ``delete`` command would); ``command_id`` is the last command it applied."""

    type: Literal["session_expired"] = "session_expired"
    idle_s: Annotated[float, Field(ge=0)]
    """How long it had been idle."""
    records: Annotated[int, Field(ge=0)]
    """State records tombstoned."""


ProgressEvent = (
    TextDeltaEvent
    | ModelMessageEvent
    | ToolStartedEvent
    | ToolFinishedEvent
    | CheckpointReachedEvent
    | InterruptRaisedEvent
    | SessionExpiredEvent
)

EVENT_TYPES: dict[str, type[ProgressEvent]] = {
    "text_delta": TextDeltaEvent,
    "model_message": ModelMessageEvent,
    "tool_started": ToolStartedEvent,
    "tool_finished": ToolFinishedEvent,
    "checkpoint_reached": CheckpointReachedEvent,
    "interrupt_raised": InterruptRaisedEvent,
    "session_expired": SessionExpiredEvent,
}
