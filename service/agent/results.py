"""Map what a tool returned or raised to a toolResult block, as the reference does.

A string becomes one text block, another JSON value one json block, a dict with ``status`` and
``content`` is taken as the result; exceptions become ``status: "error"`` results.
"""

from __future__ import annotations

from typing import Any

import orjson

from service.agent.types import ContentBlock

CANCELLED_TEXT = "Tool execution cancelled"
ABANDONED_TEXT = "Tool was interrupted."


def tool_result(tool_use_id: str, value: Any) -> ContentBlock:
    if isinstance(value, str):
        return {
            "toolResult": {
                "toolUseId": tool_use_id,
                "status": "success",
                "content": [{"text": value}],
            }
        }
    if isinstance(value, dict) and "status" in value and "content" in value:
        result = dict(value)
        result["toolUseId"] = tool_use_id
        if result["status"] not in ("success", "error"):
            result["status"] = "error"
        return {"toolResult": result}
    try:
        orjson.dumps(value)
    except TypeError:
        block: ContentBlock = {"text": str(value)}
    else:
        block = {"json": value}
    return {"toolResult": {"toolUseId": tool_use_id, "status": "success", "content": [block]}}


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
