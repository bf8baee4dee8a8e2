"""What a refused command's reason says of its fields: pydantic's errors in the words of a client
that wrote JSON (an object, an array, null), naming what was sent where the type was wrong.

Everything here runs only once a record is refused; a valid command never reaches it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, get_args

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from service.wire.base import WireVersion
from service.wire.errors import ErrorCode, WireIssue
from service.wire.pauses import CHECKPOINT_TAG

MAX_ISSUES_IN_REASON = 8

INTEGER_RANGE = "from -9223372036854775808 to 18446744073709551615"
"""The integers the wire keeps exact (orjson's range: -2^63 to 2^64-1); docs/clients.md says so."""

OUT_OF_RANGE = f"is an integer out of range (the wire keeps integers {INTEGER_RANGE})"

_READ_VERSIONS = " or ".join(str(v) for v in get_args(get_args(WireVersion)[0]))

_MESSAGES = {
    "missing": "is required",
    "extra_forbidden": "is not a known field",
    # An integer from 2^63 to 2^64-1, in range on the wire, where a literal integer
    # (schema_version) is expected: the validator speaks of an "input string", which a client
    # that sent a number would not recognise. Only that literal meets such an integer: the
    # integer fields take any size.
    "int_parsing_size": f"Input should be {_READ_VERSIONS}",
}

_EXPECTED = {
    "int_type": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "bool_type": "a boolean",
    "dict_type": "an object",
    "model_type": "an object",
    "list_type": "an array",
}
"""What a type error's field takes, in JSON's words (pydantic says dictionary, list, instance
of a class)."""


def json_kind(value: object) -> str:
    """What a decoded JSON value is, in JSON's words (a client reads them, not Python's)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an object" if isinstance(value, dict) else "an array"


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not (part.startswith("<") and part.endswith(">")):
            out += f".{part}" if out else part
    return out


def _as_written(source: Any, loc: tuple[int | str, ...]) -> Any:
    """The value at ``loc`` in the record as the stdlib parser reads it, which keeps an integer
    of any size (orjson reads one past 64 bits as a double); loc parts that name no key or index
    are union tags and are stepped over."""
    node = source
    for part in loc:
        if isinstance(node, dict) and isinstance(part, str):
            node = node.get(part, node)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
    return node


def _not_an_integer(err: ErrorDetails, source: Callable[[], Any]) -> str:
    """Why a double is no integer: it was written as one past the range orjson keeps (then read
    as a double), or written with a fraction or an exponent (``3.0`` is not an integer)."""
    written = _as_written(source(), err["loc"])
    if isinstance(written, int) and not isinstance(written, bool):
        return OUT_OF_RANGE
    return "must be an integer, got a number with a fraction or an exponent"


def _message(err: ErrorDetails, source: Callable[[], Any]) -> str:
    kind, value = err["type"], err.get("input")
    expected = _EXPECTED.get(kind)
    if expected is not None:
        if kind == "int_type" and isinstance(value, float):
            return _not_an_integer(err, source)
        return f"must be {expected}, got {json_kind(value)}"
    if kind == "literal_error":
        # "Input should be '1.0'" for the number 1.0 reads as if the client had sent what it
        # should: say what it sent when that is of another JSON kind.
        takes = str if str(err.get("ctx", {}).get("expected", "")).startswith("'") else int
        if not isinstance(value, takes) or isinstance(value, bool):
            return f"{err['msg']}, got {json_kind(value)}"
    return _MESSAGES.get(kind, err["msg"].removeprefix("Value error, "))


def issues(
    exc: ValidationError, value: bytes | bytearray | memoryview
) -> tuple[tuple[WireIssue, ...], ErrorCode]:
    """The refused fields of the record ``value`` and the error code they call for."""
    errors = exc.errors(include_url=False)
    read: list[Any] = []

    def source() -> Any:
        # Read again only for a double where an integer was expected, and once per record.
        if not read:
            try:
                read.append(json.loads(bytes(value)))
            except (ValueError, RecursionError):
                read.append(None)
        return read[0]

    found = tuple(WireIssue(_path(err["loc"]), _message(err, source)) for err in errors)
    # The engine reports a malformed checkpoint resume as incompatible; the wire agrees.
    in_checkpoint = any(CHECKPOINT_TAG in err["loc"] for err in errors)
    return found, "checkpoint_incompatible" if in_checkpoint else "invalid_command"


def reason(found: tuple[WireIssue, ...]) -> str:
    shown = "; ".join(str(issue) for issue in found[:MAX_ISSUES_IN_REASON])
    more = len(found) - MAX_ISSUES_IN_REASON
    return f"{shown}; and {more} more" if more > 0 else shown
