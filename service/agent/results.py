"""Map what a tool returned or raised to a toolResult block, as the reference does.

A string becomes one text block, any other value one text block holding its JSON text (``str()``
when it is not JSON), a dict with ``status`` and ``content`` is taken as the result as-is;
exceptions become ``status: "error"`` results.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError

from service.agent.types import ContentBlock

CANCELLED_TEXT = "Tool execution cancelled"
ABANDONED_TEXT = "Tool was interrupted."
TOOL_CANCELLED_TEXT = "tool cancelled by user"
"""A before-tool-call hook's ``cancel_tool = True`` (the reference's wording, lower case)."""
VALIDATION_PREFIX = "Validation failed for input parameters: "


def unknown_tool_text(name: str) -> str:
    return f"Unknown tool: {name}"


def _as_text(value: Any) -> str:
    """The reference's text form: JSON with non-ASCII kept, pydantic's JSON, else ``str()``."""
    if isinstance(value, BaseModel):
        try:
            return value.model_dump_json()
        except PydanticSerializationError:
            return str(value)
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def tool_result(tool_use_id: str, value: Any) -> ContentBlock:
    if isinstance(value, dict) and "status" in value and "content" in value:
        result = dict(value)
        result["toolUseId"] = tool_use_id
        return {"toolResult": result}
    text = value if isinstance(value, str) else _as_text(value)
    return {
        "toolResult": {"toolUseId": tool_use_id, "status": "success", "content": [{"text": text}]}
    }


def error_text(exc: BaseException) -> str:
    if isinstance(exc, ValueError):
        return f"Error: {exc}"
    return f"Error: {type(exc).__name__} - {exc}"


def error_result(tool_use_id: str, text: str) -> ContentBlock:
    return {
        "toolResult": {"toolUseId": tool_use_id, "status": "error", "content": [{"text": text}]}
    }


def result_status(block: ContentBlock) -> str:
    return str(block["toolResult"].get("status", "success"))
