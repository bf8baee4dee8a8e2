"""Local store write benchmark: the CPU the event loop spends putting committed records into a
partition's SQLite table, written after every commit or once per batch of commits.

The workload is the runtime bench's: sessions of short tool-calling turns, each step writing its
records through :class:`SessionWriter` (two messages, a version entry and body, the head) into a
:class:`SessionStore` over a :class:`SqliteTable` in a fresh folder. Steps are committed in
transactions of ``--steps-per-commit`` sessions (about 6 at half load, 70 at saturation, as
``make bench`` reports them), and the table is written every ``flush`` commits (1: after every
commit; the store's 0.05 s is about 11 commits at half load and 2 at saturation, 0.2 s 45 and 7),
the table unsynced as an owner's is (``synced``: with SQLite's syncs, as before). Only the
store's ``committed`` and ``flush`` calls are timed (process CPU, user and system: the WAL's
writes are system calls), runs interleaved across the variants, median of ``--runs``; the
longest single call (wall time, the median of the runs' longest) is how long the event loop
stalls on it.

A benchmark, not a test: it reports, it does not assert.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

from bench.state_bench import session_state, step_messages, text_pool
from service.runtime.records import RECORD_MAX_BYTES
from service.sessions import store as store_module
from service.sessions.store import SessionStore
from service.sessions.table import SqliteTable
from service.sessions.versions import Step
from service.sessions.writer import SessionWriter


def run(
    sessions: int, steps_per_commit: int, commits: int, flush_every: int, *, synced: bool
) -> tuple[float, float]:
    """Microseconds of process CPU per step spent in the store's committed and flush calls, and
    the longest of those calls in milliseconds (wall time: how long the event loop stalls)."""
    texts = text_pool()
    folder = Path(tempfile.mkdtemp(prefix="cairn-store-write-"))
    table = SqliteTable(folder, max_age_s=3600, durable_writes=synced)
    store = SessionStore(table)
    writer = SessionWriter(store, record_max_bytes=RECORD_MAX_BYTES)
    states = {}
    for n in range(sessions):
        session_id = f"session-{n:05d}"
        state, delivery = session_state(session_id, 8, texts)
        states[session_id] = state
        writer.write(state, 1, delivery)
    ids = list(states)
    position, spent, step, longest = 0, 0.0, 0, 0.0
    try:
        for commit in range(commits):
            rows, versions = [], {}
            for _ in range(steps_per_commit):
                session_id = ids[step % len(ids)]
                step += 1
                state = states[session_id].snapshot()
                state.messages.extend(step_messages(session_id, len(state.messages), texts))
                states[session_id] = state
                write = writer.write(state, step, step=Step(step, f"c{step}"))
                now_ms = int(time.time() * 1000)
                rows.extend((key, value, step, now_ms) for key, value in write.records)
                versions[session_id] = write.version
            position += len(rows)
            started, wall = time.process_time(), time.perf_counter()
            store.committed(rows, position, versions)
            if (commit + 1) % flush_every == 0:
                store.flush()
            spent += time.process_time() - started
            longest = max(longest, time.perf_counter() - wall)
        started = time.process_time()
        store.flush()
        spent += time.process_time() - started
    finally:
        table.close()
        shutil.rmtree(folder, ignore_errors=True)
    return spent / (commits * steps_per_commit) * 1e6, longest * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=600)
    parser.add_argument("--commits", type=int, default=900)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    # The store flushes only when told to here: every variant decides it by commit count.
    never = mock.patch.multiple(store_module, FLUSH_EVERY_S=float("inf"), FLUSH_ROWS=sys.maxsize)
    shapes = {"half load": (6, (1, 11, 45)), "saturation": (70, (1, 2, 7))}
    shipped = {"half load": 11, "saturation": 2}
    report: dict[str, dict[str, list[tuple[float, float]]]] = {}
    with never:
        for _ in range(args.runs):
            for shape, (per_commit, flushes) in shapes.items():
                commits = max(args.commits * 6 // per_commit, 60)
                variants = [(flush_every, False) for flush_every in flushes]
                for flush_every, synced in [*variants, (shipped[shape], True)]:
                    cost = run(args.sessions, per_commit, commits, flush_every, synced=synced)
                    name = f"{flush_every}{' synced' if synced else ''}"
                    report.setdefault(shape, {}).setdefault(name, []).append(cost)
    header = f"{'shape':<12}{'steps/commit':>14}{'commits/write':>15}{'us/step, median':>17}"
    print(f"{header}{'range':>14}{'longest call, ms':>18}")
    for shape, variants in report.items():
        for flush_every, runs in variants.items():
            costs = [cost for cost, _ in runs]
            longest = statistics.median(stall for _, stall in runs)
            print(
                f"{shape:<12}{shapes[shape][0]:>14}{flush_every:>15}"
                f"{statistics.median(costs):>17.1f}{min(costs):>7.1f}-{max(costs):<6.1f}"
                f"{longest:>18.1f}"
            )
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
