"""Local store benchmark: SQLite (stdlib) against RocksDB (rocksdict) for the session store.

The store is a cache materialized from a Kafka changelog. The workload imitates one:

* keys are bytes: a session id (32 hex characters, the session head) or session id + ``b"\\x00"``
  + ``b"m%010d"`` (one history record);
* every session has one head of 1 KiB to 200 KiB (log-uniform), rewritten after every 25 history
  records, and 200 history records of 1.5 to 2.5 KiB; 64 sessions are active at a time and their
  records interleave in log order, so keys arrive in no sorted order and heads are overwritten;
* half of the values are ``os.urandom`` (as incompressible as the zlib output they stand for),
  the other half repetitive JSON-ish text (which a compressing store shrinks; SQLite does not).

Measured for each candidate, in a fresh directory per run, runs interleaved across candidates:

* restore: apply every record in log order, ~1,000 records per transaction / write batch, each
  batch also storing the changelog offset it completes, then a final durable flush (SQLite:
  ``wal_checkpoint(TRUNCATE)``; RocksDB: memtable flush). MB/s counts key + value bytes (10^6);
* file size: every file in the store's directory after the restore and close;
* point reads: random existing keys after a reopen, with the store's files first evicted from the
  page cache (fsync + ``posix_fadvise(DONTNEED)``; the host may still cache, hence "cold-ish");
* prefix reads: all 201 keys of one random session (range ``[id, id + b"\\x01")``), same reopen;
* small commits: a head rewrite and two history records per transaction, as normal operation.

Prints a table per candidate (median of the runs, with min and max) and one JSON object (also
written to ``bench-results/store_choice.json``). RocksDB is skipped when rocksdict is missing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

KIB = 1024
MB = 1_000_000
HISTORY_PER_SESSION = 200
HEAD_REWRITE_EVERY = 25
ACTIVE_SESSIONS = 64
BATCH_RECORDS = 1_000
POINT_READS = 20_000
PREFIX_READS = 100
SMALL_COMMITS = 1_000

Record = tuple[bytes, bytes]

TEXT = (
    b'{"role":"assistant","content":[{"text":"The order left the warehouse on Monday and is '
    b'delayed by the carrier."},{"toolUse":{"toolUseId":"tooluse_001","name":"lookup_order",'
    b'"input":{"order_id":"8812","fields":["status","eta"]}}}],"usage":{"inputTokens":4120}},'
)


# --- workload ---------------------------------------------------------------------------------


def history_key(session: bytes, index: int) -> bytes:
    return session + b"\x00" + b"m%010d" % index


@dataclass
class Workload:
    batches: list[list[Record]]
    sessions: list[bytes]
    live: dict[bytes, int] = field(repr=False)  # key -> size of its latest value
    written_bytes: int = 0
    live_random_bytes: int = 0  # the os.urandom part of the live values

    @property
    def records(self) -> int:
        return sum(len(batch) for batch in self.batches)

    @property
    def live_bytes(self) -> int:
        return sum(len(key) + size for key, size in self.live.items())


def make_value(rng: random.Random, size: int) -> bytes:
    if rng.random() < 0.5:
        return os.urandom(size)
    start = rng.randrange(len(TEXT))
    repeated = TEXT * (size // len(TEXT) + 2)
    return repeated[start : start + size]


def head_size(rng: random.Random) -> int:
    return int(math.exp(rng.uniform(math.log(1 * KIB), math.log(200 * KIB))))


def history_size(rng: random.Random) -> int:
    return rng.randint(1536, 2560)


def session_plan(rng: random.Random, session: bytes) -> list[Record]:
    records = [(session, make_value(rng, head_size(rng)))]
    for index in range(HISTORY_PER_SESSION):
        records.append((history_key(session, index), make_value(rng, history_size(rng))))
        if (index + 1) % HEAD_REWRITE_EVERY == 0:
            records.append((session, make_value(rng, head_size(rng))))
    return records


def make_workload(target_bytes: int, seed: int) -> Workload:
    rng = random.Random(seed)
    plans: list[list[Record]] = []
    planned = 0
    while planned < target_bytes:
        plan = session_plan(rng, uuid.UUID(int=rng.getrandbits(128)).hex.encode())
        plans.append(plan)
        planned += sum(len(k) + len(v) for k, v in plan)
    log: list[Record] = []
    active = [iter(plan) for plan in plans[:ACTIVE_SESSIONS]]
    waiting = iter(plans[ACTIVE_SESSIONS:])
    while active:
        slot = rng.randrange(len(active))
        record = next(active[slot], None)
        if record is None:
            following = next(waiting, None)
            if following is None:
                active.pop(slot)
            else:
                active[slot] = iter(following)
            continue
        log.append(record)
    workload = Workload(
        batches=[log[i : i + BATCH_RECORDS] for i in range(0, len(log), BATCH_RECORDS)],
        sessions=[plan[0][0] for plan in plans],
        live={},
    )
    random_sizes: dict[bytes, int] = {}
    for key, value in log:
        workload.live[key] = len(value)
        workload.written_bytes += len(key) + len(value)
        random_sizes[key] = 0 if value[:16] in TEXT * 2 else len(value)
    workload.live_random_bytes = sum(random_sizes.values())
    return workload


# --- stores ------------------------------------------------------------------------------------


class Store(Protocol):
    def apply(self, batch: list[Record], offset: int) -> None:
        """Writes ``batch`` and the changelog offset it completes, atomically."""

    def finish(self) -> None:
        """Makes everything applied so far durable in the store's main files."""

    def get(self, key: bytes) -> bytes | None: ...

    def scan(self, prefix: bytes) -> list[Record]:
        """Every key in ``[prefix, prefix + b"\\x01")``: a session head and its history."""

    def close(self) -> None: ...


class SqliteStore:
    def __init__(
        self, directory: Path, *, without_rowid: bool, synchronous: str, page_size: int = 4096
    ) -> None:
        self.db = sqlite3.connect(directory / "store.sqlite", isolation_level=None)
        self.db.execute(f"PRAGMA page_size={page_size}")  # only takes effect on a new file
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        suffix = " WITHOUT ROWID" if without_rowid else ""
        self.db.execute(f"CREATE TABLE IF NOT EXISTS kv(key BLOB PRIMARY KEY, value BLOB){suffix}")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value INTEGER) WITHOUT ROWID"
        )

    def apply(self, batch: list[Record], offset: int) -> None:
        self.db.execute("BEGIN")
        self.db.executemany(
            "INSERT INTO kv(key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            batch,
        )
        self.db.execute("INSERT OR REPLACE INTO meta(name, value) VALUES ('offset', ?)", (offset,))
        self.db.execute("COMMIT")

    def finish(self) -> None:
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def get(self, key: bytes) -> bytes | None:
        row = self.db.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def scan(self, prefix: bytes) -> list[Record]:
        rows = self.db.execute(
            "SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key",
            (prefix, prefix + b"\x01"),
        ).fetchall()
        return [(bytes(k), bytes(v)) for k, v in rows]

    def close(self) -> None:
        self.db.close()


OFFSET_KEY = b"\xff\xffchangelog-offset"  # sorts after every session key


class RocksStore:
    def __init__(self, directory: Path, *, blob_files: bool, compression: bool = True) -> None:
        import rocksdict  # type: ignore[import-not-found, unused-ignore]  # optional

        self._rocksdict = rocksdict
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        if not compression:  # the real values are zlib output already
            options.set_compression_type(rocksdict.DBCompressionType.none())
        if blob_files:  # BlobDB: values >= 4 KiB go to blob files, the LSM keeps references
            options.set_enable_blob_files(True)
            options.set_min_blob_size(4 * KIB)
        # Default WriteOptions: WAL on, no fsync per write (a process crash loses nothing, an
        # OS crash may lose the last writes; recovery is consistent, like SQLite WAL + NORMAL).
        self.db = rocksdict.Rdict(str(directory / "rocks"), options)

    def apply(self, batch: list[Record], offset: int) -> None:
        write = self._rocksdict.WriteBatch(raw_mode=True)
        for key, value in batch:
            write.put(key, value)
        write.put(OFFSET_KEY, offset.to_bytes(8, "big"))
        self.db.write(write)

    def finish(self) -> None:
        self.db.flush(True)

    def get(self, key: bytes) -> bytes | None:
        value: bytes | None = self.db.get(key)
        return value

    def scan(self, prefix: bytes) -> list[Record]:
        bounds = self._rocksdict.ReadOptions()
        bounds.set_iterate_upper_bound(prefix + b"\x01")
        items = cast("Iterable[Record]", self.db.items(from_key=prefix, read_opt=bounds))
        return list(items)

    def close(self) -> None:
        self.db.close()


@dataclass(frozen=True)
class Candidate:
    name: str
    description: str
    open: Callable[[Path], Store]


def sqlite(name: str, without_rowid: bool, synchronous: str, page_size: int) -> Candidate:
    table = "WITHOUT ROWID" if without_rowid else "rowid table + key index"
    return Candidate(
        name,
        f"SQLite WAL, synchronous={synchronous}, page_size={page_size}, kv {table}",
        lambda d: SqliteStore(
            d, without_rowid=without_rowid, synchronous=synchronous, page_size=page_size
        ),
    )


def rocks(name: str, description: str, blob_files: bool, compression: bool) -> Candidate:
    return Candidate(
        name,
        f"RocksDB {description}, WAL on, no sync per write",
        lambda d: RocksStore(d, blob_files=blob_files, compression=compression),
    )


def candidates() -> tuple[list[Candidate], list[str]]:
    found = [
        sqlite("sqlite-worowid-4k", True, "NORMAL", 4096),
        sqlite("sqlite-rowid-4k", False, "NORMAL", 4096),
        sqlite("sqlite-worowid-16k", True, "NORMAL", 16384),
        sqlite("sqlite-rowid-16k", False, "NORMAL", 16384),
        sqlite("sqlite-rowid-16k-off", False, "OFF", 16384),
    ]
    notes = [f"sqlite3 {sqlite3.sqlite_version} (Python {platform.python_version()})"]
    try:
        import rocksdict  # type: ignore[import-not-found, unused-ignore]  # noqa: F401
    except ImportError as error:
        notes.append(f"rocksdict is not installed ({error}); skipping the RocksDB candidates")
        return found, notes
    from importlib.metadata import version

    notes.append(f"rocksdict {version('rocksdict')}")
    found += [
        rocks("rocksdb-default", "defaults (Snappy, leveled)", False, True),
        rocks("rocksdb-nocompress", "without block compression", False, False),
        rocks("rocksdb-blobfiles", "with blob files for values >= 4 KiB", True, True),
    ]
    return found, notes


# --- measurement -------------------------------------------------------------------------------


def files_under(directory: Path) -> Iterator[Path]:
    return (path for path in directory.rglob("*") if path.is_file())


def size_on_disk(directory: Path) -> int:
    return sum(path.stat().st_blocks * 512 for path in files_under(directory))


def evict_page_cache(directory: Path) -> None:
    """Drops the store's (clean) pages from the OS page cache; no privileges needed."""
    for path in files_under(directory):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def reopen_cold(candidate: Candidate, directory: Path) -> Store:
    evict_page_cache(directory)
    return candidate.open(directory)


def one_run(candidate: Candidate, workload: Workload, base: Path, seed: int) -> dict[str, float]:
    directory = Path(tempfile.mkdtemp(prefix=f"{candidate.name}-", dir=base))
    rng = random.Random(seed)
    try:
        store = candidate.open(directory)
        offset = 0
        started = time.perf_counter()
        for batch in workload.batches:
            offset += len(batch)
            store.apply(batch, offset - 1)
        store.finish()
        restore_s = time.perf_counter() - started
        store.close()
        figures = {
            "restore_mb_s": workload.written_bytes / MB / restore_s,
            "restore_s": restore_s,
            "size_mb": size_on_disk(directory) / MB,
        }

        keys = rng.choices(list(workload.live), k=POINT_READS)
        store = reopen_cold(candidate, directory)
        read = 0
        started = time.perf_counter()
        for key in keys:
            value = store.get(key)
            assert value is not None, key
            read += len(value)
        elapsed = time.perf_counter() - started
        store.close()
        figures["point_reads_s"] = POINT_READS / elapsed
        figures["point_read_mb_s"] = read / MB / elapsed

        sessions = rng.sample(workload.sessions, k=min(PREFIX_READS, len(workload.sessions)))
        store = reopen_cold(candidate, directory)
        read = 0
        started = time.perf_counter()
        for session in sessions:
            rows = store.scan(session)
            assert len(rows) == HISTORY_PER_SESSION + 1, (session, len(rows))
            read += sum(len(v) for _, v in rows)
        elapsed = time.perf_counter() - started
        figures["prefix_reads_s"] = len(sessions) / elapsed
        figures["prefix_read_mb_s"] = read / MB / elapsed

        started = time.perf_counter()
        for commit in range(SMALL_COMMITS):
            session = rng.choice(workload.sessions)
            index = HISTORY_PER_SESSION + 2 * commit
            batch = [
                (session, make_value(rng, 8 * KIB)),
                (history_key(session, index), make_value(rng, history_size(rng))),
                (history_key(session, index + 1), make_value(rng, history_size(rng))),
            ]
            offset += len(batch)
            store.apply(batch, offset - 1)
        figures["small_commits_s"] = SMALL_COMMITS / (time.perf_counter() - started)
        store.close()
        return figures
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def summarize(runs: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {
        name: {
            "median": round(statistics.median(run[name] for run in runs), 2),
            "min": round(min(run[name] for run in runs), 2),
            "max": round(max(run[name] for run in runs), 2),
        }
        for name in runs[0]
    }


ROWS = [
    ("restore (MB/s)", "restore_mb_s"),
    ("restore wall time (s)", "restore_s"),
    ("size on disk after restore (MB)", "size_mb"),
    ("point reads, cold-ish (reads/s)", "point_reads_s"),
    ("point reads, cold-ish (MB/s)", "point_read_mb_s"),
    ("prefix reads, 201 keys (sessions/s)", "prefix_reads_s"),
    ("prefix reads (MB/s)", "prefix_read_mb_s"),
    ("small commits, 3 records (commits/s)", "small_commits_s"),
]


def table(figures: dict[str, dict[str, float]]) -> str:
    lines = [f"  {'':<38} {'median':>10} {'min':>10} {'max':>10}"]
    for label, key in ROWS:
        fig = figures[key]
        lines.append(f"  {label:<38} {fig['median']:>10} {fig['min']:>10} {fig['max']:>10}")
    return "\n".join(lines)


SHORT = [
    ("restore MB/s", "restore_mb_s"),
    ("size MB", "size_mb"),
    ("point reads/s", "point_reads_s"),
    ("prefix/s", "prefix_reads_s"),
    ("commits/s", "small_commits_s"),
]


def medians_table(by_candidate: dict[str, dict[str, Any]]) -> str:
    """One line per candidate, medians only."""
    width = max(len(name) for name in by_candidate)
    lines = [f"{'median of runs':<{width}} " + " ".join(f"{h:>13}" for h, _ in SHORT)]
    for name, figures in by_candidate.items():
        cells = " ".join(f"{figures[key]['median']:>13.1f}" for _, key in SHORT)
        lines.append(f"{name:<{width}} {cells}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=float, default=200.0, help="restore size, 10^6 bytes")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary stores")
    parser.add_argument("--only", default="", help="comma-separated candidate names")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("bench-results/store_choice.json"))
    args = parser.parse_args(argv)

    found, notes = candidates()
    if args.only:
        wanted = set(args.only.split(","))
        found = [c for c in found if c.name in wanted]
    for note in notes:
        print(note)
    started = time.perf_counter()
    workload = make_workload(int(args.mb * MB), args.seed)
    print(
        f"workload: {workload.records} records in {len(workload.batches)} batches, "
        f"{workload.written_bytes / MB:.1f} MB written, {len(workload.live)} live keys "
        f"({workload.live_bytes / MB:.1f} MB, {workload.live_random_bytes / MB:.1f} MB of it "
        f"os.urandom), {len(workload.sessions)} sessions "
        f"(built in {time.perf_counter() - started:.1f} s)"
    )
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="store-choice-", dir=args.dir))
    runs: dict[str, list[dict[str, float]]] = {c.name: [] for c in found}
    try:
        for run in range(args.runs):
            for candidate in found:
                measured = one_run(candidate, workload, base, seed=args.seed + run)
                runs[candidate.name].append(measured)
                print(
                    f"run {run + 1}/{args.runs} {candidate.name}: "
                    + ", ".join(f"{k}={v:.1f}" for k, v in measured.items()),
                    flush=True,
                )
    finally:
        shutil.rmtree(base, ignore_errors=True)

    report: dict[str, Any] = {
        "notes": notes,
        "runs": args.runs,
        "records": workload.records,
        "written_mb": round(workload.written_bytes / MB, 1),
        "live_mb": round(workload.live_bytes / MB, 1),
        "live_random_mb": round(workload.live_random_bytes / MB, 1),
        "candidates": {},
    }
    for candidate in found:
        figures = summarize(runs[candidate.name])
        report["candidates"][candidate.name] = {"description": candidate.description, **figures}
        print()
        print(f"{candidate.name}: {candidate.description}")
        print(table(figures))
    print()
    print(medians_table(report["candidates"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
