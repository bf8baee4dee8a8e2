"""The cancel signal shared by the loop, the model stream and tools of one invocation.

Setting it is idempotent and never raises; as in the reference, the last message given wins and
an immediate cancel upgrades a deferred one ("after current tools"), never the reverse. Only an
immediate cancel wakes :meth:`CancelSignal.wait`, so tools and model streams run on under a
deferred one (the reference's tool cancel signal is likewise set by immediate cancels only).
"""

from __future__ import annotations

import asyncio

DEFAULT_CANCEL_MESSAGE = "Cancelled by user"


class CancelSignal:
    """Cooperative cancellation: the loop polls :attr:`is_set`; tools await :meth:`wait`."""

    __slots__ = ("_immediate", "_message", "_requested")

    def __init__(self) -> None:
        self._immediate = asyncio.Event()
        self._message: str | None = None
        self._requested = False

    def cancel(self, message: str | None = None, *, after_current_tools: bool = False) -> None:
        if message is not None:
            self._message = message
        self._requested = True
        if not after_current_tools:
            self._immediate.set()

    @property
    def is_set(self) -> bool:
        """True once any cancel (immediate or deferred) was requested."""
        return self._requested

    @property
    def immediate(self) -> bool:
        """True when the cancel must be honoured at the next observation point."""
        return self._immediate.is_set()

    @property
    def deferred(self) -> bool:
        """True when the running tool batch may finish before the invocation stops."""
        return self._requested and not self._immediate.is_set()

    @property
    def message(self) -> str:
        return self._message or DEFAULT_CANCEL_MESSAGE

    @property
    def custom_message(self) -> str | None:
        """The message the canceller gave, if any (it then ends the turn as assistant text)."""
        return self._message

    async def wait(self) -> None:
        """Return once an immediate cancel is requested (a deferred one does not wake it)."""
        await self._immediate.wait()
