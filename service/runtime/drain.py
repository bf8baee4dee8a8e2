"""The drain of an orchestrator's pre-stop hook: stop taking work, give the partitions back,
then wait for the stop signal.

Guarantees: once a drain is requested the instance joins no group (a drain during the wait for
the broker and the topics ends that wait, and the group is never joined); an instance already in
the group stops fetching, drains its owners as at a stop and leaves the group, so the other
instances take its partitions without waiting for its SIGTERM; :meth:`Drain.request` returns
once that is done, in whatever phase the drain came. The runtime then holds nothing and serves
nothing until its stop signal (not ready, alive).
"""

from __future__ import annotations

import asyncio

from service.runtime.transport import discard


class Drain:
    """Requested by the pre-stop hook, marked done by the runtime once it holds nothing."""

    def __init__(self) -> None:
        self._asked = asyncio.Event()
        self._done = asyncio.Event()

    @property
    def asked(self) -> bool:
        return self._asked.is_set()

    async def request(self) -> None:
        """Ask for the drain; returns once the runtime holds no partition (at once when it
        already ended)."""
        self._asked.set()
        await self._done.wait()

    def ask(self) -> None:
        """Ask for the drain without waiting for it (the runtime ending its own work)."""
        self._asked.set()

    async def wait_asked(self) -> None:
        await self._asked.wait()

    def done(self) -> None:
        """The runtime left the group or never joined it: every request returns."""
        self._done.set()


class StopOrDrain:
    """What ends the runtime's work: its stop signal or a drain, whichever comes first (the
    interface of :class:`asyncio.Event` that the start's wait and the runtime ask)."""

    def __init__(self, stop: asyncio.Event, drain: Drain) -> None:
        self._stop = stop
        self._drain = drain

    def is_set(self) -> bool:
        return self._stop.is_set() or self._drain.asked

    async def wait(self) -> bool:
        waits = [
            asyncio.ensure_future(self._stop.wait()),
            asyncio.ensure_future(self._drain.wait_asked()),
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            discard(waits)
        return True
