"""A Strands module tool: ``TOOL_SPEC`` and a function named as the module."""

from __future__ import annotations

from typing import Any

TOOL_SPEC = {
    "name": "strands_module_tool",
    "description": "Shout a word.",
    "inputSchema": {
        "json": {
            "type": "object",
            "properties": {"word": {"type": "string", "description": "The word."}},
            "required": ["word"],
        }
    },
}


def strands_module_tool(tool_use: dict[str, Any], **invocation_state: Any) -> dict[str, Any]:
    word = tool_use["input"]["word"]
    return {
        "toolUseId": tool_use["toolUseId"],
        "status": "success",
        "content": [{"text": f"{word.upper()}! (agent {invocation_state['agent'].name})"}],
    }
