"""Runs the reference SDK in its own scratch virtualenv, creating that virtualenv when missing.

The reference is never imported into this process: it runs as a subprocess that prints JSON, so
it can never become a dependency of the product.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

REFERENCE_REQUIREMENT = "strands-agents==1.62.0"
REFERENCE_VERSION = REFERENCE_REQUIREMENT.split("==")[1]
BENCH_DIR = Path(__file__).resolve().parent
RUNNER = BENCH_DIR / "reference_engine.py"


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def installed_version(venv: Path) -> str | None:
    python = venv_python(venv)
    if not python.exists():
        return None
    code = "from importlib.metadata import version; print(version('strands-agents'))"
    probe = subprocess.run(
        [str(python), "-c", code],
        capture_output=True,
        text=True,
        check=False,
    )
    return probe.stdout.strip() if probe.returncode == 0 else None


def ensure_venv(venv: Path) -> Path:
    """Return the venv's python, creating the venv and installing the reference if needed."""
    if installed_version(venv) == REFERENCE_VERSION:
        return venv_python(venv)
    logger.info("venv=<%s>, requirement=<%s> | creating virtualenv", venv, REFERENCE_REQUIREMENT)
    print(f"creating {venv} with {REFERENCE_REQUIREMENT} (first run only)", file=sys.stderr)
    if not venv_python(venv).exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv_python(venv)), "-m", "pip", "install", "--quiet", REFERENCE_REQUIREMENT],
        check=True,
    )
    found = installed_version(venv)
    if found != REFERENCE_VERSION:
        raise RuntimeError(f"reference virtualenv {venv} has strands-agents {found!r}")
    return venv_python(venv)


def run_reference(
    python: Path, *, turns: int, repeats: int, warmup_turns: int, modes: list[str], tool: str
) -> dict[str, Any]:
    """Time the reference in a subprocess; its last stdout line is the JSON report."""
    command = [
        str(python),
        str(RUNNER),
        "--turns",
        str(turns),
        "--repeats",
        str(repeats),
        "--warmup-turns",
        str(warmup_turns),
        "--tool",
        tool,
        "--modes",
        *modes,
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"reference run failed ({done.returncode}):\n{done.stderr[-4000:]}")
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report
