"""A stop asked for before the service serves: SIGTERM or SIGINT while it starts exits at once
with status 0 and one line.

Until the event loop installs its own handlers (which drain owned partitions), a SIGTERM would
otherwise end the process by the signal's default action (status -15, reported by orchestrators
and supervisors as a crash), and a Ctrl-C would print a traceback from wherever the start was,
although nothing was owned and nothing is lost.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType


def _stopped(signum: int, frame: FrameType | None) -> None:
    del frame
    print(f"cairn: {signal.Signals(signum).name} before serving: stopped", file=sys.stderr)
    raise SystemExit(0)


def exit_on_early_stop() -> None:
    """SIGTERM and SIGINT end the process quietly, with status 0, until the event loop takes
    them over."""
    signal.signal(signal.SIGTERM, _stopped)
    signal.signal(signal.SIGINT, _stopped)
