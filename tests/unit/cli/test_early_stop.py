"""SIGTERM before the service serves ends the process with status 0 and one line, not by the
signal's default action (status -15, which supervisors report as a crash)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import os, signal, time
from service.early_stop import exit_on_early_stop
exit_on_early_stop()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(30)
"""


def test_sigterm_while_starting_exits_with_status_0() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "cairn: SIGTERM before serving: stopped"


def test_without_it_the_same_signal_kills_the_process() -> None:
    """The test above can fail: the default action is what it replaces."""
    script = SCRIPT.replace("exit_on_early_stop()\n", "")
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == -15
