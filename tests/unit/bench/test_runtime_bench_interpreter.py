"""The runtime benchmark names the Python it ran on, whose build moves every CPU figure."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

from bench.runtime_bench import interpreter, table


def test_the_interpreter_is_the_running_one_and_its_library_linking_is_read_from_memory() -> None:
    found = interpreter()
    assert found["version"] == platform.python_version()
    assert Path(found["executable"]).resolve() == Path(sys._base_executable).resolve()
    mapped = Path("/proc/self/maps").read_text()
    assert found["libpython_shared"] is ("libpython" in mapped)


def test_the_table_shows_the_interpreter() -> None:
    phase = {
        "steps_per_s": 1.0,
        "service_cpu_ms_per_step": 0.3,
        "service_cpu_util": 0.9,
        "broker_cpu_util": 0.1,
        "driver_cpu_util": 0.1,
        "machine_cpu_util": 1.1,
        "load_average_1m": 1.0,
        "commit": {},
        "target_rate": 1.0,
        "latency_p50_ms": 1.0,
        "latency_p99_ms": 1.0,
    }
    report = {
        "saturation": phase,
        "half_load": phase,
        "takeover": {"seconds": 1.0},
        "interpreter": {"version": "3.11.2", "executable": "/x", "libpython_shared": False},
    }
    assert "3.11.2, libpython static" in table(report)
