"""A tool raising ``KeyboardInterrupt`` or ``SystemExit``: its invocation ends, the service goes on.

Guarantee: neither reaches the event loop (asyncio would raise it out of the loop, ending the
process); :func:`guarded` carries it as :class:`ToolAborted`, and the invocation ends with an
``error`` result of code ``tool_aborted``, its history as the reference leaves it (the prompt
and the model's tool calls kept, the calls unanswered until the next prompt answers them
``Tool was interrupted.``).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

from service.agent.results import failure

T = TypeVar("T")


class ToolAborted(Exception):
    """Carries what a tool raised that ends its invocation (never past the executor)."""

    def __init__(self, exception: BaseException) -> None:
        super().__init__(type(exception).__name__)
        self.exception = exception


async def guarded(call: Awaitable[T]) -> T:
    """Await a tool's ``call``; a ``KeyboardInterrupt`` or ``SystemExit`` leaves it as
    :class:`ToolAborted`, so it ends the invocation, not the process."""
    try:
        return await call
    except (KeyboardInterrupt, SystemExit) as exc:
        raise ToolAborted(exc) from exc


def aborted_text(name: str, tool_use_id: str, exception: BaseException) -> str:
    """The ``tool_aborted`` error's message."""
    return (
        f"tool {name!r} (toolUseId {tool_use_id!r}) raised {type(exception).__name__} "
        f"({failure(exception)[0]}), which ends the invocation; its tool calls stay unanswered "
        "until the next prompt answers them 'Tool was interrupted.'"
    )
