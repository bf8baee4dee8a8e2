"""Session state to bytes and back: orjson, zlib-compressed when large, versioned.

A record holds the engine's state and the runtime's delivery records
(:mod:`service.sessions.delivery`) side by side. Two forms. The whole session in one value
(:func:`encode_state`, what version 1 wrote on the changelog and what tools and golden files
hold), and the form the changelog holds since version 2: a head record (the session without its
messages and applied command ids, with a ``history`` index instead) plus history records
(:mod:`service.sessions.history`), which :func:`decode_session` joins again.
``decode_record(encode_state(s, d)) == (s, d)`` for every session; older versions are upcast on
decode.
The first byte tells the format: ``{`` plain JSON, ``z`` zlib-compressed JSON.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from service.agent.state import SessionState
from service.agent.types import ContentBlock, Message
from service.sessions import history
from service.sessions.delivery import Delivery
from service.sessions.upcasters import StateVersionError, upcast

__all__ = [
    "Loaded",
    "StateDecodeError",
    "StateVersionError",
    "decode_record",
    "decode_session",
    "decode_state",
    "encode_head",
    "encode_state",
    "record_dict",
]

COMPRESS_ABOVE = 2048
"""Bytes of JSON above which the record is compressed (small records gain nothing)."""
_ZLIB = b"z"
_LEVEL = 1


class StateDecodeError(ValueError):
    """The bytes are not a session state this build can read."""


def record_dict(state: SessionState, delivery: Delivery | None = None) -> dict[str, Any]:
    """The session as one record (the shape of the ``session_state`` schema)."""
    return state.to_dict() | (delivery or Delivery()).record_fields()


def encode_state(
    state: SessionState, delivery: Delivery | None = None, *, compress_above: int = COMPRESS_ABOVE
) -> bytes:
    raw = orjson.dumps(record_dict(state, delivery))
    if len(raw) > compress_above:
        return _ZLIB + zlib.compress(raw, _LEVEL)
    return raw


def decode_record(data: bytes) -> tuple[SessionState, Delivery]:
    """A session written whole (by :func:`encode_state`, or by version 1 on the changelog)."""
    loaded = _head_dict(data)
    if "history" in loaded:
        raise StateDecodeError("session state is a head record: its history records are needed")
    state = _state(loaded)
    return state, _delivery(upcast(loaded))


def decode_state(data: bytes) -> SessionState:
    """The engine's state of a session written whole."""
    return decode_record(data)[0]


def encode_head(
    state: SessionState,
    delivery: Delivery,
    *,
    results: list[str],
    assistant_at: int | None,
    applied: int,
    versions: tuple[int, int] | None = None,
) -> tuple[bytes, int]:
    """The head record of the session and its JSON length: everything but the messages (in
    history records) and the applied command ids (``applied`` of them ever, the newest in their
    slots), the open batch's results named by toolUseId (stored in result slots, in order), its
    assistant message by index when it is message ``assistant_at`` of the history; ``versions``
    is the range of versions kept (written only once the session has one)."""
    data = record_dict(state, delivery)
    data["messages"] = None
    data["applied_commands"] = None
    data["history"] = {"messages": len(state.messages), "applied": applied}
    if versions is not None:
        data["history"]["versions"] = list(versions)
    pending = data["pending"]
    if pending is not None:
        pending["results"] = results
        if assistant_at is not None:
            pending["assistant_message"] = None
            pending["assistant_at"] = assistant_at
    return history.pack(data)


@dataclass(slots=True)
class Loaded:
    """A session read back from its records, with what of it the history records hold."""

    state: SessionState
    delivery: Delivery
    history: list[Message]
    """The messages stored in history records (none for a state written whole)."""
    applied: list[str]
    """The applied command ids stored in their slots (none for a state written whole)."""
    applied_count: int
    """How many command ids the session applied over its life (slots are reused)."""
    results: list[tuple[str, ContentBlock]]
    """The open batch's results stored in result slots, in slot order."""
    sizes: list[int]
    """Bytes of JSON of each message of ``history``."""
    head_size: int
    versions: list[dict[str, Any]] = field(default_factory=list)
    """The entries of the versions kept, oldest first."""


def decode_session(head: bytes, records: Mapping[bytes, bytes]) -> Loaded:
    """The session whose head is ``head``, its history taken from ``records`` (by key)."""
    loaded = upcast(_head_dict(head))
    index = loaded.pop("history", None)
    if index is None:
        state = _state(loaded)
        return Loaded(state, _delivery(loaded), [], [], 0, [], [], len(head))
    session_id = loaded.get("session_id")
    if not isinstance(session_id, str) or not isinstance(index, dict):
        raise StateDecodeError("session head is malformed: no session_id or history index")
    sizes: list[int] = []
    try:
        count = int(index["messages"])
        applied_count, applied = _applied(session_id, index, records)
        loaded["applied_commands"] = applied
        messages = []
        for i in range(count):
            message, size = history.load(history.message_key(session_id, i), records)
            messages.append(message)
            sizes.append(size)
        results: list[tuple[str, ContentBlock]] = []
        pending = loaded.get("pending")
        if pending is not None:
            ids = pending.get("results") or []
            for slot, tool_use_id in enumerate(ids):
                block, size = history.load(history.result_key(session_id, slot), records)
                results.append((tool_use_id, block))
                sizes.append(size)
            pending["results"] = dict(results)
            at = pending.pop("assistant_at", None)
            if at is not None:
                pending["assistant_message"] = messages[int(at)]
        kept = index.get("versions")
        versions = []
        if kept is not None:
            first, last = int(kept[0]), int(kept[1])
            versions = [
                history.load(history.version_key(session_id, v), records)[0]
                for v in range(first, last + 1)
            ]
    except history.HistoryDecodeError as exc:
        raise StateDecodeError(f"session {session_id!r}: {exc}") from exc
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise StateDecodeError(f"session head is malformed: {exc}") from exc
    loaded["messages"] = messages
    state = _state(loaded)
    return Loaded(
        state,
        _delivery(loaded),
        list(state.messages),
        list(applied),
        applied_count,
        results,
        sizes[:count],
        len(head),
        versions,
    )


def _head_dict(data: bytes) -> dict[str, Any]:
    if not data:
        raise StateDecodeError("empty session state record")
    try:
        if data[:1] == _ZLIB:
            data = zlib.decompress(data[1:])
        loaded: Any = orjson.loads(data)
    except (zlib.error, orjson.JSONDecodeError) as exc:
        raise StateDecodeError(f"session state is not readable: {exc}") from exc
    if not isinstance(loaded, dict):
        raise StateDecodeError("session state must be a JSON object")
    return loaded


def _state(loaded: dict[str, Any]) -> SessionState:
    try:
        return SessionState.from_dict(upcast(loaded))
    except StateVersionError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise StateDecodeError(f"session state is malformed: {exc}") from exc


def decode_delivery(head: bytes, records: Mapping[bytes, bytes]) -> Delivery:
    """Only the delivery records of the session whose head is ``head`` (its applied command ids
    taken from ``records``, which need hold no other history): which commands it answered,
    without decoding its conversation."""
    loaded = upcast(_head_dict(head))
    index = loaded.pop("history", None)
    if index is not None:
        session_id = loaded.get("session_id")
        if not isinstance(session_id, str) or not isinstance(index, dict):
            raise StateDecodeError("session head is malformed: no session_id or history index")
        try:
            loaded["applied_commands"] = _applied(session_id, index, records)[1]
        except history.HistoryDecodeError as exc:
            raise StateDecodeError(f"session {session_id!r}: {exc}") from exc
        except (KeyError, TypeError, ValueError) as exc:
            raise StateDecodeError(f"session head is malformed: {exc}") from exc
    return _delivery(loaded)


def _applied(
    session_id: str, index: dict[str, Any], records: Mapping[bytes, bytes]
) -> tuple[int, list[Any]]:
    """How many command ids the session applied over its life, and those its slots keep."""
    applied_count = int(index["applied"])
    first = max(0, applied_count - history.APPLIED_SLOTS)
    return applied_count, [
        history.load(history.applied_key(session_id, k), records)[0]
        for k in range(first, applied_count)
    ]


def _delivery(loaded: dict[str, Any]) -> Delivery:
    try:
        return Delivery.from_record(loaded)
    except (TypeError, ValueError) as exc:
        raise StateDecodeError(f"session delivery records are malformed: {exc}") from exc
