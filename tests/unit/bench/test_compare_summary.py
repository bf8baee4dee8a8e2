"""The comparison benchmark's arithmetic: CPU per step, percentiles per system, the table."""

from __future__ import annotations

import os
import time

from bench.compare_bench import (
    cpu_split,
    per_step_ms,
    process_tree_cpu_seconds,
    summarize_langgraph,
    table,
)


def _langgraph_report() -> dict[str, object]:
    return {
        "sessions": 128,
        "sessions_used": 130,
        "turns": 1300,
        "saturation": {
            "steps_per_s": 400.0,
            "steps": 6000,
            "checkpoints": 7714,
            "errors": 0,
            "process_cpu_util": 0.8,
            "database_cpu_util": 0.2,
        },
        "half_load": {
            "target_rate": 200.0,
            "steps_per_s": 199.0,
            "steps": 3000,
            "checkpoints": 3857,
            "errors": 0,
            "latencies_s": [0.001 * i for i in range(1, 101)],
            "process_cpu_util": 0.5,
            "database_cpu_util": None,
        },
    }


def test_cpu_per_step_is_cores_over_steps_per_second() -> None:
    assert per_step_ms(0.5, 1000.0) == 0.5
    assert per_step_ms(None, 1000.0) is None
    assert per_step_ms(0.5, 0.0) is None
    split = cpu_split({"runtime": 0.9, "store": 0.3, "driver": None}, 600.0)
    assert split == {"runtime": 1.5, "store": 0.5, "driver": None, "total": 2.0}


def test_langgraph_summary_takes_percentiles_of_the_half_load_steps() -> None:
    summary = summarize_langgraph(_langgraph_report())
    assert summary["latency_p50_ms"] == 51.0
    assert summary["latency_p99_ms"] == 100.0
    assert summary["cpu_ms_per_step_saturation"] == {
        "runtime": 2.0,
        "store": 0.5,
        "driver": None,
        "total": 2.5,
    }
    assert summary["cpu_ms_per_step_half_load"]["total"] == 2.513
    assert summary["turns_per_session"] == 10.0
    assert summary["checkpoints_per_step"] == 1.29


def test_table_has_a_column_per_system_that_ran_and_names_what_was_skipped() -> None:
    summary = summarize_langgraph(_langgraph_report())
    text = table({"langgraph_sqlite": summary, "langgraph_postgres": "no PostgreSQL server found"})
    lines = text.splitlines()
    assert lines[0].split() == ["LangGraph+SQLite"]
    saturation = next(line for line in lines if line.startswith("committed steps/s"))
    assert saturation.split()[-1] == "400.0"
    half = next(line for line in lines if line.startswith("half load"))
    assert half.endswith("199.0 (200.0)")
    assert lines[-1] == "skipped: LangGraph+Postgres: no PostgreSQL server found"


def test_process_tree_cpu_counts_at_least_the_process_itself() -> None:
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    assert process_tree_cpu_seconds(os.getpid()) >= 0.05
