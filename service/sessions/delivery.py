"""What the runtime records about delivering a session's commands, kept beside (never inside) the
engine's conversation state.

The engine knows nothing of these: which commands were answered (so a re-read command is
answered never again), up to which publication time a cancel covers the session's commands, and
when the command an in-flight marker names was published. They travel with the state in the
same head record (and the applied command ids in records of their own), written by the one
session writer. Immutable: a change is a new value, so a stored session is never changed behind
the store's back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

APPLIED_KEPT = 256
"""How many applied command ids a session remembers for de-duplication (oldest dropped)."""
TIME_KEYS = ("cancelled_before_ms", "inflight_published_ms")
"""Record keys written only when set, so sessions that never used them keep their layout."""


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

    def answered(self, command_id: str) -> bool:
        return command_id in self.applied

    def applying(self, *command_ids: str) -> Delivery:
        """These commands answered (each remembered once, the oldest forgotten past the limit)."""
        applied = list(self.applied)
        for command_id in command_ids:
            if command_id not in applied:
                applied.append(command_id)
        return replace(self, applied=tuple(applied[-APPLIED_KEPT:]))

    def finished(self, command_id: str) -> Delivery:
        """The command answered and its turn's in-flight marker (if any) gone."""
        return replace(self.applying(command_id), inflight_published_ms=None)

    def started(self, published_ms: int) -> Delivery:
        """The in-flight marker written now names a command published at ``published_ms``."""
        return replace(self, inflight_published_ms=published_ms)

    def covering(self, timestamp_ms: int) -> Delivery:
        """A cancel published at ``timestamp_ms`` covers the commands published until then
        (a record without a timestamp, -1, covers nothing by time)."""
        if timestamp_ms < 0:
            return self
        previous = self.cancelled_before_ms
        return replace(
            self, cancelled_before_ms=max(timestamp_ms, -1 if previous is None else previous)
        )

    def record_fields(self) -> dict[str, Any]:
        """The keys these take in a session state record."""
        fields: dict[str, Any] = {"applied_commands": list(self.applied)}
        for key in TIME_KEYS:
            value = getattr(self, key)
            if value is not None:
                fields[key] = value
        return fields

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Delivery:
        return cls(
            applied=tuple(data.get("applied_commands") or ()),
            cancelled_before_ms=data.get("cancelled_before_ms"),
            inflight_published_ms=data.get("inflight_published_ms"),
        )
