"""The demo agent's tools: arithmetic, a made-up forecast, an approval gate and a slow job.

All are deterministic (the same input gives the same output in any process), so a tool batch
replayed after a crash produces the same results; the slow job honours the cancel signal.
"""

from __future__ import annotations

import ast
import asyncio
import operator
import time
import zlib
from collections.abc import Callable
from typing import Any

from service.agent.tools import ToolContext, tool

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_MAX_EXPRESSION = 200
_MAX_EXPONENT = 100
_PROGRESS_STEP_S = 0.05
_CONDITIONS = ("sunny", "partly cloudy", "overcast", "light rain", "windy", "foggy")


def _evaluate(node: ast.AST) -> float | int:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    number = getattr(node, "value", None) if isinstance(node, ast.Constant) else None
    if isinstance(number, int | float) and not isinstance(number, bool):
        return number
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        # An unbounded power is the one way arithmetic can hang the process.
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ValueError(f"exponent {right} is larger than {_MAX_EXPONENT}")
        result: int | float = _BINARY[type(node.op)](left, right)
        return result
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        unary: int | float = _UNARY[type(node.op)](_evaluate(node.operand))
        return unary
    raise ValueError(f"unsupported element {type(node).__name__}: use numbers and + - * / // % **")


@tool(inline=True)
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as "17 * (4 + 19)".

    Args:
        expression: Numbers combined with + - * / // % ** and parentheses.
    """
    if len(expression) > _MAX_EXPRESSION:
        raise ValueError(f"expression longer than {_MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    try:
        value = _evaluate(tree)
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{expression.strip()} = {value}"


@tool(inline=True)
def weather(city: str, day: int = 0) -> dict[str, Any]:
    """Look up the (demo) forecast for a city: made up, but the same every time.

    Args:
        city: Name of the city.
        day: Days from today, 0 to 6.
    """
    if not 0 <= day <= 6:
        raise ValueError("day must be between 0 and 6")
    seed = zlib.crc32(f"{city.strip().lower()}:{day}".encode())
    return {
        "city": city.strip(),
        "day": day,
        "conditions": _CONDITIONS[seed % len(_CONDITIONS)],
        "temperature_c": round(-5 + (seed >> 8) % 350 / 10, 1),
        "note": "demo data, not a real forecast",
    }


@tool(inline=True)
def request_approval(action: str, context: ToolContext) -> dict[str, Any]:
    """Ask a person to approve an action before it happens; waits for their answer.

    Args:
        action: What is about to be done, in one sentence.
    """
    answer = context.interrupt("approval", reason={"action": action, "expects": "true or false"})
    approved = (
        answer is True
        or (isinstance(answer, dict) and answer.get("approved") is True)
        or (isinstance(answer, str) and answer.strip().lower() in ("yes", "y", "true", "approve"))
    )
    return {"action": action, "approved": approved, "answer": answer}


@tool
async def slow_job(seconds: float, context: ToolContext) -> str:
    """Run a long job that reports progress; stops early when the invocation is cancelled.

    Args:
        seconds: How long the job takes (at most 600).
    """
    seconds = max(0.0, min(seconds, 600.0))
    started = time.monotonic()
    deadline = started + seconds
    # A deferred cancel ("after current tools") lets the job finish; an immediate one stops it.
    while (now := time.monotonic()) < deadline:
        if context.cancel.immediate:
            return f"job stopped after {now - started:.1f}s of {seconds:g}s: cancelled"
        await asyncio.sleep(min(_PROGRESS_STEP_S, deadline - now))
    return f"job finished after {seconds:g}s"
