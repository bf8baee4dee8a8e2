"""Test-only fault points: the process SIGKILLs itself there, or the commit fails there.

Unset (the default) every point is a no-op; nothing else in the runtime changes behaviour.
"""

from __future__ import annotations

import logging
import os
import signal

from service.settings import FaultSettings

logger = logging.getLogger(__name__)


class InjectedCommitError(RuntimeError):
    """A commit failing on purpose, as one whose outcome is unknown would."""


class FaultPoints:
    __slots__ = ("_count", "_failed", "_settings")

    def __init__(self, settings: FaultSettings) -> None:
        self._settings = settings
        self._count = 0
        self._failed = 0

    def reached(self, point: str) -> None:
        if self._settings.fail_at == point:
            self._failed += 1
            if self._failed == self._settings.fail_after:
                logger.warning("point=<%s> | fault point reached, failing the commit", point)
                raise InjectedCommitError(f"injected failure at {point}")
        if self._settings.kill_at != point:
            return
        self._count += 1
        if self._count >= self._settings.kill_after:
            logger.warning(
                "point=<%s>, count=<%d> | fault point reached, killing", point, self._count
            )
            for handler in logging.getLogger().handlers:
                handler.flush()
            os.kill(os.getpid(), signal.SIGKILL)
