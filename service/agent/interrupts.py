"""Interrupt raising and answering: deterministic ids and the answers known to one invocation.

Ids are stable across processes (uuid5 of the name), so a tool or hook that runs again after an
answer finds its own answer; an interrupt without an answer stops the invocation.
"""

from __future__ import annotations

import uuid
from functools import lru_cache
from typing import Any

from service.agent.types import Interrupt


class InterruptSignal(Exception):
    """Raised inside a tool or hook to pause the invocation for a human answer."""

    def __init__(self, interrupt: Interrupt) -> None:
        super().__init__(interrupt.name)
        self.interrupt = interrupt


@lru_cache(maxsize=1024)
def _name_uuid(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_OID, name))


def tool_call_id(tool_use_id: str, name: str) -> str:
    return f"v1:tool_call:{tool_use_id}:{_name_uuid(name)}"


def before_tool_call_id(tool_use_id: str, name: str) -> str:
    return f"v1:before_tool_call:{tool_use_id}:{_name_uuid(name)}"


def before_tools_id(name: str) -> str:
    return f"v1:before_tools:{_name_uuid(name)}"


class InterruptBook:
    """The interrupts of the pending batch, by id; answered ones keep their response."""

    __slots__ = ("known",)

    def __init__(self, interrupts: list[Interrupt] | None = None) -> None:
        self.known: dict[str, Interrupt] = {i.id: i for i in interrupts or ()}

    def ask(self, interrupt_id: str, name: str, reason: Any, response: Any) -> Any:
        """Return the answer for this interrupt, or raise :class:`InterruptSignal`.

        An interrupt raised before in this batch stands as first raised: its answer is returned,
        and one still unanswered (none given, or ``null``) is raised again with its first
        reason, whatever this call says."""
        known = self.known.get(interrupt_id)
        if known is not None:
            if known.response is not None:
                return known.response
            raise InterruptSignal(known)
        if response is not None:
            return response
        raise InterruptSignal(Interrupt(id=interrupt_id, name=name, reason=reason))

    def answered(self) -> list[Interrupt]:
        return [i for i in self.known.values() if i.response is not None]
