"""Tools that must not run twice: the ``tool_outcome_unknown`` interrupt and its answers.

A ``once`` tool is recorded as started (in the pending batch, committed) before it runs, and
its result is recorded when it finishes. A tool recorded as started without a result was
running when its owner stopped: whether it did its work is unknown, so it is not run again;
the session pauses with this interrupt instead, and the caller answers with one of
:data:`ANSWER_SHAPES`. The interrupt's id has a namespace of its own, so no tool's own
interrupt can take it.
"""

from __future__ import annotations

from typing import Any

from service.agent.results import error_result, result_problem
from service.agent.types import ContentBlock

OUTCOME_UNKNOWN = "tool_outcome_unknown"
"""The interrupt's name."""
ANSWER_SHAPES = (
    "{'result': {'content': [...], 'status': 'success'|'error'}}, {'retry': true} or {'fail': str}"
)
"""The three answers, as error messages name them."""
_RESULT_KEYS = frozenset({"content", "status"})


def idempotency_key(session_id: str, tool_use_id: str) -> str:
    """What a tool call is given to make its effect idempotent, the same in every run of it."""
    return f"{session_id}:{tool_use_id}"


def cancelled_after_start_text(idempotency_key: str) -> str:
    """The result a cancel gives a ``once`` call recorded as started and without a result:
    not plain "cancelled", since it may have done its work."""
    return (
        "Tool execution cancelled after the tool had started: it may have done its work, its "
        f"outcome is unknown (idempotency key {idempotency_key})"
    )


def outcome_interrupt_id(tool_use_id: str) -> str:
    return f"v1:{OUTCOME_UNKNOWN}:{tool_use_id}"


def is_outcome_interrupt(interrupt_id: str) -> bool:
    return interrupt_id.startswith(f"v1:{OUTCOME_UNKNOWN}:")


def outcome_reason(
    use: dict[str, Any], started: dict[str, Any], idempotency_key: str
) -> dict[str, Any]:
    """What the caller is told about the tool call whose outcome is unknown."""
    return {
        "tool_name": use.get("name", ""),
        "input": use.get("input") or {},
        "tool_use_id": use["toolUseId"],
        "idempotency_key": idempotency_key,
        "started_at": started.get("at"),
        "instance": started.get("instance", ""),
    }


def answer_problem(response: Any) -> str | None:
    """Why ``response`` is not an answer to ``tool_outcome_unknown``; None when it is one."""
    if not isinstance(response, dict) or len(response) != 1:
        return f"an answer to {OUTCOME_UNKNOWN} must be one of {ANSWER_SHAPES}"
    if "retry" in response:
        if response["retry"] is not True:
            return "retry must be true"
        return None
    if "fail" in response:
        fail = response["fail"]
        if not isinstance(fail, str) or not fail.strip():
            return "fail must be a non-empty message"
        return None
    if "result" in response:
        result = response["result"]
        if not isinstance(result, dict) or not set(result) <= _RESULT_KEYS:
            return "result must be an object with content and an optional status"
        problem = result_problem({"status": "success", **result})
        return None if problem is None else f"result: {problem}"
    return f"an answer to {OUTCOME_UNKNOWN} must be one of {ANSWER_SHAPES}"


def answered_block(tool_use_id: str, response: dict[str, Any]) -> ContentBlock | None:
    """The tool result an answer stands for; None for a retry (the tool runs again)."""
    if "fail" in response:
        return error_result(tool_use_id, str(response["fail"]))
    if "result" in response:
        result = response["result"]
        return {
            "toolResult": {
                "toolUseId": tool_use_id,
                "status": result.get("status", "success"),
                "content": result["content"],
            }
        }
    return None
