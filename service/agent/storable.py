"""What a session can store, decided by the session codec's own encoder (orjson, same options).

Guarantees: a tool result that leaves :func:`checked_result` is a valid toolResult in exactly
the form a restored session would hold it (raw bytes as base64 text), no larger than the maximum
it was given, or else the tool's error result saying why not (kept whatever its own size); an
agent-state dict watched by :class:`StateGuard` is encodable after every check, each top-level
key that was not being put back to its value at the previous check (dropped if it had none).
"""

from __future__ import annotations

import base64
import logging
from typing import Any

import orjson

from service.agent.errors import UnstorableError
from service.agent.results import (
    error_result,
    result_problem,
    result_too_large_text,
    unstorable_text,
)
from service.agent.types import ContentBlock

logger = logging.getLogger(__name__)

SESSION_JSON_OPTIONS = 0
"""The orjson options ``service.sessions.codec`` encodes session states with (none): this layer
cannot import the codec, so the two must be kept equal by hand."""


def stored_form(value: Any) -> Any:
    """``value`` as a session restored from its record would hold it.

    Raises :class:`UnstorableError` with the encoder's reason when the codec cannot encode it
    (a non-JSON type, an integer beyond 64 bits, a lone surrogate, a non-string key, ...).
    Encodable non-JSON values come back in their stored form (a datetime as its ISO text).
    """
    try:
        return orjson.loads(orjson.dumps(value, option=SESSION_JSON_OPTIONS))
    except orjson.JSONEncodeError as exc:
        raise UnstorableError(str(exc)) from exc


def _base64(value: Any) -> str:
    """Raw bytes in a result (an image's or a document's ``source.bytes``) are kept as their
    base64 text, the form a prompt's blocks take on the wire; the providers send either."""
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def checked_result(
    tool_use_id: str, block: Any, max_bytes: int | None = None, *, session_id: str = ""
) -> ContentBlock:
    """The toolResult block ``block`` in stored form, or an error result saying why it cannot be.

    Checked here rather than when the state is encoded: there a failure would fail the whole
    command after the tool's side effect, and every retry would run the tool again. A block
    whose encoding is longer than ``max_bytes`` (None: no limit) becomes the error result of
    :func:`~service.agent.results.result_too_large_text`; the size is measured on the one
    encoding the storability check makes anyway, so it costs nothing more.
    """
    result = block.get("toolResult") if isinstance(block, dict) else None
    if not isinstance(result, dict) or len(block) != 1:
        return error_result(tool_use_id, unstorable_text("it is not a {'toolResult': ...} block"))
    problem = result_problem(result)
    if problem is not None:
        return error_result(tool_use_id, unstorable_text(problem))
    try:
        encoded = orjson.dumps(block, default=_base64, option=SESSION_JSON_OPTIONS)
    except orjson.JSONEncodeError as exc:
        return error_result(tool_use_id, unstorable_text(str(exc)))
    size = len(encoded)
    if max_bytes is not None and size > max_bytes:
        logger.warning(
            "session_id=<%s>, tool_use_id=<%s>, size=<%d>, limit=<%d> | tool result too large,"
            " replaced by an error result",
            session_id,
            tool_use_id,
            size,
            max_bytes,
        )
        return error_result(tool_use_id, result_too_large_text(size, max_bytes))
    stored: ContentBlock = orjson.loads(encoded)
    return stored


def state_refused(block: ContentBlock, reason: str) -> ContentBlock:
    """``block`` turned into an error result that says which agent-state writes were undone.

    The tool's own content follows the explanation: its side effects did happen, so what it
    reported stays visible to the model.
    """
    result = block["toolResult"]
    text = f"Error: agent state written by the tool could not be stored and was reverted: {reason}"
    content = [{"text": text}, *result.get("content", ())]
    return {"toolResult": {**result, "status": "error", "content": content}}


class StateGuard:
    """Keeps one agent-state dict storable; call :meth:`check` after each writer (tool or hook).

    A write is refused by reverting it rather than by failing the writer: a plain dict cannot
    refuse a write as it happens, and the state must stay storable whatever the writer did.
    Only unstorable top-level keys are reverted, so other writes made since the last check
    stay. Under the concurrent executor a tool still running may have made the bad write; it is
    reported by whichever check sees it first.
    """

    __slots__ = ("_state", "_stored")

    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state
        self._stored = b"{}"
        # A state handed in unstorable (only a caller that built it by hand can) is repaired
        # against an empty one.
        self.check()

    def check(self) -> str | None:
        """Revert what cannot be stored; return why, or None when everything could be."""
        reasons: list[str] = []
        while True:
            try:
                self._stored = orjson.dumps(self._state, option=SESSION_JSON_OPTIONS)
            except orjson.JSONEncodeError:
                reasons.extend(self._revert())
                continue
            return "; ".join(reasons) if reasons else None

    def stored(self) -> dict[str, Any]:
        """The state (checked again) as a session restored from its record would hold it."""
        self.check()
        loaded: dict[str, Any] = orjson.loads(self._stored)
        return loaded

    def _revert(self) -> list[str]:
        last: dict[str, Any] = orjson.loads(self._stored)
        reasons: list[str] = []
        for key in list(self._state):
            try:
                orjson.dumps({key: self._state[key]}, option=SESSION_JSON_OPTIONS)
            except KeyError:
                continue  # removed meanwhile by a tool running in a worker thread
            except orjson.JSONEncodeError as exc:
                reasons.append(f"{_key_text(key)}: {exc}")
                if isinstance(key, str) and key in last:
                    self._state[key] = last[key]
                else:
                    self._state.pop(key, None)
        if not reasons:
            # Nothing single to blame (a worker thread changed it meanwhile): take the last
            # stored state whole, so the next check is bound to pass.
            self._state.clear()
            self._state.update(last)
            reasons.append("the state changed while it was checked; its last stored form is kept")
        return reasons


def _key_text(key: object) -> str:
    # A string's repr escapes lone surrogates, so the text is itself storable.
    return str.__repr__(key) if isinstance(key, str) else f"a key of type {type(key).__name__}"
