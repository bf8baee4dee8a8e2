"""The cancel signal shared by the loop, the model stream and tools of one invocation.

Setting it is idempotent and never raises; as in the reference, the last message given wins and
an immediate cancel upgrades a deferred one ("after current tools"), never the reverse.
"""

from __future__ import annotations

import asyncio

DEFAULT_CANCEL_MESSAGE = "Cancelled by user"


class CancelSignal:
    """Cooperative cancellation: observers poll :attr:`is_set` or await :meth:`wait`."""

    __slots__ = ("_deferred", "_event", "_message")

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._message: str | None = None
        self._deferred = False

    def cancel(self, message: str | None = None, *, after_current_tools: bool = False) -> None:
        if message is not None:
            self._message = message
        if self._event.is_set():
            if self._deferred and not after_current_tools:
                self._deferred = False
            return
        self._deferred = after_current_tools
        self._event.set()

    @property
    def is_set(self) -> bool:
        """True once any cancel (immediate or deferred) was requested."""
        return self._event.is_set()

    @property
    def immediate(self) -> bool:
        """True when the cancel must be honoured at the next observation point."""
        return self._event.is_set() and not self._deferred

    @property
    def deferred(self) -> bool:
        """True when the running tool batch may finish before the invocation stops."""
        return self._event.is_set() and self._deferred

    @property
    def message(self) -> str:
        return self._message or DEFAULT_CANCEL_MESSAGE

    @property
    def custom_message(self) -> str | None:
        """The message the canceller gave, if any (it then ends the turn as assistant text)."""
        return self._message

    async def wait(self) -> None:
        await self._event.wait()
