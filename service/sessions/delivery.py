"""What the runtime records about delivering a session's commands, kept beside (never inside) the
engine's conversation state.

The engine knows nothing of these: which commands were answered (so a re-read command is
answered never again), the position on the commands topic of the newest one answered (which
recognises a re-read command even past the ids kept), up to which publication time a cancel
covers the session's commands, which commands a targeted cancel named before they were read, and
when the command an in-flight marker names was published.
They travel with the state in the same head record (and the applied command ids in records of
their own), written by the one session writer. Immutable: a change is a new value, so a stored
session is never changed behind the store's back.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, field, replace
from typing import Any

APPLIED_KEPT = 256
"""How many applied command ids a session remembers for de-duplication (oldest dropped)."""
TIME_KEYS = ("cancelled_before_ms", "inflight_published_ms")
"""Record keys written only when set, so sessions that never used them keep their layout."""

Position = tuple[int, int, str | None]
"""Where a record of the commands topic stands: its offset, its publication time (ms) and the
log the offset counts in (``<topic id>:<partition>``; ``None`` when the broker gives no ids)."""


@dataclass(frozen=True, slots=True)
class Delivery:
    applied: tuple[str, ...] = ()
    """Ids of the commands answered, oldest first (the newest ``APPLIED_KEPT``)."""
    cancelled_before_ms: int | None = None
    """Publication time (record timestamp, ms) up to which a cancel covers this session's
    commands: one published no later is answered ``cancelled`` whenever it is first read."""
    inflight_published_ms: int | None = None
    """Publication time of the command the session's in-flight marker names, so a cancel
    resolves that marker only when it covers that command."""
    answered_through: tuple[int, int] | None = None
    """(Offset, publication time in ms) of the newest record of the commands topic the session
    answered. A session's commands are answered in the order of its partition, so one read
    again at or before that offset in the same log was answered, however many ids were answered
    since."""
    answered_log: str | None = None
    """The log ``answered_through``'s offset counts in (``<topic id>:<partition>``): a topic
    deleted and created again has another id, and its offsets start again. ``None`` when it is
    not known (a broker without topic ids, a state written before the log was recorded): then
    the publication time tells a topic created anew, whose records are published later."""
    targets: tuple[str, ...] = ()
    """Ids a targeted cancel named before the session read them (the newest ``APPLIED_KEPT``):
    each is answered ``cancelled`` unrun if the session reads it, and never before, since a
    target not read yet may be a command of another session, answered there."""

    _index: Set[str] | None = field(default=None, init=False, repr=False, compare=False)
    """``applied`` as a set, made on first use and handed on to the values made from this one:
    whether a command was answered takes a time that does not grow with the ids kept (adding
    one copies the set, a few times cheaper than the scans of the list it saves)."""

    def answered(self, command_id: str) -> bool:
        return command_id in self.ids()

    def read_before(self, offset: int, published_ms: int, log: str | None = None) -> bool:
        """The commands record at ``offset`` of ``log``, published at ``published_ms``, was
        answered: it is at or before the newest one answered, in the same log. When either log
        is unknown, a record published after the newest one answered is taken for one of a
        topic created anew (a producer whose clock runs ahead is recognised by its id only)."""
        through = self.answered_through
        if through is None or offset > through[0]:
            return False
        if log is not None and self.answered_log is not None:
            return log == self.answered_log
        return 0 <= published_ms <= through[1]

    def through(self, position: Position | None) -> Delivery:
        """The commands record at ``position`` answered now; ``None`` (a record of another
        topic, or one without a time) changes nothing."""
        if position is None:
            return self
        offset, published_ms, log = position
        made = replace(self, answered_through=(offset, published_ms), answered_log=log)
        object.__setattr__(made, "_index", self._index)
        return made

    def through_in(self, log: str | None) -> int | None:
        """The offset of the newest command answered when it counts in ``log`` (or either log is
        unknown); ``None`` when none was answered or it was in another log."""
        through = self.answered_through
        if through is None:
            return None
        if log is not None and self.answered_log is not None and log != self.answered_log:
            return None
        return through[0]

    def applying(self, *command_ids: str) -> Delivery:
        """These commands answered (each remembered once, the oldest forgotten past the limit)."""
        applied, index = self._adding(command_ids)
        if applied is self.applied:
            return self
        return self._made(applied, self.cancelled_before_ms, self.inflight_published_ms, index)

    def finished(self, command_id: str) -> Delivery:
        """The command answered and its turn's in-flight marker (if any) gone."""
        applied, index = self._adding((command_id,))
        return self._made(applied, self.cancelled_before_ms, None, index)

    def started(self, published_ms: int) -> Delivery:
        """The in-flight marker written now names a command published at ``published_ms``."""
        return self._made(self.applied, self.cancelled_before_ms, published_ms, self._index)

    def ids(self) -> Set[str]:
        """The applied ids as a set (not to be changed)."""
        index = self._index
        if index is None:
            index = set(self.applied)
            object.__setattr__(self, "_index", index)
        return index

    def _adding(self, command_ids: tuple[str, ...]) -> tuple[tuple[str, ...], Set[str] | None]:
        """The applied ids with ``command_ids`` added, and their set (``None``: made when
        asked); ``self.applied`` itself when all of them are there already."""
        known = self.ids()
        if len(command_ids) == 1:
            added: tuple[str, ...] = () if command_ids[0] in known else command_ids
        else:
            added = tuple(c for c in dict.fromkeys(command_ids) if c not in known)
        if not added:
            return self.applied, known
        applied = self.applied + added
        cut = max(0, len(applied) - APPLIED_KEPT)
        if len(known) != len(self.applied):
            return applied[cut:], None  # an id held twice: the set is made afresh
        index = set(known)
        index.update(added)
        index.difference_update(applied[:cut])
        return applied[cut:], index

    def _made(
        self,
        applied: tuple[str, ...],
        cancelled_before_ms: int | None,
        inflight_published_ms: int | None,
        index: Set[str] | None,
    ) -> Delivery:
        targets = self.targets
        if targets:
            # An answered command is no longer waited for.
            known = index if index is not None else set(applied)
            targets = tuple(t for t in targets if t not in known)
        made = Delivery(
            applied,
            cancelled_before_ms,
            inflight_published_ms,
            self.answered_through,
            self.answered_log,
            targets,
        )
        object.__setattr__(made, "_index", index)
        return made

    def covering(self, timestamp_ms: int) -> Delivery:
        """A cancel published at ``timestamp_ms`` covers the commands published until then
        (a record without a timestamp, -1, covers nothing by time)."""
        if timestamp_ms < 0:
            return self
        previous = self.cancelled_before_ms
        latest = max(timestamp_ms, -1 if previous is None else previous)
        return self._made(self.applied, latest, self.inflight_published_ms, self._index)

    def targeting(self, command_id: str) -> Delivery:
        """A targeted cancel named ``command_id`` before the session read it."""
        if command_id in self.targets:
            return self
        made = replace(self, targets=(*self.targets, command_id)[-APPLIED_KEPT:])
        object.__setattr__(made, "_index", self._index)
        return made

    def record_fields(self) -> dict[str, Any]:
        """The keys these take in a session state record."""
        fields: dict[str, Any] = {"applied_commands": list(self.applied)}
        for key in TIME_KEYS:
            value = getattr(self, key)
            if value is not None:
                fields[key] = value
        if self.answered_through is not None:
            fields["answered_through"] = list(self.answered_through)
            if self.answered_log is not None:
                fields["answered_log"] = self.answered_log
        if self.targets:
            fields["cancel_targets"] = list(self.targets)
        return fields

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Delivery:
        return cls(
            applied=tuple(data.get("applied_commands") or ()),
            cancelled_before_ms=data.get("cancelled_before_ms"),
            inflight_published_ms=data.get("inflight_published_ms"),
            answered_through=_position(data.get("answered_through")),
            answered_log=data.get("answered_log"),
            targets=tuple(data.get("cancel_targets") or ()),
        )


def _position(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    offset, published_ms = value
    if not isinstance(offset, int) or not isinstance(published_ms, int):
        raise TypeError(f"answered_through must be two integers, not {value!r}")
    return (offset, published_ms)
