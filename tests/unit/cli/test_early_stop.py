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


def _default_signals() -> None:
    # A shell without job control starts a background command with SIGINT ignored, and Python
    # then installs no KeyboardInterrupt handler: the child starts from the defaults instead.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run(script: str, sent: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script.format(signal=sent)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        preexec_fn=_default_signals,
    )


@pytest.mark.parametrize("sent", ["SIGTERM", "SIGINT"])
def test_a_stop_while_starting_exits_with_status_0(sent: str) -> None:
    done = _run(SCRIPT, sent)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == f"cairn: {sent} before serving: stopped"


FINALIZER_SCRIPT = """
import os, signal, sys
from service.early_stop import exit_on_early_stop
exit_on_early_stop()

class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100_000):  # the handler runs here, inside the finalizer
            pass

Finalized()
sys.exit(3)
"""


def test_a_stop_that_lands_where_exceptions_are_ignored_still_stops() -> None:
    """Python runs the handler wherever the main thread is. An exception raised inside a
    finalizer (or an import lock's callback, or a C extension's initialisation) is printed as
    ignored, or worse: the handler must end the process without raising."""
    done = _run(FINALIZER_SCRIPT, "SIGTERM")
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "cairn: SIGTERM before serving: stopped"


def test_what_was_printed_before_the_stop_is_not_lost() -> None:
    script = SCRIPT.replace("os.kill(", "print('topics created')\nos.kill(")
    done = subprocess.run(
        [sys.executable, "-c", script.format(signal="SIGTERM")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        preexec_fn=_default_signals,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "topics created\n"


def test_without_it_the_same_signals_kill_the_process_or_print_a_traceback() -> None:
    """The test above can fail: the default actions are what it replaces."""
    script = SCRIPT.replace("exit_on_early_stop()\n", "")
    assert _run(script, "SIGTERM").returncode == -15
    done = _run(script, "SIGINT")
    assert done.returncode != 0
    assert "Traceback" in done.stderr and "KeyboardInterrupt" in done.stderr


def test_the_console_script_entry_imports_nothing_heavy_before_the_handlers() -> None:
    """The ``cairn`` script imports its entry module before calling it: that import must not
    pull in the command line (seconds of imports during which a stop would kill the process)."""
    script = (
        "import sys, signal\n"
        "import service.console\n"
        "heavy = [m for m in ('service.cli', 'aiokafka', 'pydantic') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
