"""Plain data passed between the consumer loop, the session queues and the committer.

An :class:`Outcome` is the unit of atomicity: its records, its session state and the input
offsets it finishes are committed in the same transaction or not at all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from service.agent.cancel import CancelSignal
from service.agent.tracing import NO_SPAN, Span
from service.sessions.delivery import Position
from service.sessions.writer import StateWrite
from service.wire.commands import CancelCommand
from service.wire.errors import WireError

if TYPE_CHECKING:
    from service.runtime.records import ParsedCommand

__all__ = ["CommandWork", "InputRecord", "Origin", "OutRecord", "Outcome", "StateWrite"]


Header = tuple[str, bytes | None]
"""A record header: Kafka allows one without a value."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Where an input record came from (what its finishing moves forward)."""

    topic: str
    partition: int
    offset: int


@dataclass(slots=True)
class InputRecord:
    """A fetched record as the runtime keeps it (decoupled from aiokafka's record type)."""

    origin: Origin
    key: bytes | None
    value: bytes | None
    headers: list[Header]
    """As the producer set them: Kafka allows a header without a value (``None``)."""
    timestamp_ms: int
    unreadable: str | None = None
    """Why the consumer could not read the record at this offset (``unreadable.py``): then it
    has no key, value or headers, and is dead-lettered with this reason."""
    log: str | None = None
    """The log its offset counts in, for a record of the commands topic: the topic's id and the
    partition (``<topic id>:<partition>``), set by the partition's owner; ``None`` when the
    broker gives no topic ids."""


def commands_position(record: InputRecord, commands_topic: str) -> Position | None:
    """Where a record of the commands topic stands, for the session state that answers it to
    remember; ``None`` for a record of another topic or one without a publication time."""
    if record.origin.topic != commands_topic or record.timestamp_ms < 0:
        return None
    return (record.origin.offset, record.timestamp_ms, record.log)


@dataclass(slots=True)
class CommandWork:
    """A record waiting in its session's queue: its decoded command, or why it did not decode."""

    record: InputRecord
    session_id: str
    command: ParsedCommand | CancelCommand | None
    """An invoke, resume or delete of the commands topic, a cancel of the control topic, or
    ``None`` when decoding failed (see ``error``)."""
    error: WireError | None = None
    """Why the record did not decode, when it still named its session (and its id, if read)."""
    foreign: bool = False
    """The session belongs to another partition: refused here, its state neither read nor
    written (its partition's owner holds it)."""
    cancel: CancelSignal | None = None
    """The invocation's cancel signal, set just before it runs."""
    trace: list[tuple[str, bytes]] | None = None
    """Trace-context headers of the command's span, put on every result and event it causes."""
    span: Span = NO_SPAN
    """The command's span while it is handled, for its agent, stop reason and error."""

    @property
    def command_id(self) -> str | None:
        """The command's id, also when it did not decode but its id could be read."""
        if self.command is not None:
            return self.command.command_id
        return self.error.command_id if self.error is not None else None

    @property
    def command_type(self) -> str:
        """The command's type as the metrics count it (``other`` when it did not decode)."""
        return self.command.type if self.command is not None else "other"


@dataclass(slots=True)
class OutRecord:
    """A record to write. Never changed once made; not frozen, as a frozen dataclass's
    ``__init__`` costs two and a half times as much, and a step makes five or more of these."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Sequence[Header] = field(default_factory=list)
    partition: int | None = None


@dataclass(slots=True)
class Outcome:
    records: list[OutRecord] = field(default_factory=list)
    state: StateWrite | None = None
    finished: list[Origin] = field(default_factory=list)
    results: int = 0
    """How many of ``records`` are results (for the committed-steps count)."""
    replay_unsafe: bool = False
    """Its input offsets must be committed with it: a redelivery would not be recognised (no
    session state records it), e.g. a dead letter or an answer to a session-less command."""
    fallback: Callable[[BaseException], Outcome | None] | None = None
    """Builds what is written instead when the broker refuses this outcome for good (a record
    too large for its topic, say): typically a dead letter of the command and a small error
    result. Without one, such an outcome is dropped (its input offsets still move on)."""
    unwritten: BaseException | None = None
    """Set by the committer when this outcome was refused and replaced (or dropped)."""
    counted: Callable[[], None] | None = None
    """What it adds to the metrics, called once it is committed: an outcome the broker refused
    counts nothing (what replaced it counts for itself), and one redone after a failed commit
    counts once."""
