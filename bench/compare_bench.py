"""Cairn against LangGraph with its SQLite and its Postgres checkpointer, on the same turns.

The turn, for all three: a scripted zero-latency model calls a zero-latency async tool three
times, then answers, and every step is checkpointed. Cairn runs it as ``make bench`` does (the
``bench`` agent: one service process beside a local single-node broker started for the run,
checkpointing on; ``bench/runtime_bench.py`` drives it). LangGraph runs it as a graph of an
``agent`` node asking a scripted model and a ``ToolNode`` running the tool
(``bench/langgraph_runner.py``), in a scratch virtualenv this benchmark creates
(``.cache/bench-langgraph-venv``, the versions pinned below), once with ``AsyncSqliteSaver``
(a file on local disk) and once with ``AsyncPostgresSaver`` over a psycopg pool against a
PostgreSQL started for the run from Debian's binaries (``initdb`` into a temporary folder, its
unix socket there, a free TCP port on 127.0.0.1, which the checkpointer connects to as Cairn's
clients connect to the broker; stopped and removed afterwards, also after a failure). Each store
runs with its own defaults: SQLite and PostgreSQL flush their write-ahead log to disk at every
commit; the Kafka broker acknowledges a transaction once it is in its page cache.

A step is one committed checkpoint boundary after a model call or after a tool round: seven per
turn (four model calls, three tool rounds), the same work in all three.

- Cairn: one invocation, i.e. one command (``invoke`` or ``resume``) whose result and session
  state are committed in the partition's Kafka transaction; counted when the result is visible
  to a ``read_committed`` reader. Its latency runs from publishing the command to then.
- LangGraph: one super-step that ran ``agent`` or ``tools``, with ``durability="sync"`` (the
  checkpoint is saved before the next super-step starts); counted when the checkpointer's
  ``aput`` of its checkpoint returns. Its latency runs from the moment the step could start (the
  previous step's checkpoint committed, or ``ainvoke`` called for a turn's first step) to then.
  Every turn also saves two checkpoints that are no step of their own: the ``input`` checkpoint
  and the one after the ``__start__`` super-step that moves the prompt into the state; both
  belong to the turn's first step (its latency and CPU include them) and are counted in the
  report as ``checkpoints``.

Phases, for each system in turn (never two at once): saturation, a closed loop in which every
session starts its next step (LangGraph: its next turn) as soon as the last one is committed;
then latency at ``--load`` (half) of that system's own saturation, an open loop (Cairn: commands
at that rate; LangGraph: turns at a seventh of it, each on an idle session). Both phases run
``--warmup`` seconds before ``--duration`` seconds of measuring; the Cairn phases follow a
minute of traffic that warms the fresh broker (``--broker-warmup``). Concurrency (sessions in
the closed loop): Cairn 600, as ``make bench`` (one service process, 6 partitions, each
partition's commit carrying dozens of steps at saturation); LangGraph 128 in one process on one
event loop. Both LangGraph checkpointers hold one asyncio lock around every database operation,
so a process runs one at a time (the pool of ``--pool-size`` connections does not change that)
and its throughput stops growing at about 64 sessions; 128 also keeps its conversations about
as long as Cairn's by the end of the run (``turns per session``; LangGraph's checkpoints copy
the whole message list, so their cost grows with it). Latency is per step, p50 and p99. CPU
per step is each process's CPU over a phase divided by the steps committed in it: Cairn's
service, broker and driver (this process); the LangGraph process (graph, checkpointer client,
driver, and SQLite itself) and PostgreSQL (the postmaster and every backend). Prints a table
and writes JSON (``--out``, by default bench-results/compare.json). A benchmark, not a test: it
reports, it does not assert.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import importlib
import json
import os
import platform
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import runtime_bench

REPO = Path(__file__).resolve().parents[1]
RUNNER = REPO / "bench" / "langgraph_runner.py"
DEFAULT_VENV = REPO / ".cache" / "bench-langgraph-venv"
RESULTS = REPO / "bench-results" / "compare.json"
LANGGRAPH_REQUIREMENTS = (
    "langgraph==1.2.24",
    "langgraph-checkpoint==4.3.2",
    "langgraph-checkpoint-sqlite==3.1.2",
    "langgraph-checkpoint-postgres==3.2.0",
    "langchain-core==1.8.3",
    "aiosqlite==0.22.1",
    "psycopg==3.3.9",
    "psycopg-binary==3.3.9",
    "psycopg-pool==3.3.3",
)
POSTGRES_GLOB = "/usr/lib/postgresql/*/bin/initdb"
SYSTEMS = ("cairn", "langgraph_sqlite", "langgraph_postgres")
Snapshot = tuple[float, float, float | None, float]
"""perf_counter, CPU seconds of the LangGraph process, of the database, busy seconds of the
machine."""
TITLES = {
    "cairn": "Cairn",
    "langgraph_sqlite": "LangGraph+SQLite",
    "langgraph_postgres": "LangGraph+Postgres",
}


# ---- the LangGraph virtualenv -----------------------------------------------------------------


def pinned() -> dict[str, str]:
    return dict(requirement.split("==") for requirement in LANGGRAPH_REQUIREMENTS)


def installed_versions(python: Path) -> dict[str, str | None]:
    code = (
        "import json, sys\n"
        "from importlib.metadata import PackageNotFoundError, version\n"
        "def get(name):\n"
        "    try:\n"
        "        return version(name)\n"
        "    except PackageNotFoundError:\n"
        "        return None\n"
        "print(json.dumps({name: get(name) for name in sys.argv[1:]}))\n"
    )
    probe = subprocess.run(
        [str(python), "-c", code, *pinned()], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        return dict.fromkeys(pinned())
    found: dict[str, str | None] = json.loads(probe.stdout)
    return found


def ensure_venv(venv: Path) -> Path:
    """The venv's python, after creating the venv or installing the pinned versions if needed."""
    python = venv / "bin" / "python"
    if python.exists() and installed_versions(python) == pinned():
        return python
    print(f"installing LangGraph into {venv} (first run only)", file=sys.stderr, flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *LANGGRAPH_REQUIREMENTS,
        ],
        check=True,
    )
    found = installed_versions(python)
    if found != pinned():
        raise RuntimeError(f"{venv} holds {found}, not the pinned {pinned()}")
    return python


# ---- a PostgreSQL of our own ------------------------------------------------------------------


@dataclass
class Postgres:
    dsn: str
    pid: int
    version: str


def postgres_bin_dir(explicit: Path | None) -> Path | None:
    """The newest Debian PostgreSQL server installed (or ``explicit``), None when there is none."""
    if explicit is not None:
        return explicit if (explicit / "initdb").exists() else None

    def major(path: Path) -> float:
        number = path.parents[1].name
        return float(number) if re.fullmatch(r"[0-9.]+", number) else 0.0

    found = sorted((Path(path) for path in glob.glob(POSTGRES_GLOB)), key=major)
    return found[-1].parent if found else None


def _server_user() -> tuple[int, int] | None:
    """PostgreSQL refuses to run as root: as root, run it as ``postgres`` (or ``nobody``)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(name)
            return entry.pw_uid, entry.pw_gid
    raise RuntimeError("running as root and there is no postgres or nobody user to run as")


def process_tree_cpu_seconds(pid: int) -> float:
    """CPU of a process, of its children that exited (reaped) and of its live children."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    total = sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            child = stat.read_text().rsplit(")", 1)[1].split()
            if int(child[1]) == pid:
                total += int(child[11]) + int(child[12])
    return total / runtime_bench.CLK_TCK


@contextlib.contextmanager
def local_postgres(bin_dir: Path, settings: Sequence[str] = ()) -> Iterator[Postgres]:
    """initdb into a temporary folder, start on a free port, create the database; stop the
    server and remove the folder afterwards, also when the body fails."""
    sys.path.insert(0, str(REPO / "deploy" / "local-kafka"))
    free_port = importlib.import_module("kafka_local").free_port
    base = Path(tempfile.mkdtemp(prefix="cairn-bench-pg-"))
    data = base / "data"
    log = base / "server.log"
    owner = _server_user()
    run_as: dict[str, Any] = {}
    if owner is not None:
        os.chown(base, *owner)
        run_as = {"user": owner[0], "group": owner[1], "extra_groups": []}
    port = free_port()
    started = False

    def run(*command: str) -> str:
        done = subprocess.run(
            command, capture_output=True, text=True, check=False, cwd=base, **run_as
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")
        return str(done.stdout)

    try:
        run(str(bin_dir / "initdb"), "-D", str(data), "-U", "bench", "--auth=trust", "-E", "UTF8")
        options = " ".join(
            [f"-p {port} -k {base} -c listen_addresses=127.0.0.1"]
            + [f"-c {setting}" for setting in settings]
        )
        run(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "start")
        started = True
        run(str(bin_dir / "createdb"), "-h", str(base), "-p", str(port), "-U", "bench", "bench")
        pid = int((data / "postmaster.pid").read_text().splitlines()[0])
        version = run(str(bin_dir / "postgres"), "--version").strip()
        yield Postgres(f"host=127.0.0.1 port={port} user=bench dbname=bench", pid, version)
    finally:
        if started:
            try:
                run(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")
            except RuntimeError as error:
                print(f"stopping postgres: {error}", file=sys.stderr)
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int((data / "postmaster.pid").read_text().splitlines()[0]), 9)
        shutil.rmtree(base, ignore_errors=True)


# ---- the runs ---------------------------------------------------------------------------------


def run_cairn(args: argparse.Namespace) -> dict[str, Any]:
    argv = [
        "--sessions",
        str(args.cairn_sessions),
        "--duration",
        str(args.duration),
        "--warmup",
        str(args.warmup),
        "--load",
        str(args.load),
        "--broker-warmup",
        str(args.broker_warmup),
        "--skip-once",
        "--skip-takeover",
    ]
    cairn_args = runtime_bench.arguments().parse_args(argv)
    with runtime_bench.broker({}) as (bootstrap, broker_pid):
        pid = broker_pid or args.broker_pid
        report = asyncio.run(
            runtime_bench.bench(cairn_args, bootstrap, pid, fresh_broker=broker_pid is not None)
        )
    report["sessions"] = args.cairn_sessions
    return report


def run_langgraph(
    python: Path, args: argparse.Namespace, backend_args: list[str], database_pid: int | None
) -> dict[str, Any]:
    """Run the LangGraph side in its venv; read the CPU of it (and of the database) while each
    of its measuring windows is open."""
    command = [
        str(python),
        str(RUNNER),
        *backend_args,
        "--sessions",
        str(args.langgraph_sessions),
        "--duration",
        str(args.duration),
        "--warmup",
        str(args.warmup),
        "--load",
        str(args.load),
        "--pool-size",
        str(args.pool_size),
    ]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    opened: dict[str, Snapshot] = {}
    usage: dict[str, dict[str, float | None]] = {}
    report: dict[str, Any] | None = None

    def snapshot() -> Snapshot:
        return (
            time.perf_counter(),
            runtime_bench.cpu_seconds(proc.pid),
            process_tree_cpu_seconds(database_pid) if database_pid else None,
            runtime_bench.machine_busy_seconds(),
        )

    try:
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                print(line, end="", file=sys.stderr)
                continue
            if event.get("event") == "window" and event["state"] == "open":
                opened[event["phase"]] = snapshot()
            elif event.get("event") == "window":
                usage[event["phase"]] = utilisation(opened.pop(event["phase"]), snapshot())
                usage[event["phase"]]["load_average_1m"] = round(os.getloadavg()[0], 2)
            elif event.get("event") == "report":
                report = {key: value for key, value in event.items() if key != "event"}
    finally:
        if proc.poll() is None and report is None:
            proc.kill()
        code = proc.wait()
    if code != 0 or report is None:
        raise RuntimeError(f"the LangGraph run failed (exit {code})")
    for phase, figures in usage.items():
        report[phase].update(figures)
    return report


def utilisation(before: Snapshot, after: Snapshot) -> dict[str, float | None]:
    """Cores used between two snapshots: the LangGraph process, the database, the machine."""
    elapsed = after[0] - before[0]
    database = (
        (after[2] - before[2]) / elapsed if after[2] is not None and before[2] is not None else None
    )
    return {
        "process_cpu_util": (after[1] - before[1]) / elapsed,
        "database_cpu_util": database,
        "machine_cpu_util": (after[3] - before[3]) / elapsed,
    }


# ---- the summary ------------------------------------------------------------------------------


def per_step_ms(util: float | None, steps_per_s: float) -> float | None:
    """CPU milliseconds per step from cores used and steps per second."""
    if util is None or steps_per_s <= 0:
        return None
    return round(util / steps_per_s * 1000, 3)


def cpu_split(parts: dict[str, float | None], steps_per_s: float) -> dict[str, float | None]:
    split = {name: per_step_ms(util, steps_per_s) for name, util in parts.items()}
    known = [value for value in split.values() if value is not None]
    split["total"] = round(sum(known), 3) if known else None
    return split


def summarize_cairn(report: dict[str, Any]) -> dict[str, Any]:
    sat, half = report["saturation"], report["half_load"]

    def parts(phase: dict[str, Any]) -> dict[str, float | None]:
        return {
            "runtime": phase["service_cpu_util"],
            "store": phase["broker_cpu_util"],
            "driver": phase["driver_cpu_util"],
        }

    return {
        "concurrency": report["sessions"],
        "saturation_steps_per_s": sat["steps_per_s"],
        "saturation_errors": sat["errors"],
        "half_load_target_steps_per_s": half["target_rate"],
        "half_load_steps_per_s": half["steps_per_s"],
        "latency_p50_ms": half["latency_p50_ms"],
        "latency_p99_ms": half["latency_p99_ms"],
        "cpu_ms_per_step_saturation": cpu_split(parts(sat), sat["steps_per_s"]),
        "cpu_ms_per_step_half_load": cpu_split(parts(half), half["steps_per_s"]),
        "machine_cpu_util_saturation": sat["machine_cpu_util"],
        "load_average_1m_saturation": sat["load_average_1m"],
        "turns_per_session": report.get("turns_per_session"),
    }


def summarize_langgraph(report: dict[str, Any]) -> dict[str, Any]:
    sat, half = report["saturation"], report["half_load"]
    latencies = half["latencies_s"]

    def parts(phase: dict[str, Any]) -> dict[str, float | None]:
        return {
            "runtime": phase.get("process_cpu_util"),
            "store": phase.get("database_cpu_util"),
            "driver": None,
        }

    return {
        "concurrency": report["sessions"],
        "saturation_steps_per_s": sat["steps_per_s"],
        "saturation_errors": sat["errors"],
        "half_load_target_steps_per_s": half["target_rate"],
        "half_load_steps_per_s": half["steps_per_s"],
        "latency_p50_ms": round(runtime_bench.percentile(latencies, 0.5) * 1000, 2),
        "latency_p99_ms": round(runtime_bench.percentile(latencies, 0.99) * 1000, 2),
        "cpu_ms_per_step_saturation": cpu_split(parts(sat), sat["steps_per_s"]),
        "cpu_ms_per_step_half_load": cpu_split(parts(half), half["steps_per_s"]),
        "machine_cpu_util_saturation": _round(sat.get("machine_cpu_util")),
        "load_average_1m_saturation": sat.get("load_average_1m"),
        "turns_per_session": round(report["turns"] / max(report["sessions_used"], 1), 1),
        "checkpoints_per_step": round(
            (sat["checkpoints"] + half["checkpoints"]) / max(sat["steps"] + half["steps"], 1), 2
        ),
    }


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 10 else f"{value:,.1f}"
    return str(value)


def table(summaries: dict[str, dict[str, Any] | str]) -> str:
    """Metrics down, systems across; below, why a system was skipped."""

    ran = {system: summary for system, summary in summaries.items() if isinstance(summary, dict)}
    columns = [system for system in SYSTEMS if system in ran]

    def row(label: str, pick: Any) -> list[str]:
        return [label, *(_cell(pick(ran[system])) for system in columns)]

    def cpu(phase: str, part: str) -> Any:
        return lambda s: s[f"cpu_ms_per_step_{phase}"][part]

    rows = [
        ["", *(TITLES[system] for system in columns)],
        row("sessions (closed loop)", lambda s: s["concurrency"]),
        row("committed steps/s at saturation", lambda s: s["saturation_steps_per_s"]),
        row(
            "  machine CPU busy (cores, all processes)", lambda s: s["machine_cpu_util_saturation"]
        ),
        row("  load average (1 min) at its end", lambda s: s["load_average_1m_saturation"]),
        row("  CPU ms per step: runtime process", cpu("saturation", "runtime")),
        row("                   store server", cpu("saturation", "store")),
        row("                   driver", cpu("saturation", "driver")),
        row("                   all of them", cpu("saturation", "total")),
        row(
            "half load: steps/s done (asked)",
            lambda s: (
                f"{_cell(s['half_load_steps_per_s'])} ({_cell(s['half_load_target_steps_per_s'])})"
            ),
        ),
        row("  latency per step p50 (ms)", lambda s: s["latency_p50_ms"]),
        row("  latency per step p99 (ms)", lambda s: s["latency_p99_ms"]),
        row("  CPU ms per step, all processes", cpu("half_load", "total")),
        row("turns per session at the end", lambda s: s["turns_per_session"]),
    ]
    skipped = [
        f"{TITLES[system]}: {summary}"
        for system, summary in summaries.items()
        if isinstance(summary, str)
    ]
    widths = [max(len(cells[i]) for cells in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i])
            for i, cell in enumerate(cells)
        ).rstrip()
        for cells in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines + [f"skipped: {line}" for line in skipped])


# ---- main -------------------------------------------------------------------------------------


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=15.0, help="seconds measured per phase")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before each phase")
    parser.add_argument("--load", type=float, default=0.5, help="fraction of saturation")
    parser.add_argument(
        "--broker-warmup", type=float, default=60.0, help="seconds of traffic on the fresh broker"
    )
    parser.add_argument("--cairn-sessions", type=int, default=600)
    parser.add_argument("--langgraph-sessions", type=int, default=128)
    parser.add_argument(
        "--pool-size", type=int, default=4, help="connections in the Postgres checkpointer's pool"
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=SYSTEMS,
        help="run only this system (repeatable); the others are left out of the table",
    )
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="LangGraph's venv")
    parser.add_argument(
        "--postgres-bin",
        type=Path,
        default=None,
        help=f"folder of initdb (default {POSTGRES_GLOB})",
    )
    parser.add_argument(
        "--postgres-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting of the PostgreSQL started for the run, e.g. synchronous_commit=off",
    )
    parser.add_argument(
        "--sqlite-synchronous",
        choices=("OFF", "NORMAL", "FULL", "EXTRA"),
        default=None,
        help="PRAGMA synchronous of the SQLite checkpointer's connection (default FULL)",
    )
    parser.add_argument("--broker-pid", type=int, default=None, help="external broker's pid")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def main() -> int:
    args = parse()
    systems = args.only or list(SYSTEMS)
    started = time.monotonic()
    raw: dict[str, Any] = {}
    summaries: dict[str, dict[str, Any] | str] = {}
    python = None
    if any(system.startswith("langgraph") for system in systems):
        python = ensure_venv(args.venv)
    bin_dir = postgres_bin_dir(args.postgres_bin)
    if "langgraph_postgres" in systems and bin_dir is None:
        message = (
            f"no PostgreSQL server found ({args.postgres_bin or POSTGRES_GLOB}); install it with "
            "`apt-get install postgresql` (Debian) or pass --postgres-bin DIR"
        )
        print(f"skipping LangGraph+Postgres: {message}", file=sys.stderr)
        summaries["langgraph_postgres"] = message
    if "cairn" in systems:
        print("cairn: starting", file=sys.stderr, flush=True)
        raw["cairn"] = run_cairn(args)
        summaries["cairn"] = summarize_cairn(raw["cairn"])
    if "langgraph_sqlite" in systems and python is not None:
        print("langgraph+sqlite: starting", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="cairn-bench-sqlite-") as folder:
            backend = ["--backend", "sqlite", "--sqlite-path", str(Path(folder) / "lg.sqlite")]
            if args.sqlite_synchronous:
                backend += ["--sqlite-synchronous", args.sqlite_synchronous]
            raw["langgraph_sqlite"] = run_langgraph(python, args, backend, None)
        summaries["langgraph_sqlite"] = summarize_langgraph(raw["langgraph_sqlite"])
    if "langgraph_postgres" in systems and python is not None and bin_dir is not None:
        print("langgraph+postgres: starting", file=sys.stderr, flush=True)
        with local_postgres(bin_dir, args.postgres_setting) as postgres:
            backend = ["--backend", "postgres", "--postgres-dsn", postgres.dsn]
            raw["langgraph_postgres"] = run_langgraph(python, args, backend, postgres.pid)
            raw["langgraph_postgres"]["server"] = postgres.version
        summaries["langgraph_postgres"] = summarize_langgraph(raw["langgraph_postgres"])
    for report in raw.values():
        for phase in ("saturation", "half_load"):
            if isinstance(report.get(phase), dict):
                report[phase].pop("latencies_s", None)
    results = {
        "benchmark": "compare",
        "step": "one committed checkpoint boundary after a model call or a tool round, "
        "seven per turn (see bench/compare_bench.py)",
        "latency": "per step, in the open loop at half of the system's own saturation",
        "cpu": "milliseconds of each process's CPU per committed step",
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "load": args.load,
        "postgres_settings": args.postgres_setting,
        "sqlite_synchronous": args.sqlite_synchronous or "FULL (SQLite's default)",
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_average": list(os.getloadavg()),
        "langgraph_requirements": list(LANGGRAPH_REQUIREMENTS),
        "summary": summaries,
        "raw": raw,
        "wall_s": round(time.monotonic() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(table(summaries))
    print(f"\nJSON: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
