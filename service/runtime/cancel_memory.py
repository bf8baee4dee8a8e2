"""What a partition's cancel desk remembers beyond the sessions' states: the command ids answered
without a state to record them, and the newest untargeted cancel of each session.

Guarantee: each memory holds at most :data:`REMEMBERED_SESSIONS` entries, the oldest forgotten
first; the ids are kept as 16-byte digests, so the ids' memory stays near 10 MB at its bound
whatever the ids' length.
"""

from __future__ import annotations

import hashlib

REMEMBERED_SESSIONS = 100_000
"""How many sessions' newest untargeted cancel an owner keeps in memory (oldest dropped), and
how many answered command ids of sessions without state (none, or deleted by this owner) it
recognises when a cancel repeats one."""


def _id_key(session_id: str, command_id: str) -> bytes:
    """A session's command id as 16 bytes (ids hold no NUL, so the joined text is unambiguous):
    the ids an owner may remember take about 10 MB so, against 25 MB and more as tuples of the
    ids themselves. Two ids of 100,000 meet with odds of about 1 in 10^28."""
    joined = f"{session_id}\0{command_id}".encode()
    return hashlib.blake2b(joined, digest_size=16).digest()


class AnsweredIds:
    """Command ids answered with no session state to record them, newest kept."""

    def __init__(self, limit: int = REMEMBERED_SESSIONS) -> None:
        self._limit = limit
        self._keys: dict[bytes, None] = {}

    def remember(self, session_id: str, command_id: str) -> None:
        self._keys[_id_key(session_id, command_id)] = None
        if len(self._keys) > self._limit:
            del self._keys[next(iter(self._keys))]

    def knows(self, session_id: str, command_id: str) -> bool:
        return _id_key(session_id, command_id) in self._keys


class Covers:
    """By session, the publication time up to which its newest untargeted cancel (or delete)
    covers its commands."""

    def __init__(self, limit: int = REMEMBERED_SESSIONS) -> None:
        self._limit = limit
        self._until: dict[str, int] = {}

    def cover(self, session_id: str, timestamp_ms: int) -> int:
        """Cover up to ``timestamp_ms`` too; returns what the session is covered up to now."""
        covered = max(self._until.pop(session_id, -1), timestamp_ms)
        self._until[session_id] = covered
        if len(self._until) > self._limit:
            # The oldest cancel is forgotten: its late commands are long overdue by now.
            del self._until[next(iter(self._until))]
        return covered

    def until(self, session_id: str) -> int:
        """Up to when the session's commands are covered (-1: none is)."""
        return self._until.get(session_id, -1)

    def end_at(self, session_id: str, timestamp_ms: int) -> None:
        """A delete covering up to ``timestamp_ms`` is done: what it covered ends with it,
        unless a later cancel covers more."""
        if self._until.get(session_id) == timestamp_ms:
            del self._until[session_id]
