"""Map what a tool returned or raised to a toolResult block, as the reference does.

A string becomes one text block, any other value one text block holding its JSON text (``str()``
when it is not JSON), a dict with ``status`` and ``content`` is taken as the result as-is once it
has the toolResult shape; exceptions become ``status: "error"`` results. Nothing here raises on
a foreign value or exception: one without a text form becomes an error result too.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError

from service.agent.types import ContentBlock

CANCELLED_TEXT = "Tool execution cancelled"
ABANDONED_TEXT = "Tool was interrupted."
TOOL_CANCELLED_TEXT = "tool cancelled by user"
"""A before-tool-call hook's ``cancel_tool = True`` (the reference's wording, lower case)."""
VALIDATION_PREFIX = "Validation failed for input parameters: "
INPUT_MODEL_PATH = "strands.tools.decorator"
"""The module path the error for a non-object tool input puts before the input model's name:
the reference's, so that text reads the same to the model (Cairn's model lives elsewhere)."""
RESULT_STATUSES = ("success", "error")


RESULT_TOO_LARGE_TEXT = (
    "tool result of {size} bytes exceeds the maximum of {limit} bytes; it was not kept"
)
"""The error result's text for a tool result above ``Invocation.result_max_bytes``: ``size`` is
the length in bytes of the result block's JSON encoding (the session codec's encoder)."""


def result_too_large_text(size: int, limit: int) -> str:
    return RESULT_TOO_LARGE_TEXT.format(size=size, limit=limit)


TOOL_TIMEOUT_TEXT = "Error: tool {name} timed out after {seconds:g} s"
"""The error result's text for a tool that ran longer than its ``timeout_s``."""


def timeout_text(name: str, seconds: float) -> str:
    return TOOL_TIMEOUT_TEXT.format(name=name, seconds=seconds)


def input_not_object_text(model_name: str, value: Any) -> str:
    """Why a function tool refused an input that is not a JSON object (null, a list, ...)."""
    return (
        f"{VALIDATION_PREFIX}{INPUT_MODEL_PATH}.{model_name}() argument after ** must be a"
        f" mapping, not {type(value).__name__}"
    )


def unknown_tool_text(name: str) -> str:
    return f"Unknown tool: {name}"


def missing_input() -> tuple[str, KeyError]:
    """The reference's error text, and the exception its after-tool-call hooks see, for a
    toolUse without an ``input`` (a prompt of messages or a custom model provider can hold one;
    a model's reply under the reference always has one): its executor reads that key to open
    the tool call's span, before it looks the tool up or runs it, and tells the ``KeyError``
    as any failure of its own, ``Error: 'input'``."""
    exception = KeyError("input")
    return f"Error: {exception}", exception


TOOL_NAME_MAX_LENGTH = 64
# ``match`` with ``$``: a single trailing newline passes the pattern (and counts toward the
# length), exactly the names the reference accepts.
_TOOL_NAME = re.compile(r"[a-zA-Z0-9_\-]+$")
TOOL_NAME_MISSING_TEXT = "Error: tool name missing"


def tool_name_error(use: dict[str, Any]) -> str | None:
    """The error text for a toolUse whose name no tool can have; None when the name is valid.

    Valid: a string of 1 to ``TOOL_NAME_MAX_LENGTH`` ASCII letters, digits, ``_`` and ``-``,
    optionally ending in one newline (counted in the length). The pattern is checked before
    the length, so a long name with a bad character gets the pattern text. A name that is not
    a string fails the pattern, shown by its ``str()``.
    """
    if "name" not in use:
        return TOOL_NAME_MISSING_TEXT
    name = use["name"]
    if not isinstance(name, str) or _TOOL_NAME.match(name) is None:
        shown = name if isinstance(name, str) else _str(name) or type(name).__name__
        return f"Error: tool_name=<{shown}> | invalid tool name pattern"
    if len(name) > TOOL_NAME_MAX_LENGTH:
        return (
            f"Error: tool_name=<{name}>, tool_name_max_length=<{TOOL_NAME_MAX_LENGTH}>"
            " | invalid tool name length"
        )
    return None


def unstorable_text(reason: str) -> str:
    return f"Error: the tool's result could not be stored: {reason}"


def _str(value: object) -> str | None:
    """``str(value)``, or None when the value's own ``__str__`` fails."""
    try:
        return str(value)
    except Exception:  # noqa: BLE001 - foreign code may fail any way; it then has no text
        return None


def _as_text(value: Any) -> str | None:
    """The reference's text form: JSON with non-ASCII kept, pydantic's JSON, else ``str()``."""
    if isinstance(value, BaseModel):
        try:
            return value.model_dump_json()
        except PydanticSerializationError:
            return _str(value)
    try:
        return json.dumps(value, ensure_ascii=False)
    except Exception:  # noqa: BLE001 - any failure (a cycle, deep nesting) falls back to str()
        return _str(value)


def result_problem(result: dict[str, Any]) -> str | None:
    """Why ``result`` does not have the toolResult shape of SEMANTICS.md §2; None when it does."""
    if "status" not in result:
        return "status is missing: it must be 'success' or 'error'"
    status = result["status"]
    if status not in RESULT_STATUSES:
        shown = str.__repr__(status) if isinstance(status, str) else _kind(status)
        return f"status must be 'success' or 'error', not {shown}"
    if "content" not in result:
        return "content is missing: it must be a list of blocks"
    content = result["content"]
    if not isinstance(content, list):
        return f"content must be a list of blocks, not {_kind(content)}"
    for index, block in enumerate(content):
        if not isinstance(block, dict) or len(block) != 1:
            return f"content[{index}] must be an object with exactly one key"
        if "text" in block and not isinstance(block["text"], str):
            return f"content[{index}].text must be a string"
    return None


def _kind(value: Any) -> str:
    """A value's type as its writer knows it: a result often comes from JSON, where Python's
    ``NoneType`` would say nothing to the client that sent ``null``."""
    return "null" if value is None else type(value).__name__


def tool_result(tool_use_id: str, value: Any) -> ContentBlock:
    if isinstance(value, dict) and "status" in value and "content" in value:
        problem = result_problem(value)
        if problem is not None:
            return error_result(tool_use_id, unstorable_text(problem))
        result = dict(value)
        result["toolUseId"] = tool_use_id
        return {"toolResult": result}
    text = value if isinstance(value, str) else _as_text(value)
    if text is None:
        reason = f"a {type(value).__name__} value has no JSON or text form"
        return error_result(tool_use_id, unstorable_text(reason))
    return {
        "toolResult": {"toolUseId": tool_use_id, "status": "success", "content": [{"text": text}]}
    }


class ToolFailure(Exception):
    """A tool's failure whose error text is already told: ``text`` goes to the model, and the
    after-tool-call hooks see ``exception`` (what the reference reports for that failure)."""

    def __init__(self, text: str, exception: BaseException) -> None:
        super().__init__(text)
        self.text = text
        self.exception = exception


def failure(exc: BaseException) -> tuple[str, BaseException]:
    """The reference's error text for a tool that raised ``exc``, and the exception its
    after-tool-call hooks see.

    As a decorated tool tells it: ``Error: <message>`` for a ``ValueError``, else
    ``Error: <Type> - <message>``. When ``str(exc)`` itself raises, what it raised escapes the
    tool's own handling, and is told as :func:`escaped_failure` tells it.
    """
    try:
        message = str(exc)
    except Exception as raised:  # noqa: BLE001 - foreign code may fail any way
        return escaped_failure(raised, exc)
    if isinstance(exc, ValueError):
        return f"Error: {message}", exc
    return f"Error: {type(exc).__name__} - {message}", exc


def escaped_failure(
    exc: BaseException, original: BaseException | None = None
) -> tuple[str, BaseException]:
    """The reference's error text for an exception that escaped a tool's own handling (a module
    tool's, or one raised by an exception's ``__str__``): ``Error: <its text>``.

    When that text fails too, the reference's executor tells the exception that failure raised
    the same way, once; past that the reference itself fails (its invocation raises), and the
    text names the type of ``original`` (else ``exc``): ``Error: <Type>``.
    """
    current = exc
    for _ in range(2):
        try:
            return f"Error: {current}", current
        except Exception as raised:  # noqa: BLE001 - foreign code may fail any way
            current = raised
    first = original if original is not None else exc
    return f"Error: {type(first).__name__}", first


def error_result(tool_use_id: str, text: str) -> ContentBlock:
    return {
        "toolResult": {"toolUseId": tool_use_id, "status": "error", "content": [{"text": text}]}
    }


def result_status(block: ContentBlock) -> str:
    return str(block["toolResult"].get("status", "success"))
