"""The local session store of one partition: a cache of the compacted sessions changelog.

The changelog is the truth; this store may be wiped and rebuilt from it at any time. Records are
kept encoded until a session is first touched, so restoring a large partition stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.agent.state import SessionState
from service.sessions.codec import decode_state

EVENT_SEQ_HEADER = "cairn-event-seq"
"""Header of a state record: the session's last event ``seq`` (kept beside the state itself)."""


@dataclass(slots=True)
class StoredSession:
    """A session as the store knows it: its state and the last event sequence number used."""

    state: SessionState
    event_seq: int = 0


class SessionStore:
    """Session id -> latest state; filled by the restore, then updated by each commit."""

    __slots__ = ("_decoded", "_encoded")

    def __init__(self) -> None:
        self._encoded: dict[str, tuple[bytes, int]] = {}
        self._decoded: dict[str, StoredSession] = {}

    def load(
        self, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]
    ) -> None:
        """Apply one changelog record in log order (a ``None`` value deletes the session)."""
        if key is None:
            return
        session_id = key.decode("utf-8")
        self._decoded.pop(session_id, None)
        if value is None:
            self._encoded.pop(session_id, None)
            return
        self._encoded[session_id] = (value, event_seq_of(headers))

    def get(self, session_id: str) -> StoredSession | None:
        stored = self._decoded.get(session_id)
        if stored is not None:
            return stored
        encoded = self._encoded.pop(session_id, None)
        if encoded is None:
            return None
        stored = StoredSession(state=decode_state(encoded[0]), event_seq=encoded[1])
        self._decoded[session_id] = stored
        return stored

    def put(self, session_id: str, stored: StoredSession) -> None:
        self._encoded.pop(session_id, None)
        self._decoded[session_id] = stored

    def __len__(self) -> int:
        return len(self._encoded) + len(self._decoded)


def event_seq_of(headers: list[tuple[str, bytes]]) -> int:
    for name, value in headers:
        if name == EVENT_SEQ_HEADER:
            return int(value)
    return 0


def event_seq_header(seq: int) -> tuple[str, bytes]:
    return (EVENT_SEQ_HEADER, str(seq).encode())
