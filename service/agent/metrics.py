"""Metrics of one invocation and their running totals for the turn.

Invocation metrics are reset for every invocation; :func:`add_to_turn` folds them into the
turn totals kept in session state, so the totals survive pauses and process restarts.
"""

from __future__ import annotations

import time
from typing import Any

from service.agent.types import Usage


class ToolStats:
    __slots__ = ("calls", "errors", "time_ms")

    def __init__(self) -> None:
        self.calls = 0
        self.errors = 0
        self.time_ms = 0.0


class InvocationMetrics:
    """Counters of one invocation; only the engine writes them."""

    __slots__ = ("_started", "cycles", "model_ms", "tools", "usage")

    def __init__(self) -> None:
        self._started = time.perf_counter()
        self.cycles = 0
        self.usage = Usage()
        self.model_ms = 0.0
        self.tools: dict[str, ToolStats] = {}

    def tool(self, name: str, elapsed_ms: float, *, error: bool) -> None:
        stats = self.tools.get(name)
        if stats is None:
            stats = self.tools[name] = ToolStats()
        stats.calls += 1
        stats.time_ms += elapsed_ms
        if error:
            stats.errors += 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "cycles": self.cycles,
            "usage": self.usage.to_dict(),
            "model_ms": self.model_ms,
            "duration_ms": (time.perf_counter() - self._started) * 1000.0,
            "tools": {
                name: {"calls": s.calls, "errors": s.errors, "time_ms": s.time_ms}
                for name, s in self.tools.items()
            },
        }


def empty_turn() -> dict[str, Any]:
    return {
        "invocations": 0,
        "cycles": 0,
        "usage": {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0},
        "model_ms": 0.0,
        "duration_ms": 0.0,
        "tools": {},
    }


def add_to_turn(turn: dict[str, Any], invocation: dict[str, Any]) -> dict[str, Any]:
    """Return new turn totals: ``turn`` plus one finished invocation (``turn`` is not changed)."""
    base = turn if turn else empty_turn()
    usage = base["usage"]
    inv_usage = invocation["usage"]
    tools = {name: dict(stats) for name, stats in base["tools"].items()}
    for name, stats in invocation["tools"].items():
        total = tools.get(name)
        if total is None:
            tools[name] = dict(stats)
        else:
            total["calls"] += stats["calls"]
            total["errors"] += stats["errors"]
            total["time_ms"] += stats["time_ms"]
    return {
        "invocations": base["invocations"] + 1,
        "cycles": base["cycles"] + invocation["cycles"],
        "usage": {
            "inputTokens": usage["inputTokens"] + inv_usage["inputTokens"],
            "outputTokens": usage["outputTokens"] + inv_usage["outputTokens"],
            "totalTokens": usage["totalTokens"] + inv_usage["totalTokens"],
        },
        "model_ms": base["model_ms"] + invocation["model_ms"],
        "duration_ms": base["duration_ms"] + invocation["duration_ms"],
        "tools": tools,
    }


def turn_cycles(turn: dict[str, Any]) -> int:
    return int(turn.get("cycles", 0)) if turn else 0


def turn_tokens(turn: dict[str, Any]) -> int:
    return int(turn["usage"]["totalTokens"]) if turn else 0
