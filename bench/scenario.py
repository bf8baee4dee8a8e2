"""The benchmark scenario as plain data, shared by both engines (no imports beyond the stdlib).

A turn is two tool cycles then a final answer; with checkpointing on it takes exactly five
invocations, and each one must stop where ``EXPECTED_STOPS`` says.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

PROMPT = "What is the weather in Oslo and in Lima?"
SYSTEM_PROMPT = "You answer weather questions with the lookup tool."
TOOL_NAME = "lookup_weather"
TOOL_DESCRIPTION = "Look up the current weather of a city."

REPLIES: tuple[dict[str, Any], ...] = (
    {"tool_use": {"toolUseId": "tooluse_0", "name": TOOL_NAME, "input": {"city": "Oslo"}}},
    {"tool_use": {"toolUseId": "tooluse_1", "name": TOOL_NAME, "input": {"city": "Lima"}}},
    {"text": "Oslo is cloudy at 4 C and Lima is sunny at 22 C."},
)
"""Reply ``i`` answers the model call made after ``i`` assistant messages of the current turn."""

EXPECTED_STOPS: tuple[tuple[str, str | None, int | None], ...] = (
    ("checkpoint", "after_model", 0),
    ("checkpoint", "after_tools", 0),
    ("checkpoint", "after_model", 1),
    ("checkpoint", "after_tools", 1),
    ("end_turn", None, None),
)
"""(stop_reason, checkpoint position, cycle_index) of each invocation of one turn."""

INVOCATIONS_PER_TURN = len(EXPECTED_STOPS)


def weather(city: str) -> str:
    """The tool body both engines run: deterministic and instant."""
    return f"{city}: 4 C, cloudy" if city == "Oslo" else f"{city}: 22 C, sunny"


def reply_index(messages: list[dict[str, Any]]) -> int:
    """Assistant messages since the last user text prompt: which scripted reply comes next."""
    count = 0
    for message in reversed(messages):
        content = message.get("content") or []
        if message.get("role") == "assistant":
            count += 1
        elif any("text" in block for block in content):
            break
    return count


def check_stop(step: int, stop_reason: str, checkpoint: dict[str, Any] | None) -> None:
    """Fail loudly when an engine strays from the scenario (a fast wrong answer is no result)."""
    want_reason, want_position, want_index = EXPECTED_STOPS[step]
    got_position = checkpoint.get("position") if checkpoint else None
    got_index = checkpoint.get("cycle_index") if checkpoint else None
    if (stop_reason, got_position, got_index) != (want_reason, want_position, want_index):
        raise AssertionError(
            f"invocation {step}: got {(stop_reason, got_position, got_index)}, "
            f"want {(want_reason, want_position, want_index)}"
        )


def resume_input(checkpoint: dict[str, Any]) -> dict[str, Any]:
    return {"checkpointResume": {"checkpoint": checkpoint}}


@dataclass
class Timing:
    """Wall-clock and CPU seconds spent in the timed sections.

    CPU time (this process, all its threads) is reported beside wall-clock time because the
    machine is shared: other processes stretch wall-clock time, hardly this process's CPU time.
    """

    wall: float = 0.0
    cpu: float = 0.0
    invocations: int = 0

    @contextmanager
    def section(self, invocations: int) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.process_time()
        yield
        self.cpu += time.process_time() - cpu
        self.wall += time.perf_counter() - wall
        self.invocations += invocations

    def rates(self) -> dict[str, float]:
        """Invocations per second of wall-clock time and of CPU time."""
        return {"wall": self.invocations / self.wall, "cpu": self.invocations / self.cpu}
