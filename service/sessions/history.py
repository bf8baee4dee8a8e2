"""The records of a session's history on the sessions changelog, and their keys.

A session is a small head record, keyed by the session id, plus one history record per message
(and one per tool result of a batch still open), each under a key of its own so compaction keeps
every one of them until the session is deleted:

- ``<session id> NUL "m" <index, 10 digits>``: message ``index`` of the conversation;
- ``<session id> NUL "r" <slot, 5 digits>``: the ``slot``-th completed tool result of the open
  batch (the head lists their toolUseIds in slot order);
- ``<session id> NUL "a" <slot, 3 digits>``: the ``k``-th command id the session applied, in
  slot ``k`` mod 256 (the head counts them; the newest 256 are kept, for de-duplication);
- ``<session id> NUL "v" <version, 10 digits>``: the entry of version ``version`` of the session
  (what ``history`` lists: when, where it stopped, how many messages);
- ``<session id> NUL "b" <version, 10 digits>``: the state at that version, without its messages
  but for the last one (a fork starts from it; the messages before the last are never changed
  once a later one exists, so the message records hold them). The head names the range of
  versions kept; older ones are tombstoned.

A value larger than a record may hold is split: the first part is ``"s"``, the part count
(4 bytes, big-endian), then the first chunk; part ``k`` (``k >= 1``) lives under the same key
followed by ``"." <k, 5 digits>``. A whole value is ``{`` plain JSON or ``z`` zlib JSON, as the
head's codec writes. Session ids never hold a NUL (the wire refuses control characters), so a
history key can never be a head key, and ``<session id> NUL`` prefixes exactly one session.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from service.sessions.delivery import APPLIED_KEPT

SEPARATOR = b"\x00"
MESSAGE = b"m"
RESULT = b"r"
APPLIED = b"a"
VERSION = b"v"
BODY = b"b"
LOADED = (MESSAGE, RESULT, APPLIED, VERSION)
"""The kinds of history record a session's load reads; version bodies are read by forks only."""
APPLIED_SLOTS = APPLIED_KEPT
"""One slot for each applied command id a session keeps."""
_SPLIT = b"s"
_ZLIB = b"z"
_PART = b"."
_LEVEL = 1
COMPRESS_ABOVE = 2048
"""Bytes of JSON above which a record is compressed (small records gain nothing)."""


class HistoryDecodeError(ValueError):
    """A history record is missing or unreadable."""


def prefix(session_id: str) -> bytes:
    """Every history key of the session starts with this (and no other session's does)."""
    return session_id.encode() + SEPARATOR


def message_key(session_id: str, index: int) -> bytes:
    return prefix(session_id) + MESSAGE + b"%010d" % index


def result_key(session_id: str, slot: int) -> bytes:
    return prefix(session_id) + RESULT + b"%05d" % slot


def applied_key(session_id: str, count: int) -> bytes:
    """The key of the ``count``-th applied command id (0-based, counted over the session's
    life): slots are reused round-robin."""
    return prefix(session_id) + APPLIED + b"%03d" % (count % APPLIED_SLOTS)


def version_key(session_id: str, version: int) -> bytes:
    return prefix(session_id) + VERSION + b"%010d" % version


def body_key(session_id: str, version: int) -> bytes:
    return prefix(session_id) + BODY + b"%010d" % version


def is_history_key(key: bytes) -> bool:
    return SEPARATOR in key


def head_key_of(key: bytes) -> bytes:
    """The head key of the session a head or history key belongs to."""
    return key.split(SEPARATOR, 1)[0]


def pack(value: Any) -> tuple[bytes, int]:
    """JSON of ``value``, compressed when large, and the length of the JSON."""
    raw = orjson.dumps(value)
    if len(raw) > COMPRESS_ABOVE:
        return _ZLIB + zlib.compress(raw, _LEVEL), len(raw)
    return raw, len(raw)


def unpack(data: bytes) -> tuple[Any, int]:
    """The value :func:`pack` wrote and the length of its JSON; raises ``ValueError`` (zlib or
    JSON) when unreadable."""
    if data[:1] == _ZLIB:
        data = zlib.decompress(data[1:])
    return orjson.loads(data), len(data)


def split(key: bytes, body: bytes, part_max: int) -> Iterator[tuple[bytes, bytes]]:
    """The records that hold ``body`` under ``key``: one when it fits ``part_max``."""
    if len(body) <= part_max:
        yield key, body
        return
    first = part_max - 5
    rest = body[first:]
    chunks = [body[:first]] + [rest[i : i + part_max] for i in range(0, len(rest), part_max)]
    yield key, _SPLIT + len(chunks).to_bytes(4, "big") + chunks[0]
    for k in range(1, len(chunks)):
        yield key + _PART + b"%05d" % k, chunks[k]


def join(key: bytes, records: Mapping[bytes, bytes]) -> bytes:
    """The body stored under ``key`` in ``records`` (reassembled when it was split)."""
    first = records.get(key)
    if first is None:
        raise HistoryDecodeError(f"history record {key!r} is missing")
    if first[:1] != _SPLIT:
        return first
    count = int.from_bytes(first[1:5], "big")
    chunks = [first[5:]]
    for k in range(1, count):
        chunk = records.get(key + _PART + b"%05d" % k)
        if chunk is None:
            raise HistoryDecodeError(f"part {k} of {count} of history record {key!r} is missing")
        chunks.append(chunk)
    return b"".join(chunks)


def load(key: bytes, records: Mapping[bytes, bytes]) -> tuple[Any, int]:
    """The value stored under ``key`` and the length of its JSON."""
    try:
        return unpack(join(key, records))
    except (zlib.error, orjson.JSONDecodeError) as exc:
        raise HistoryDecodeError(f"history record {key!r} is not readable: {exc}") from exc
