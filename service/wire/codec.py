"""Bytes <-> validated wire models on orjson; the only entry points the runtime needs.

Decoding raises nothing but :class:`~service.wire.errors.WireError` (size, JSON, envelope,
fields, key mismatch), with the ids it could read; encoding writes exactly what the model holds.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from service.wire.base import MAX_ID_LENGTH
from service.wire.commands import (
    CancelCommand,
    Command,
    DeleteCommand,
    ForkCommand,
    HistoryCommand,
    InvokeCommand,
    ResumeCommand,
)
from service.wire.errors import ErrorCode, WireError, WireIssue
from service.wire.events import EVENT_TYPES, ProgressEvent
from service.wire.pauses import is_wrapped_checkpoint
from service.wire.refusal_text import issues, json_kind, reason
from service.wire.results import ResultRecord

DEFAULT_MAX_RECORD_BYTES = 1024 * 1024
"""Largest command or control value accepted (the broker's default message size)."""

MAX_DEPTH = 64
"""Deepest nesting of objects and arrays accepted in a command. orjson refuses to write more
than 254 levels, and a command's parts are written again one to eight levels deeper (metadata in
the result, prompt messages in the session state), so a deeper command could never be answered."""

M = TypeVar("M", bound=BaseModel)

COMMAND_TYPES: Mapping[
    str,
    type[InvokeCommand]
    | type[ResumeCommand]
    | type[DeleteCommand]
    | type[HistoryCommand]
    | type[ForkCommand],
] = {
    "invoke": InvokeCommand,
    "resume": ResumeCommand,
    "delete": DeleteCommand,
    "history": HistoryCommand,
    "fork": ForkCommand,
}
CONTROL_TYPES: Mapping[str, type[CancelCommand]] = {"cancel": CancelCommand}
RESULT_TYPES: Mapping[str, type[ResultRecord]] = {"agent_result": ResultRecord}
_ELSEWHERE = {
    "invoke": "the commands topic",
    "resume": "the commands topic",
    "delete": "the commands topic",
    "history": "the commands topic",
    "fork": "the commands topic",
    "cancel": "the control topic",
    "agent_result": "the results topic",
    **dict.fromkeys(EVENT_TYPES, "the events topic"),
}

_RESUME_PAYLOAD: Mapping[type[BaseModel], str] = {InvokeCommand: "prompt", ResumeCommand: "resume"}
"""The field of a command that may hold a resume payload (a delete has none)."""


class KeyCheck(enum.Enum):
    SKIP = "skip"
    """Do not compare the record key with ``session_id`` (tools, tests, results)."""


def _id(raw: Mapping[str, Any], name: str) -> str | None:
    """The id ``name`` when an ``error`` result could carry it (a valid id), else None."""
    value = raw.get(name)
    if not isinstance(value, str) or not value or "\x00" in value or len(value) > MAX_ID_LENGTH:
        return None
    return value


def _fail(
    raw: Mapping[str, Any], path: str, message: str, code: ErrorCode = "invalid_command"
) -> WireError:
    issue = WireIssue(path, message)
    return WireError(
        str(issue),
        issues=(issue,),
        code=code,
        session_id=_id(raw, "session_id"),
        command_id=_id(raw, "command_id"),
    )


def _load(value: bytes, max_bytes: int | None) -> dict[str, Any]:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise WireError(f"record value must be bytes, got {type(value).__name__}")
    if max_bytes is not None and len(value) > max_bytes:
        raise WireError(f"record value of {len(value)} bytes exceeds the limit of {max_bytes}")
    try:
        raw = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        if exc.msg == _PARSER_DEPTH_LIMIT:
            # Valid JSON, too deep for the parser (1,024 levels): not even its ids can be read.
            raise WireError(
                f"record value nests objects and arrays deeper than the {PARSER_MAX_DEPTH:,} "
                f"levels JSON is read to, so not even its ids can be read: {exc}"
            ) from None
        utf8 = _utf8_problem(value)
        if utf8 is None:
            _refuse_unreadable_json(value, exc)
        raise WireError(utf8 or f"record value is not UTF-8 JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise WireError(f"record value must be a JSON object, got {json_kind(raw)}")
    return raw


_UTF8_BOM = b"\xef\xbb\xbf"


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _refuse_unreadable_json(value: bytes | bytearray | memoryview, exc: Exception) -> None:
    """Refuse, with its ids, a command that is JSON orjson cannot hold: a number past a
    double's range (``1e400``, an integer of 309 digits or more) or a lone surrogate escape
    (``"\\ud800"``), both in JSON's grammar, or JSON behind a UTF-8 byte order mark. Without
    this it would be dead-lettered, unanswered, as a value that is not JSON.
    Returns (and the caller dead-letters) when the stricter stdlib parser fails too or the ids
    are none a result can carry. Runs only on a value that failed to parse."""
    try:
        # Numbers are read as floats: only the ids are wanted, and an integer of more digits
        # than the interpreter converts (``sys.get_int_max_str_digits``, 4,300) would fail it.
        raw = json.loads(bytes(value), parse_constant=_not_json, parse_int=float)
    except (ValueError, RecursionError):
        return
    if not isinstance(raw, dict):
        return
    ids = [_id(raw, name) for name in ("session_id", "command_id")]
    if any(i is None or not _is_unicode(i) for i in ids):
        return
    if bytes(value[:3]) == _UTF8_BOM:
        # The standard parser skips a byte order mark; a record's JSON must not start with one.
        reason = "record value starts with a UTF-8 byte order mark (BOM); send the JSON without it"
    else:
        reason = (
            f"record value holds JSON that cannot be read: {exc} (numbers must fit in a "
            "double, and \\u escapes must make Unicode characters)"
        )
    raise WireError(
        reason,
        session_id=ids[0],
        command_id=ids[1],
    )


def _is_unicode(text: str) -> bool:
    """No lone surrogates: text a result can be written with."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _utf8_problem(value: bytes | bytearray | memoryview) -> str | None:
    """Where ``value`` stops being UTF-8, else None. orjson reports a bad byte as a string that
    is "not valid UTF-8: surrogates not allowed" at the start of the record; the decoder names
    the byte and its offset. Run only on a value that failed to parse, so it costs nothing else."""
    try:
        bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = exc.object[exc.start : exc.end]
        return (
            f"record value is not valid UTF-8: byte 0x{bad[0]:02x} at offset {exc.start} "
            f"({exc.reason})"
        )
    return None


PARSER_MAX_DEPTH = 1024
"""Levels of nesting orjson parses; a value past them is not read at all."""
_PARSER_DEPTH_LIMIT = "depth limit exceeded"
"""orjson's message for a value nested past the levels it parses."""


def _too_deep(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def _load_command(value: bytes, max_bytes: int | None) -> dict[str, Any]:
    raw = _load(value, max_bytes)
    if _too_deep(raw, MAX_DEPTH):
        raise WireError(
            f"record value nests objects and arrays deeper than {MAX_DEPTH} levels",
            session_id=_id(raw, "session_id"),
            command_id=_id(raw, "command_id"),
        )
    return raw


def _model_for(raw: dict[str, Any], types: Mapping[str, type[M]]) -> type[M]:
    if "type" not in raw:
        raise _fail(raw, "type", "is required")
    kind = raw["type"]
    if not isinstance(kind, str):
        raise _fail(raw, "type", f"must be a string, got {json_kind(kind)}")
    model = types.get(kind)
    if model is None:
        expected = ", ".join(repr(t) for t in types)
        where = f" ({kind!r} belongs on {_ELSEWHERE[kind]})" if kind in _ELSEWHERE else ""
        raise _fail(raw, "type", f"unknown message type {kind!r}{where}; expected {expected}")
    return model


def _validate(model: type[M], raw: dict[str, Any], value: bytes) -> M:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        found, code = issues(exc, value)
        raise WireError(
            reason(found),
            issues=found,
            code=code,
            session_id=_id(raw, "session_id"),
            command_id=_id(raw, "command_id"),
        ) from None


def _check_key(raw: dict[str, Any], session_id: str, key: bytes | KeyCheck | None) -> None:
    if key is KeyCheck.SKIP:
        return
    if key is None:
        raise _fail(raw, "session_id", "the record has no key; the key must be the session id")
    if key != session_id.encode():
        problem = f"does not match the record key {_shown_key(key)}"
        source = raw.get("source_session_id")
        if raw.get("type") == "fork" and isinstance(source, str) and key == source.encode():
            # The likely mistake: a fork is addressed to the session it creates.
            problem += (
                ", the fork's source_session_id: a fork is keyed by its session_id, the new "
                "session's id"
            )
        raise _fail(raw, "session_id", problem)


SHOWN_KEY_BYTES = 64
"""The most of a mismatched record key a refusal quotes."""


def _shown_key(key: bytes) -> str:
    """The key quoted as its producer sent it: characters as ``repr`` shows them, each byte that
    is not UTF-8 as ``\\xNN`` (a replacement character would hide which bytes were sent), cut
    at a character boundary within ``SHOWN_KEY_BYTES`` and saying so. Runs only on a refusal."""
    shown: list[str] = []
    used = 0
    # surrogateescape maps each byte that is not UTF-8 to one lone surrogate, U+DC80..U+DCFF,
    # which valid UTF-8 never decodes to. Three bytes more than are shown hold any character
    # that begins within them whole.
    for char in key[: SHOWN_KEY_BYTES + 3].decode("utf-8", "surrogateescape"):
        size = len(char.encode("utf-8", "surrogateescape"))
        if used + size > SHOWN_KEY_BYTES:
            break
        used += size
        if "\udc80" <= char <= "\udcff":
            shown.append(f"\\x{ord(char) - 0xDC00:02x}")
        else:
            shown.append("\\'" if char == "'" else repr(char)[1:-1])
    quoted = "'" + "".join(shown) + "'"
    return quoted if used == len(key) else f"{quoted} (the first {used} of its {len(key)} bytes)"


def _refuse_wrapped_checkpoint(raw: dict[str, Any], field: str) -> None:
    if is_wrapped_checkpoint(raw.get(field)):
        raise _fail(
            raw,
            field,
            'a checkpoint resume is the object {"checkpointResume": {...}}, not a list of it',
            code="checkpoint_incompatible",
        )


def json_object(value: bytes | None) -> dict[str, Any] | None:
    """A refused record's value as a JSON object, for what its refusal can still tell from it;
    None when it is absent, not JSON or not an object."""
    if value is None:
        return None
    try:
        raw = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    return raw if isinstance(raw, dict) else None


def refused_metadata(value: bytes | None) -> dict[str, Any] | None:
    """The ``metadata`` that the ``error`` result of a commands-topic record refused before it
    became a command echoes (a field, its key or its partition was wrong): its ``metadata``
    object, so a client correlates a refusal as it does any result. None when the value does not
    read as JSON or its ``metadata`` is no object, or nests past the limit. Runs only on a
    refusal, so the second parse costs nothing else."""
    raw = json_object(value)
    metadata = raw.get("metadata") if raw is not None else None
    # A result holds it one level down: no deeper than a command may nest.
    if not isinstance(metadata, dict) or _too_deep(metadata, MAX_DEPTH - 1):
        return None
    return metadata


def decode_command(
    value: bytes,
    *,
    key: bytes | KeyCheck | None = KeyCheck.SKIP,
    max_bytes: int | None = DEFAULT_MAX_RECORD_BYTES,
) -> Command:
    """A commands-topic value as an invoke, a resume or a delete.

    An invoke with a resume prompt is returned as the resume it stands for. Pass the record
    ``key`` so a record keyed differently from its ``session_id`` (it would sit on another
    session's partition) is refused.
    """
    raw = _load_command(value, max_bytes)
    model = _model_for(raw, COMMAND_TYPES)
    payload = _RESUME_PAYLOAD.get(model)
    if payload is not None:
        _refuse_wrapped_checkpoint(raw, payload)
    command = _validate(model, raw, value)
    _check_key(raw, command.session_id, key)
    if isinstance(command, InvokeCommand) and command.is_resume:
        return command.as_resume()
    return command


def decode_control(
    value: bytes,
    *,
    key: bytes | KeyCheck | None = KeyCheck.SKIP,
    max_bytes: int | None = DEFAULT_MAX_RECORD_BYTES,
) -> CancelCommand:
    """A control-topic value as a cancel."""
    raw = _load_command(value, max_bytes)
    command = _validate(_model_for(raw, CONTROL_TYPES), raw, value)
    _check_key(raw, command.session_id, key)
    return command


def decode_result(value: bytes) -> ResultRecord:
    """A results-topic value (for clients and tests)."""
    raw = _load(value, None)
    return _validate(_model_for(raw, RESULT_TYPES), raw, value)


def decode_event(value: bytes) -> ProgressEvent:
    """An events-topic value as its typed event."""
    raw = _load(value, None)
    model: type[ProgressEvent] = _model_for(raw, EVENT_TYPES)
    return _validate(model, raw, value)


_FIELD_NAMES: dict[type[BaseModel], tuple[str, ...]] = {}


def _field_names(cls: type[BaseModel]) -> tuple[str, ...]:
    """A model's field names in declaration order (looked up once per class)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(cls.model_fields)
    return names


def _plain(model: Any) -> dict[str, Any]:
    # orjson calls this for each model it meets; plain dicts and lists inside are written by
    # orjson itself, which is what keeps a 20 KB result cheap to encode.
    if not isinstance(model, BaseModel):
        raise TypeError(f"{type(model).__name__} is not JSON")
    present = model.model_fields_set
    data = {name: getattr(model, name) for name in _field_names(type(model)) if name in present}
    if model.model_extra:
        data.update(model.model_extra)
    return data


def encode(message: BaseModel) -> bytes:
    """Any wire model as compact UTF-8 JSON: the fields it was given, in declaration order.

    Equal to ``model_dump(exclude_unset=True)`` (``type`` and ``schema_version`` always count
    as given), so a decoded message re-encodes unchanged.
    """
    try:
        return orjson.dumps(message, default=_plain)
    except orjson.JSONEncodeError as exc:
        raise WireError(f"{type(message).__name__} holds a value that is not JSON: {exc}") from None


def encode_command(command: Command | CancelCommand) -> bytes:
    return encode(command)


def encode_result(record: ResultRecord) -> bytes:
    return encode(record)


def encode_event(event: ProgressEvent) -> bytes:
    return encode(event)
