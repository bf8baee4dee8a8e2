"""Session state to bytes and back: orjson, zlib-compressed when large, versioned.

``decode_state(encode_state(s)) == s`` for every state; older versions are upcast on decode.
The first byte tells the format: ``{`` plain JSON, ``z`` zlib-compressed JSON.
"""

from __future__ import annotations

import zlib
from typing import Any

import orjson

from service.agent.state import SessionState
from service.sessions.upcasters import StateVersionError, upcast

__all__ = ["StateDecodeError", "StateVersionError", "decode_state", "encode_state"]

COMPRESS_ABOVE = 2048
"""Bytes of JSON above which the record is compressed (small records gain nothing)."""
_ZLIB = b"z"
_LEVEL = 1


class StateDecodeError(ValueError):
    """The bytes are not a session state this build can read."""


def encode_state(state: SessionState, *, compress_above: int = COMPRESS_ABOVE) -> bytes:
    raw = orjson.dumps(state.to_dict())
    if len(raw) > compress_above:
        return _ZLIB + zlib.compress(raw, _LEVEL)
    return raw


def decode_state(data: bytes) -> SessionState:
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
    try:
        return SessionState.from_dict(upcast(loaded))
    except StateVersionError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise StateDecodeError(f"session state is malformed: {exc}") from exc
