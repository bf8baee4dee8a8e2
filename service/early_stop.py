"""A stop asked for before the service serves: SIGTERM or SIGINT while it starts exits at once
with status 0 and one line.

Until the event loop installs its own handlers (which drain owned partitions), a SIGTERM would
otherwise end the process by the signal's default action (status -15, reported by orchestrators
and supervisors as a crash), and a Ctrl-C would print a traceback from wherever the start was,
although nothing was owned and nothing is lost.

The handler ends the process with ``os._exit`` instead of raising ``SystemExit``: Python runs it
wherever the main thread is, and an exception raised there unwinds through code that never
expects one. Inside a C extension's initialisation (orjson's, among the start's imports) that
ended the process with a segmentation fault, and inside a finalizer or an import lock's callback
the exception is printed as ignored and the start goes on as if no signal had come.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from types import FrameType


def _stopped(signum: int, frame: FrameType | None) -> None:
    del frame
    line = f"cairn: {signal.Signals(signum).name} before serving: stopped\n"
    for stream in (sys.stdout, sys.stderr):
        # What was printed before the signal; a stream the signal interrupted mid-write refuses
        # a reentrant flush, and its buffer is then lost with the process.
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(OSError):
        os.write(2, line.encode())
    os._exit(0)


def exit_on_early_stop() -> None:
    """SIGTERM and SIGINT end the process quietly, with status 0, until the event loop takes
    them over."""
    signal.signal(signal.SIGTERM, _stopped)
    signal.signal(signal.SIGINT, _stopped)
