"""Test-only fault points: the process SIGKILLs or SIGSTOPs itself there, the commit fails
there, or a restore waits there for a signal.

Unset (the default) every point is a no-op; nothing else in the runtime changes behaviour.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from service.settings import FaultSettings

logger = logging.getLogger(__name__)


class InjectedCommitError(RuntimeError):
    """A commit failing on purpose, as one whose outcome is unknown would."""


class InjectedRecordError(RuntimeError):
    """Handling one record failing on purpose, as an unexpected bug would (a poison record)."""


class FaultPoints:
    __slots__ = ("_count", "_failed", "_gate", "_settings", "_stopped")

    def __init__(self, settings: FaultSettings) -> None:
        self._settings = settings
        self._count = 0
        self._failed = 0
        self._stopped = 0
        self._gate: asyncio.Event | None = None

    def handling(self, command_id: str | None) -> None:
        """Fail the handling of the command ``fail_command`` names (no-op unless configured)."""
        if command_id is not None and command_id == self._settings.fail_command:
            raise InjectedRecordError(f"injected failure while handling {command_id}")

    def reached(self, point: str) -> None:
        if self._settings.fail_at == point:
            self._failed += 1
            if self._failed == self._settings.fail_after:
                logger.warning("point=<%s> | fault point reached, failing the commit", point)
                raise InjectedCommitError(f"injected failure at {point}")
        if self._settings.stop_at == point:
            self._stopped += 1
            if self._stopped == self._settings.stop_after:
                self._signal(point, signal.SIGSTOP)
        if self._settings.kill_at != point:
            return
        self._count += 1
        if self._count >= self._settings.kill_after:
            self._signal(point, signal.SIGKILL)

    def _signal(self, point: str, sig: signal.Signals) -> None:
        logger.warning("point=<%s>, signal=<%s> | fault point reached", point, sig.name)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), sig)

    async def before_restore(self, partition: int) -> None:
        """Hold a restore until the process receives SIGUSR1 (no-op unless configured)."""
        if not self._settings.hold_restore:
            return
        if self._gate is None:
            self._gate = asyncio.Event()
            asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, self._gate.set)
        logger.warning("partition=<%d> | restore held until SIGUSR1", partition)
        await self._gate.wait()
