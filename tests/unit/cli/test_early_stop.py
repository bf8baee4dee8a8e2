"""SIGTERM or SIGINT before the service serves ends the process with status 0 and one line, not
by the signal's default action (status -15, which supervisors report as a crash) or a
traceback."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

SCRIPT = """
import os, signal, time
from service.early_stop import exit_on_early_stop
exit_on_early_stop()
os.kill(os.getpid(), signal.{signal})
time.sleep(30)
"""


@pytest.mark.parametrize("sent", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_while_starting_exits_with_status_0(sent: signal.Signals) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(signal=sent.name)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == f"cairn: {sent.name} before serving: stopped"


def test_without_it_the_same_signals_kill_the_process_or_print_a_traceback() -> None:
    """The test above can fail: the default actions are what it replaces."""
    script = SCRIPT.replace("exit_on_early_stop()\n", "")
    done = subprocess.run(
        [sys.executable, "-c", script.format(signal="SIGTERM")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == -15
    done = subprocess.run(
        [sys.executable, "-c", script.format(signal="SIGINT")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode != 0
    assert "Traceback" in done.stderr and "KeyboardInterrupt" in done.stderr
