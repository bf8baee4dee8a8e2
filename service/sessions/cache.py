"""The decoded sessions an instance keeps in memory: one byte budget for the stores of all the
partitions it owns.

Guarantees: the sessions held, counted in bytes of their JSON, stay within the budget but for
those whose last write is not committed yet (never evicted: the table does not hold them yet)
and those in use (a command of theirs being handled: one session larger than the whole budget
is decoded once per command, not again at every write and check of its steps); past it, the
least recently used session of any store goes first. A store sees only the
sessions it put there, and a store that is done (its partition revoked or its owner failed)
takes its sessions out at once.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.sessions.store import StoredSession

CACHE_MAX_BYTES = 128 * 1024 * 1024
"""Default budget of decoded sessions held in memory, in bytes of their JSON."""


@dataclass(slots=True)
class _Entry:
    owner: object
    stored: StoredSession
    size: int


class SessionCache:
    """Session id -> decoded session, least recently used first, for every store of an
    instance (a session belongs to one partition, so its id names it across the stores)."""

    def __init__(self, budget: int = CACHE_MAX_BYTES) -> None:
        self.budget = budget
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes: dict[int, int] = {}
        """Bytes held, by the ``id`` of the store that put them."""
        self._in_use: dict[str, int] = {}
        """Sessions not to evict, with how many hold them."""

    def hold(self, session_id: str) -> None:
        """Keep the session, once held, until :meth:`let_go` (calls nest)."""
        self._in_use[session_id] = self._in_use.get(session_id, 0) + 1

    def let_go(self, session_id: str) -> None:
        """One hold less; the last one lets the budget evict the session again, at once."""
        left = self._in_use.get(session_id, 0) - 1
        if left > 0:
            self._in_use[session_id] = left
        else:
            self._in_use.pop(session_id, None)
            self.evict()

    @property
    def total(self) -> int:
        return sum(self._bytes.values())

    def held_by(self, owner: object) -> int:
        return self._bytes.get(id(owner), 0)

    def get(self, owner: object, session_id: str) -> StoredSession | None:
        """The session ``owner`` put here, now the most recently used; else ``None``."""
        entry = self._entries.get(session_id)
        if entry is None or entry.owner is not owner:
            return None
        self._entries.move_to_end(session_id)
        return entry.stored

    def peek(self, owner: object, session_id: str) -> StoredSession | None:
        """As :meth:`get`, leaving the order alone."""
        entry = self._entries.get(session_id)
        return entry.stored if entry is not None and entry.owner is owner else None

    def put(self, owner: object, session_id: str, stored: StoredSession) -> None:
        """Hold ``stored`` as ``owner``'s, most recently used, then evict down to the budget."""
        self._drop(session_id)
        size = stored.size
        self._entries[session_id] = _Entry(owner, stored, size)
        self._bytes[id(owner)] = self._bytes.get(id(owner), 0) + size
        self.evict()

    def forget(self, owner: object, session_id: str) -> None:
        entry = self._entries.get(session_id)
        if entry is not None and entry.owner is owner:
            self._drop(session_id)

    def release(self, owner: object) -> None:
        """Take out every session ``owner`` put here (its store is done)."""
        for session_id in [k for k, entry in self._entries.items() if entry.owner is owner]:
            self._drop(session_id)
        self._bytes.pop(id(owner), None)

    def evict(self) -> None:
        """Evict least recently used sessions whose last write is committed and that are not in
        use until the budget holds (or only those are left)."""
        excess = self.total - self.budget
        if excess <= 0:
            return
        victims = []
        for session_id, entry in self._entries.items():
            if entry.stored.durable and session_id not in self._in_use:
                victims.append(session_id)
                excess -= entry.size
                if excess <= 0:
                    break
        for session_id in victims:
            self._drop(session_id)

    def _drop(self, session_id: str) -> None:
        entry = self._entries.pop(session_id, None)
        if entry is None:
            return
        key = id(entry.owner)
        left = self._bytes[key] - entry.size
        if left:
            self._bytes[key] = left
        else:
            del self._bytes[key]
