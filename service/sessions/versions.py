"""Versions of a session: one per committed step, numbered from 1, listed by ``history`` and
forked from by ``fork``.

A step is a boundary the engine committed (paused or running on) or the end of a command's run
(its result). Each version has an entry (what ``history`` lists) and a body (the state at that
version without the messages before the last, which the message records hold unchanged once a
later message exists). Both live in history records of the session
(:mod:`service.sessions.history`), the newest ``versions_kept`` of them; the head names the
range kept. Version numbers only grow over a session's life (a deleted session starts again at
1), so a version number names one state for as long as it is kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.agent.errors import VersionUnavailableError
from service.agent.state import SessionState
from service.agent.types import Checkpoint, Message

VERSIONS_KEPT = 100
"""Default number of versions a session keeps (``sessions.versions_kept``)."""

HISTORY_PAGE_MAX = 100
"""Largest page a ``history`` command may ask for (and the default)."""


@dataclass(frozen=True, slots=True)
class Step:
    """What the writer is told about a write that commits a step (a new version)."""

    cycle_index: int
    command_id: str
    position: str | None = None
    """The boundary the step reached (``after_model``, ``after_tools``), or ``None`` at an end."""
    stop_reason: str | None = None
    """How the command's run ended, for a step that is a result."""
    forked_from: tuple[str, int] | None = None
    """Source session and version, for the first version of a fork."""


def entry(step: Step, version: int, messages: int, at: float, parts: int) -> dict[str, Any]:
    """The entry of a new version (``parts``: records its body takes)."""
    data: dict[str, Any] = {"version": version, "at": round(at, 3), "command_id": step.command_id}
    if step.position is not None:
        data["position"] = step.position
    if step.stop_reason is not None:
        data["stop_reason"] = step.stop_reason
    data["cycle_index"] = step.cycle_index
    data["messages"] = messages
    if step.forked_from is not None:
        data["forked_from"] = {"session_id": step.forked_from[0], "version": step.forked_from[1]}
    data["parts"] = parts
    return data


def listed(data: dict[str, Any]) -> dict[str, Any]:
    """An entry as ``history`` answers it (without what only the store needs)."""
    return {key: value for key, value in data.items() if key != "parts"}


def body(state: SessionState) -> dict[str, Any]:
    """The state at a version, its messages but the last left to the message records."""
    data = state.to_dict()
    messages = state.messages
    data["messages"] = len(messages)
    data["tail"] = messages[-1] if messages else None
    return data


def state_at(data: dict[str, Any], before_tail: list[Message], session_id: str) -> SessionState:
    """The state a body describes, as session ``session_id``, given the messages before its
    last one. A fork is at rest: a version where the run went on past a boundary becomes a
    pause at that boundary (with checkpointing on for the rest of its turn)."""
    data = dict(data)
    count = int(data.pop("messages"))
    tail = data.pop("tail")
    if len(before_tail) != max(0, count - 1):
        raise VersionUnavailableError("the version's messages are not all kept")
    data["messages"] = [*before_tail, tail] if count else []
    data["session_id"] = session_id
    state = SessionState.from_dict(data)
    inflight = state.inflight
    if inflight is not None:
        state.inflight = None
        if state.pending is None or not state.pending.interrupts:
            state.checkpoint = Checkpoint(
                position="after_model" if inflight.position == "after_model" else "after_tools",
                cycle_index=inflight.cycle_index,
            )
            state.turn_checkpointing = True
    return state


def page(
    entries: list[dict[str, Any]], limit: int, before: int | None
) -> tuple[list[dict[str, Any]], int | None]:
    """Up to ``limit`` entries older than version ``before`` (all when ``None``), newest first,
    and the ``before`` of the next page (``None`` on the last)."""
    chosen = [e for e in reversed(entries) if before is None or e["version"] < before][:limit]
    older = bool(chosen) and chosen[-1]["version"] > entries[0]["version"]
    return [listed(e) for e in chosen], chosen[-1]["version"] if older else None
