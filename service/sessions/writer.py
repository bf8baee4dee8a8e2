"""The one writer of session state: from a session's new state to the changelog records that
change it, within the record limit.

Guarantees: a write holds the head and only the history records that changed since the
session's previous write (messages appended or replaced at the tail, results of the open batch
added), so its bytes and CPU do not grow with the conversation; every record fits the limit (a
large message is split); the head is last, so a reader that applies the records in order never
sees a head whose history is not there; the store holds the new state at once (the committer
makes it durable).
"""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass
from typing import Any

from service.agent.state import SessionState
from service.agent.types import ContentBlock, Message
from service.sessions import history
from service.sessions.codec import encode_head
from service.sessions.delivery import Delivery
from service.sessions.store import SessionStore, StoredSession
from service.sessions.versions import VERSIONS_KEPT, Step, body, entry

RECORD_OVERHEAD = 4096
"""Room left in a record for its key, headers and batch framing."""


class StateTooLargeError(Exception):
    """What must stay in the head (agent state, pending interrupts, ...) exceeds a record."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"session head of {size} bytes (agent state, pause and delivery records) exceeds "
            f"the record limit of {limit} bytes"
        )


_NO_SIZES: array[int] = array("q")


@dataclass(slots=True)
class StateWrite:
    """The changelog records of one write of one session, head last (a ``None`` value is a
    tombstone), and the store version they make durable."""

    session_id: str
    records: list[tuple[bytes, bytes | None]]
    event_seq: int
    version: int = 0

    def then(self, later: StateWrite) -> StateWrite:
        """One write that has the effect of this one followed by ``later`` (of the same
        session): a write holds only what changed since the previous one, so neither may be
        dropped in favour of the other."""
        merged = dict(self.records)
        for key, value in later.records:
            merged.pop(key, None)
            merged[key] = value
        return StateWrite(self.session_id, list(merged.items()), later.event_seq, later.version)


class SessionWriter:
    def __init__(
        self, store: SessionStore, *, record_max_bytes: int, versions_kept: int = VERSIONS_KEPT
    ) -> None:
        self.store = store
        self._record_max = record_max_bytes
        self._part_max = max(1024, record_max_bytes - RECORD_OVERHEAD)
        self._versions_kept = versions_kept

    def write(
        self,
        state: SessionState,
        event_seq: int,
        delivery: Delivery | None = None,
        *,
        step: Step | None = None,
        rollback_to: int | None = None,
    ) -> StateWrite:
        """Store ``state`` and ``delivery`` (unchanged when not given) as the session's latest
        and return the records that write them; a ``step`` makes the state the session's next
        version (the oldest kept beyond ``versions_kept`` are tombstoned). ``rollback_to`` puts
        the session back to its state at that version (0: before its first): the versions
        after it are tombstoned, and the next step is numbered after it again."""
        session_id = state.session_id
        before = self.store.get(session_id)
        if delivery is None:
            delivery = before.delivery if before is not None else Delivery()
        old = before.history if before is not None else []
        new = state.messages
        keep = _common_prefix(old, new)
        records: list[tuple[bytes, bytes | None]] = []
        added: list[int] = []
        for index in range(keep, len(new)):
            body, raw = history.pack(new[index])
            added.append(raw)
            records.extend(
                history.split(history.message_key(session_id, index), body, self._part_max)
            )
        results, written = self._results(state, before, records)
        applied, applied_count = self._applied(session_id, delivery, before, records)
        versions = self._versions(state, before, step, records, rollback_to)
        pending = state.pending
        assistant_at = None
        if pending is not None and new and pending.assistant_message is new[-1]:
            assistant_at = len(new) - 1
        head, head_size = encode_head(
            state,
            delivery,
            results=[tool_use_id for tool_use_id, _ in results],
            assistant_at=assistant_at,
            applied=applied_count,
            versions=(versions[0]["version"], versions[-1]["version"]) if versions else None,
        )
        if len(head) > self._record_max:
            raise StateTooLargeError(len(head), self._record_max)
        records.append((session_id.encode(), head))
        # A copy, not the previous write's own: a state put back in the store (after a write
        # the broker refused) must keep counting its messages. An array of machine integers
        # copies as bytes, and the garbage collector never walks it.
        old_sizes = before.sizes if before is not None else _NO_SIZES
        history_bytes = before.history_bytes - sum(old_sizes[keep:]) if before is not None else 0
        sizes = old_sizes[:keep] if isinstance(old_sizes, array) else array("q", old_sizes[:keep])
        sizes.extend(added)
        history_bytes += sum(added)
        stored = StoredSession(
            state=state,
            event_seq=event_seq,
            delivery=delivery,
            history=new,
            applied=applied,
            applied_count=applied_count,
            results=results,
            sizes=sizes,
            history_bytes=history_bytes,
            head_size=head_size + written,
            versions=versions,
        )
        self.store.put(session_id, stored)
        return StateWrite(session_id, records, event_seq, stored.version)

    def delete(self, session_id: str) -> StateWrite:
        """Tombstones for every record of the session; the store forgets it."""
        keys = self.store.keys_of(session_id)
        version = self.store.drop(session_id)
        return StateWrite(session_id, [(key, None) for key in keys], 0, version)

    def _applied(
        self,
        session_id: str,
        delivery: Delivery,
        before: StoredSession | None,
        records: list[tuple[bytes, bytes | None]],
    ) -> tuple[list[str], int]:
        """The applied command ids as stored after this write, and how many the session ever
        applied; writes the slots of the ids added since the previous write (all of them, and
        tombstones for slots left over, when the list changed otherwise)."""
        if before is not None and delivery.applied == before.delivery.applied:
            # Most writes (every boundary but the command's last) answer no command.
            return before.applied, before.applied_count
        old = before.applied if before is not None else []
        count = before.applied_count if before is not None else 0
        new = list(delivery.applied)
        previous = before.delivery if before is not None else None
        # The previous write's set of ids, made once per state, when its list is the one stored.
        known = (
            previous.ids() if previous is not None and previous.applied == tuple(old) else set(old)
        )
        kept = len(new)
        while kept > 0 and new[kept - 1] not in known:
            kept -= 1
        total = count + len(new) - kept
        if new[:kept] != old[len(old) - kept :] or len(new) != min(total, history.APPLIED_SLOTS):
            # Not the old list with ids added (and the oldest dropped): written anew.
            records.extend(
                (history.applied_key(session_id, k), None)
                for k in range(len(new), min(count, history.APPLIED_SLOTS))
            )
            count, kept = 0, 0
        for offset, command_id in enumerate(new[kept:]):
            key = history.applied_key(session_id, count + offset)
            records.append((key, history.pack(command_id)[0]))
        return new, count + len(new) - kept

    def _versions(
        self,
        state: SessionState,
        before: StoredSession | None,
        step: Step | None,
        records: list[tuple[bytes, bytes | None]],
        rollback_to: int | None = None,
    ) -> list[dict[str, Any]]:
        """The version entries kept after this write: a step adds one (its entry and body
        written), and those beyond the bound are tombstoned, oldest first, once no command is
        in flight; a rollback tombstones those after its version first.

        While a command runs (its in-flight marker set) its boundaries' versions are added
        without dropping older ones: should it fail, the session goes back to before it,
        and must find the versions it had then, numbering on from the newest of them."""
        session_id = state.session_id
        kept = list(before.versions) if before is not None else []
        while rollback_to is not None and kept and kept[-1]["version"] > rollback_to:
            records.extend(_version_tombstones(session_id, kept.pop()))
        if step is not None:
            version = kept[-1]["version"] + 1 if kept else 1
            parts = list(
                history.split(
                    history.body_key(session_id, version),
                    history.pack(body(state))[0],
                    self._part_max,
                )
            )
            records.extend(parts)
            new = entry(step, version, len(state.messages), time.time(), len(parts))
            records.append((history.version_key(session_id, version), history.pack(new)[0]))
            kept.append(new)
        if state.inflight is None:
            while len(kept) > self._versions_kept:
                records.extend(_version_tombstones(session_id, kept.pop(0)))
        return kept

    def _results(
        self,
        state: SessionState,
        before: StoredSession | None,
        records: list[tuple[bytes, bytes | None]],
    ) -> tuple[list[tuple[str, ContentBlock]], int]:
        """The open batch's results by slot, writing those that changed (and tombstones for
        slots no longer used); also the JSON bytes of the slots written."""
        session_id = state.session_id
        old = before.results if before is not None else []
        pending = state.pending
        new = list(pending.results.items()) if pending is not None else []
        keep = 0
        while (
            keep < min(len(old), len(new))
            and old[keep][0] == new[keep][0]
            and (old[keep][1] is new[keep][1])
        ):
            keep += 1
        written = 0
        for slot in range(keep, len(new)):
            body, raw = history.pack(new[slot][1])
            written += raw
            records.extend(
                history.split(history.result_key(session_id, slot), body, self._part_max)
            )
        records.extend(
            (history.result_key(session_id, slot), None) for slot in range(len(new), len(old))
        )
        return new, written


def _version_tombstones(session_id: str, old: dict[str, Any]) -> list[tuple[bytes, bytes | None]]:
    """Tombstones for every record of a version's entry and body."""
    version = int(old["version"])
    key = history.body_key(session_id, version)
    tombstones: list[tuple[bytes, bytes | None]] = [
        (history.version_key(session_id, version), None),
        (key, None),
    ]
    tombstones.extend((key + b".%05d" % k, None) for k in range(1, int(old.get("parts", 1))))
    return tombstones


def _common_prefix(old: list[Message], new: list[Message]) -> int:
    """How many leading messages ``new`` shares with ``old``.

    The engine only appends messages or replaces the last one, and never changes one in place,
    so the shared prefix ends at the last position holding the very same object; a state that
    was deep-copied shares none by identity and is compared by value.
    """
    shared = min(len(old), len(new))
    index = shared
    while index > 0 and old[index - 1] is not new[index - 1]:
        index -= 1
    if index == 0 and shared:
        while index < shared and old[index] == new[index]:
            index += 1
    return index
