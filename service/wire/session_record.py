"""The session-state record of the compacted sessions topic, as ``codec.record_dict`` writes it.

This model is the published contract of that JSON; the bytes on the topic are produced and
upcast by :mod:`service.sessions.codec`, which stays the only reader Cairn uses at run time.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from service.wire.base import Id, JsonObject, OutboundModel, PartModel
from service.wire.blocks import Message, WrittenBlock
from service.wire.pauses import Checkpoint, Interrupt

SessionVersion = Literal[2]
"""Session-state versions this build writes; older ones are upcast by the sessions codec."""


class ToolStart(PartModel):
    """When and where a ``once`` tool was started."""

    at: float
    """Epoch seconds."""
    instance: str
    """The instance that ran it (host and process)."""


class PendingBatch(PartModel):
    """A tool batch without its results message yet; ``interrupts`` non-empty while waiting."""

    assistant_message: Message
    results: dict[str, WrittenBlock]
    """Completed toolResult blocks by toolUseId."""
    interrupts: list[Interrupt]
    started: dict[str, ToolStart] | None = None
    """``once`` tools started and without a result yet, by toolUseId; absent when none."""

    @model_serializer(mode="wrap")
    def _omit_no_started(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not data.get("started"):
            data.pop("started", None)
        return data


class Inflight(PartModel):
    """A running invocation's last durable boundary (crash recovery marker)."""

    command_id: Id
    position: Literal["after_model", "after_tools"]
    cycle_index: Annotated[int, Field(ge=0)]
    checkpointing: bool


class TurnLimits(PartModel):
    max_cycles: int | None
    max_tokens: int | None
    deadline_s: float | None


class ContextView(PartModel):
    """Where the model's view of the history starts (the agent's context policy decides)."""

    start: Annotated[int, Field(ge=0)]
    """Index of the first message of ``messages`` the model sees."""
    summary: list[WrittenBlock] | None
    """The summary that replaces, in the model's view, the messages before ``start`` (the
    content of a user message); null when they are only left out."""


class SessionStateRecord(OutboundModel):
    """Everything a fresh process needs to continue a session exactly: the engine's state and,
    beside it, the runtime's delivery records (``applied_commands``, ``answered_through``,
    ``answered_log``, ``cancelled_before_ms``, ``inflight_published_ms``, ``cancel_targets``).

    Unknown fields are refused: the state has one writer, and an older layout is upcast by
    the sessions codec before it is read, never read loosely.
    """

    model_config = ConfigDict(extra="forbid")

    schema_version: SessionVersion
    session_id: Id
    agent: str
    messages: list[Message]
    agent_state: JsonObject
    checkpoint: Checkpoint | None
    """The pause issued last; a resume must present exactly this one."""
    cycle_index: Annotated[int, Field(ge=0)]
    pending: PendingBatch | None
    inflight: Inflight | None
    turn_metrics: JsonObject
    turn_started_at: float | None
    """Wall-clock start of the current turn (epoch seconds), for the turn deadline."""
    applied_commands: list[Id]
    """Ids of commands already applied (newest last), so a redelivery is answered once."""
    turn_checkpointing: bool | None
    """Checkpointing of the current turn, so resumes need not repeat it."""
    turn_limits: TurnLimits | None
    """Limits of the current turn, so resumes need not repeat them."""
    answered_through: Annotated[list[int], Field(min_length=2, max_length=2)] | None = None
    """Offset and publication time (ms) of the newest record of the commands topic the session
    answered: one read again at or before it (and published no later) was answered; absent
    until the session answers a command of that topic."""
    answered_log: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    """The log ``answered_through``'s offset counts in: the commands topic's id (as Kafka's
    tools print it) and the partition, ``<topic id>:<partition>``. A record of another log (a
    topic deleted and created again) is never taken for answered by its offset. Absent when
    the broker gave no topic id."""
    cancelled_before_ms: Annotated[int, Field(ge=0)] | None = None
    """Publication time (record timestamp, ms) up to which a cancel covers the session's
    commands; absent when no cancel was applied."""
    inflight_published_ms: Annotated[int, Field(ge=0)] | None = None
    """Publication time of the command ``inflight`` names; absent when unknown."""
    cancel_targets: list[Id] | None = None
    """Ids a targeted cancel named before the session read them, answered ``cancelled`` when it
    does; absent when none waits."""
    context: ContextView | None = None
    """What of the history the model sees; absent while it sees all of it."""

    @model_serializer(mode="wrap")
    def _omit_unset_optionals(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Written only when set, as Delivery.record_fields does, so older layouts stay exact.
        data: dict[str, Any] = handler(self)
        optional = (
            "answered_through",
            "answered_log",
            "cancelled_before_ms",
            "inflight_published_ms",
        )
        for key in (*optional, "cancel_targets", "context"):
            if data.get(key) is None:
                data.pop(key, None)
        return data
