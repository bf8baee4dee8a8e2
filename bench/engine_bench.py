"""Engine benchmark: a two-tool-cycle turn with checkpointing on, ours against the reference SDK.

Reports invocations per second (median of several repetitions) for our engine, which decodes the
session state from bytes and encodes it back at every invocation, and for the reference keeping
its Agent in memory and restoring a fresh Agent from its FileSessionManager at every invocation.
Prints a table and one JSON object (also written to ``bench-results/engine.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import reference_venv

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_VENV = ROOT / ".cache" / "bench-ref-venv"
RESULTS = ROOT / "bench-results" / "engine.json"
TARGETS = {"reference_memory": 3.0, "reference_restore": 20.0}
"""Our median must be at least this many times the reference's median."""
QUOTED_REFERENCE = {"reference_memory": 1900.0, "reference_restore": 270.0}
"""The reference's figures as quoted in the issue; our wall-clock median is also compared to them
(the side-by-side ratios are the ones that count: both engines then share the machine's load)."""


CLOCKS = ("wall", "cpu")


def summary(samples: list[dict[str, float]]) -> dict[str, Any]:
    """Median, min and max of each clock's invocations/s over the repetitions."""
    out: dict[str, Any] = {}
    for clock in CLOCKS:
        values = [sample[clock] for sample in samples]
        out[clock] = {
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
            "samples": values,
        }
    return out


def run_ours(turns: int, warmup_turns: int, tool_kind: str) -> dict[str, float]:
    from bench import cairn_engine  # imported late: --reference-only must work without it

    return asyncio.run(cairn_engine.measure(turns, warmup_turns, tool_kind))


def collect(args: argparse.Namespace) -> dict[str, Any]:
    python = reference_venv.ensure_venv(args.venv)
    ours: list[dict[str, float]] = []
    memory: list[dict[str, float]] = []
    restore: list[dict[str, float]] = []
    reference_version = ""
    # One repetition of each engine in turn, so background load on a shared machine hits all
    # three alike; the reference gets a fresh subprocess (import time is never timed).
    for repetition in range(args.repeats):
        if not args.reference_only:
            ours.append(run_ours(args.turns, args.warmup_turns, args.tool))
        report = reference_venv.run_reference(
            python,
            turns=args.turns,
            repeats=1,
            warmup_turns=args.warmup_turns,
            modes=["memory", "restore"],
            tool=args.tool,
        )
        reference_version = report["version"]
        memory += report["invocations_per_s"]["memory"]
        restore += report["invocations_per_s"]["restore"]
        print(f"repetition {repetition + 1}/{args.repeats} done", file=sys.stderr)
    results: dict[str, Any] = {
        "benchmark": "engine",
        "scenario": "2 tool cycles, checkpointing on, 5 invocations per turn, zero-latency model",
        "unit": "invocations/s (wall: per wall-clock second; cpu: per CPU second of the process)",
        "tool": args.tool,
        "turns_per_repetition": args.turns,
        "repetitions": args.repeats,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "load_average": list(os.getloadavg()),
        "reference": {
            "package": f"strands-agents=={reference_version}",
            "memory": summary(memory),
            "restore": summary(restore),
        },
    }
    if ours:
        results["ours"] = summary(ours)
        results["ratios"] = {
            clock: {
                f"reference_{mode}": results["ours"][clock]["median"]
                / results["reference"][mode][clock]["median"]
                for mode in ("memory", "restore")
            }
            for clock in CLOCKS
        }
        wall_median = results["ours"]["wall"]["median"]
        results["ratios_to_quoted_reference"] = {
            key: wall_median / figure for key, figure in QUOTED_REFERENCE.items()
        }
        results["targets"] = TARGETS
        # Met only when met on both clocks: load can flatter either one.
        results["targets_met"] = all(
            results["ratios"][clock][key] >= target
            for clock in CLOCKS
            for key, target in TARGETS.items()
        )
    return results


def table(results: dict[str, Any]) -> str:
    header = ("engine", "wall inv/s (min-max)", "cpu inv/s", "ours/this wall", "cpu", "target")
    rows = [header]
    ours = results.get("ours")
    if ours:
        rows.append(("ours (decode+encode per inv)", _range(ours["wall"]), _median(ours["cpu"])))
    labels = (("memory", "reference, Agent in memory"), ("restore", "reference, restore per inv"))
    for mode, label in labels:
        figures = results["reference"][mode]
        key = f"reference_{mode}"
        rows.append(
            (
                label,
                _range(figures["wall"]),
                _median(figures["cpu"]),
                f"{results['ratios']['wall'][key]:.1f}x" if ours else "-",
                f"{results['ratios']['cpu'][key]:.1f}x" if ours else "-",
                f">= {TARGETS[key]:g}x",
            )
        )
    widths = [max(len(row[i]) if i < len(row) else 0 for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def _median(figures: dict[str, Any]) -> str:
    return f"{figures['median']:,.0f}"


def _range(figures: dict[str, Any]) -> str:
    return f"{figures['median']:,.0f} ({figures['min']:,.0f}-{figures['max']:,.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=100, help="turns per repetition")
    parser.add_argument("--repeats", type=int, default=5, help="repetitions (medians are taken)")
    parser.add_argument("--warmup-turns", type=int, default=5)
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="reference venv")
    parser.add_argument(
        "--tool",
        choices=("sync", "async"),
        default="sync",
        help="the scenario's tool as a plain function (run on a worker thread) or a coroutine",
    )
    parser.add_argument("--reference-only", action="store_true", help="skip our engine")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--profile", action="store_true", help="cProfile our engine")
    args = parser.parse_args()
    if args.profile:
        from bench import cairn_engine

        print(cairn_engine.profile(args.turns, args.tool))
        return
    started = time.monotonic()
    results = collect(args)
    results["wall_s"] = round(time.monotonic() - started, 1)
    print(table(results))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results))
    if args.check and not results.get("targets_met", False):
        sys.exit(1)


if __name__ == "__main__":
    main()
