"""The session store of one partition: a local table of the sessions changelog, and the decoded
sessions it holds in the instance's cache (:mod:`service.sessions.cache`, one byte budget for
every partition the instance owns).

The changelog is the truth; the table (on disk in production) may be wiped and rebuilt from it
at any time. Writes reach the table only once their transaction committed (:meth:`committed`),
and then in batches of the commits of up to :data:`FLUSH_EVERY_S` (:meth:`flush`); until its
records are in the table the written session stays in the cache, which never evicts it.
Everything else is evicted least recently used first once the cache holds more than its budget.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from service.agent.state import SessionState
from service.agent.types import ContentBlock, Message
from service.sessions import history
from service.sessions.cache import CACHE_MAX_BYTES, SessionCache
from service.sessions.codec import Loaded, decode_delivery, decode_session
from service.sessions.delivery import Delivery
from service.sessions.table import MemoryTable, Row, Table

EVENT_SEQ_HEADER = "cairn-event-seq"
"""Header of a head record: the session's last event ``seq`` (kept beside the state itself)."""

FLUSH_EVERY_S = 0.05
"""Committed records wait this long at most before they go into the table, in one write: a
session rewritten meanwhile is written once, and the table's pages each once per write
instead of once per commit (docs/runtime.md, "The local store's write"). Longer gains little
more, and the write stalls the event loop for longer."""

FLUSH_ROWS = 2048
"""Or until this many are waiting."""

DECODE_OFF_LOOP_BYTES = 2 * 1024 * 1024
"""A session whose records hold at least this many bytes is decoded in a thread by
:meth:`SessionStore.prefetch` (about 20 ms of decoding on the event loop; docs/runtime.md, "A large
session's decode")."""


@dataclass(slots=True)
class StoredSession:
    """A session as the store knows it: its state, its delivery records and the last event
    sequence number used."""

    state: SessionState
    event_seq: int = 0
    delivery: Delivery = field(default_factory=Delivery)
    history: list[Message] = field(default_factory=list)
    """The messages as stored in history records, by reference: a write stores only those of
    ``state.messages`` that are not these very objects. Never changed in place (the engine
    works on copies of a state's message list)."""
    results: list[tuple[str, ContentBlock]] = field(default_factory=list)
    """The open batch's results as stored in result slots, in slot order."""
    applied: list[str] = field(default_factory=list)
    """The applied command ids as stored in their slots (oldest first)."""
    applied_count: int = 0
    """Command ids applied over the session's life (the next one goes to this slot mod 256)."""
    sizes: Sequence[int] = ()
    """JSON bytes of each message of ``history`` (never changed in place)."""
    history_bytes: int = 0
    """Their sum."""
    head_size: int = 0
    versions: list[dict[str, Any]] = field(default_factory=list)
    """The entries of the versions kept, oldest first (:mod:`service.sessions.versions`)."""
    version: int = 0
    """Bumped by every write; the committer reports the version it made durable."""
    durable: bool = True
    """The last write is committed (a session not yet durable is never evicted)."""

    @property
    def exists(self) -> bool:
        """It has a conversation or a version: a state that only remembers command ids (those a
        refusal or a targeted cancel answered) is no session yet."""
        return bool(self.versions or self.state.messages)

    @property
    def last_version(self) -> int | None:
        """The session's newest version (``None`` before its first step)."""
        return int(self.versions[-1]["version"]) if self.versions else None

    @property
    def size(self) -> int:
        """Bytes of JSON of the session (what the cache budget counts)."""
        return self.head_size + self.history_bytes


class SessionStore:
    """Session id -> latest state: read from the table, updated by each write and commit."""

    def __init__(
        self,
        table: Table | None = None,
        *,
        cache: SessionCache | None = None,
        cache_max_bytes: int = CACHE_MAX_BYTES,
    ) -> None:
        """``cache`` is the instance's, shared with its other partitions' stores; without one
        the store has a cache of its own of ``cache_max_bytes``."""
        self.table: Table = table if table is not None else MemoryTable()
        self._cache = cache if cache is not None else SessionCache(cache_max_bytes)
        self._versions = 0
        self._deleted: dict[str, int] = {}
        self._pending: list[Row] = []
        self._pending_position = 0
        self._pending_versions: dict[str, int] = {}
        self._flushed_at = time.monotonic()

    def load(
        self,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]],
        timestamp_ms: int = 0,
    ) -> None:
        """Apply one changelog record in log order (a ``None`` value deletes)."""
        if key is None:
            return
        self.flush()
        self._forget(history.head_key_of(key).decode("utf-8", "replace"))
        row = (key, value, event_seq_of(headers), timestamp_ms)
        self.table.apply([row], self.table.position)

    def get(self, session_id: str) -> StoredSession | None:
        cached = self._cache.get(self, session_id)
        if cached is not None:
            return cached
        if session_id in self._deleted:
            return None
        read = self._read(session_id)
        if read is None:
            return None
        head, seq, records = read
        return self._decoded(session_id, seq, decode_session(head, records))

    async def prefetch(self, session_id: str) -> None:
        """Decode a large session (:data:`DECODE_OFF_LOOP_BYTES`) in a thread into the cache,
        so the :meth:`get` calls that follow find it there instead of stalling the event loop.

        What the thread decoded is kept only if nothing changed the session meanwhile (no write
        or deletion here, the same head in the table); otherwise the next :meth:`get` decodes
        it as it always did. A smaller one is decoded at once, as :meth:`get` would.
        """
        if session_id in self._deleted or self._cache.peek(self, session_id) is not None:
            return
        read = self._read(session_id)
        if read is None:
            return
        head, seq, records = read
        if len(head) + sum(len(value) for value in records.values()) < DECODE_OFF_LOOP_BYTES:
            # Decoded here, as get() would, so the table is not read twice.
            self._decoded(session_id, seq, decode_session(head, records))
            return
        version = self._versions
        loaded = await asyncio.to_thread(decode_session, head, records)
        if (
            version != self._versions
            or session_id in self._deleted
            or self._cache.peek(self, session_id) is not None
            or self.table.get(session_id.encode()) != (head, seq)
        ):
            return
        self._decoded(session_id, seq, loaded)

    def delivery(self, session_id: str) -> Delivery | None:
        """The session's delivery records (the commands it answered), ``None`` without a
        session. One not in the cache is not decoded whole: only its head and applied command
        ids are read, so a cancel or a delete checked as it is read (on the event loop, before
        its turn prefetches the session) costs the same for a session of any size."""
        done = self.done(session_id)
        return None if done is None else done[1]

    def done(self, session_id: str) -> tuple[int, Delivery] | None:
        """The session's last event sequence number and its delivery records, ``None`` without
        a session; read as :meth:`delivery` reads, without decoding its conversation."""
        cached = self._cache.peek(self, session_id)
        if cached is not None:
            return cached.event_seq, cached.delivery
        if session_id in self._deleted:
            return None
        found = self.table.get(session_id.encode())
        if found is None:
            return None
        head, seq = found
        applied = self.table.scan(history.prefix(session_id) + history.APPLIED)
        return seq, decode_delivery(head, dict(applied))

    def _read(self, session_id: str) -> tuple[bytes, int, dict[bytes, bytes]] | None:
        """The session's head, event seq and history records as the table holds them."""
        found = self.table.get(session_id.encode())
        if found is None:
            return None
        head, seq = found
        mine = history.prefix(session_id)
        records: dict[bytes, bytes] = {}
        for kind in history.LOADED:
            records.update(self.table.scan(mine + kind))
        return head, seq, records

    def _decoded(self, session_id: str, seq: int, loaded: Loaded) -> StoredSession:
        stored = StoredSession(
            state=loaded.state,
            event_seq=seq,
            delivery=loaded.delivery,
            history=loaded.history,
            applied=loaded.applied,
            applied_count=loaded.applied_count,
            results=loaded.results,
            sizes=loaded.sizes,
            history_bytes=sum(loaded.sizes),
            head_size=loaded.head_size,
            versions=loaded.versions,
        )
        self._remember(session_id, stored)
        return stored

    def put(self, session_id: str, stored: StoredSession) -> None:
        """The session's latest state (written, not yet committed)."""
        self._versions += 1
        stored.version = self._versions
        stored.durable = False
        self._deleted.pop(session_id, None)
        self._forget(session_id)
        self._remember(session_id, stored)

    def drop(self, session_id: str) -> int:
        """Forget the session (its tombstones are written); until they are committed the table
        still holds it, so it is remembered as gone. Returns the version of the deletion."""
        self._versions += 1
        self._forget(session_id)
        self._deleted[session_id] = self._versions
        return self._versions

    def committed(self, rows: Iterable[Row], position: int, versions: dict[str, int]) -> None:
        """Records of a committed transaction, in log order, and the changelog offset after
        them; the sessions written at ``versions`` are durable once they are in the table
        (at the next :meth:`flush`, which this calls when the wait is over)."""
        self._pending.extend(rows)
        self._pending_position = max(self._pending_position, position)
        self._pending_versions.update(versions)
        if len(self._pending) >= FLUSH_ROWS or time.monotonic() - self._flushed_at >= FLUSH_EVERY_S:
            self.flush()

    def flush(self) -> None:
        """Put the committed records that wait into the table, in one write; their sessions
        are durable (evictable) from then on. The table raises what it fails with, and the
        records stay waiting."""
        self._flushed_at = time.monotonic()
        if not self._pending and not self._pending_versions:
            return
        self.table.apply(self._pending, self._pending_position)
        self._pending = []
        versions, self._pending_versions = self._pending_versions, {}
        for session_id, version in versions.items():
            cached = self._cache.peek(self, session_id)
            if cached is not None and cached.version == version:
                cached.durable = True
            if self._deleted.get(session_id) == version:
                del self._deleted[session_id]
        self._cache.evict()

    def keys_of(self, session_id: str) -> list[bytes]:
        """Every changelog key the session has records under (head last)."""
        self.flush()
        keys = [key for key, _ in self.table.scan(history.prefix(session_id))]
        return [*keys, session_id.encode()]

    def idle(
        self, before_ms: int, limit: int, after: tuple[str, int] | None = None
    ) -> list[tuple[str, int]]:
        """Up to ``limit`` sessions last written before ``before_ms``, oldest first, after
        ``after`` (a session and its time, as returned) when given."""
        self.flush()
        return self.table.idle(before_ms, limit, after)

    def written_ms(self, session_id: str) -> int | None:
        """When the session's last write that is in the table was committed (epoch ms)."""
        return self.table.written_ms(session_id.encode())

    def __len__(self) -> int:
        self.flush()
        return self.table.heads()

    @property
    def cached_bytes(self) -> int:
        """Bytes of the sessions this store holds in the cache."""
        return self._cache.held_by(self)

    @contextmanager
    def in_use(self, session_id: str) -> Iterator[None]:
        """While a command of the session is handled: the session stays decoded in memory,
        whatever its size (it is evicted afterwards if the budget needs its room)."""
        self._cache.hold(session_id)
        try:
            yield
        finally:
            self._cache.let_go(session_id)

    def release(self) -> None:
        """The store is done (its partition revoked, its owner ended): its sessions leave the
        instance's cache."""
        self._cache.release(self)

    def _remember(self, session_id: str, stored: StoredSession) -> None:
        self._cache.put(self, session_id, stored)

    def _forget(self, session_id: str) -> None:
        self._cache.forget(self, session_id)


def event_seq_of(headers: Sequence[tuple[str, bytes | None]]) -> int:
    for name, value in headers:
        if name == EVENT_SEQ_HEADER and value is not None:
            return int(value)
    return 0


def event_seq_header(seq: int) -> tuple[str, bytes]:
    return (EVENT_SEQ_HEADER, str(seq).encode())
