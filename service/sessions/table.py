"""Local tables of one partition's sessions changelog: key -> (value, event seq), plus the
changelog offset the table is complete up to.

A SQLite table is trusted only if its last owner stopped cleanly (its last commit done): after
a crash or a failed owner it is wiped and read again from the topic. A file SQLite cannot use
(corrupt, or not a database) is removed on opening; one that fails while in use raises
:class:`StoreBrokenError`, and is removed when closed.

An owner's table is written without syncing (nothing it holds is needed after a crash, and the
syncs of SQLite's checkpoints stalled the event loop for tens of milliseconds): a marker file,
made durable before the first such write and removed once :meth:`SqliteTable.mark_clean` has
synced everything, says the files may be anything after an OS crash, and the next opener
removes them unread.

:class:`SqliteTable` is the disk-backed one the runtime uses (one SQLite file per partition, in
WAL mode); :class:`MemoryTable` holds the same in a dict (tests, tools). Both apply a batch of
changelog records and the new position in one transaction, so whatever the table holds, even
after a kill -9, is the changelog up to its position: a reader replays the tail from there.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import sqlite3
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Protocol

from service.sessions.history import is_history_key

logger = logging.getLogger(__name__)

Row = tuple[bytes, bytes | None, int, int]
"""A changelog record as a table applies it: key, value (``None`` deletes), event seq, and the
record's timestamp (epoch ms: for a head, when the session was last written)."""

SCHEMA = 1
"""Layout version of the SQLite file; a file of another layout is wiped and rebuilt."""

UNSYNCED = "unsynced"
"""The marker file of a table written without syncing and not yet closed cleanly."""


class StoreLockedError(RuntimeError):
    """Another process (or owner) holds the partition's local store."""


class StoreBrokenError(RuntimeError):
    """The local store failed to read or write (a corrupt page, a full disk): the partition's
    owner stops without answering the command at hand, the file is removed when the table is
    closed, and the next owner rebuilds it from the topic."""


class Table(Protocol):
    @property
    def position(self) -> int:
        """The changelog offset this table is complete up to (0 when empty)."""
        ...

    def get(self, key: bytes) -> tuple[bytes, int] | None: ...

    def scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        """Every record whose key starts with ``prefix``, in key order."""
        ...

    def apply(self, rows: Iterable[Row], position: int) -> None:
        """Apply records in log order and move the position, atomically."""
        ...

    def heads(self) -> int:
        """How many sessions (head records) the table holds."""
        ...

    def written_ms(self, key: bytes) -> int | None:
        """When the record under ``key`` was written (epoch ms), ``None`` without one."""
        ...

    def idle(
        self, before_ms: int, limit: int, after: tuple[str, int] | None = None
    ) -> list[tuple[str, int]]:
        """Up to ``limit`` sessions last written before ``before_ms``, oldest first (by when,
        then by id), with when; ``after``: only those after that session and time in this
        order, to go on from where a previous call stopped."""
        ...

    def wipe(self, reason: str) -> None:
        """Empty the table (it is read again from the start of the changelog)."""
        ...

    def close(self) -> None: ...


class MemoryTable:
    """A table in a dict; its position survives only as long as the object."""

    def __init__(self) -> None:
        self._rows: dict[bytes, tuple[bytes, int]] = {}
        self._written: dict[bytes, int] = {}
        self._position = 0

    @property
    def position(self) -> int:
        return self._position

    def get(self, key: bytes) -> tuple[bytes, int] | None:
        return self._rows.get(key)

    def scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        return sorted((k, v[0]) for k, v in self._rows.items() if k.startswith(prefix))

    def apply(self, rows: Iterable[Row], position: int) -> None:
        for key, value, seq, timestamp_ms in rows:
            if value is None:
                self._rows.pop(key, None)
                self._written.pop(key, None)
            else:
                self._rows[key] = (value, seq)
                self._written[key] = timestamp_ms
        self._position = max(self._position, position)

    def heads(self) -> int:
        return sum(1 for key in self._rows if not is_history_key(key))

    def written_ms(self, key: bytes) -> int | None:
        return self._written.get(key)

    def idle(
        self, before_ms: int, limit: int, after: tuple[str, int] | None = None
    ) -> list[tuple[str, int]]:
        start = (-1, b"") if after is None else (after[1], after[0].encode())
        heads = sorted(
            (ts, key)
            for key, ts in self._written.items()
            if not is_history_key(key) and ts < before_ms and (ts, key) > start
        )
        return [(key.decode(), ts) for ts, key in heads[:limit]]

    def wipe(self, reason: str) -> None:
        self._rows.clear()
        self._written.clear()
        self._position = 0

    def close(self) -> None:
        return


class SqliteTable:
    """One partition's table in ``folder``/store.sqlite, locked against every other opener.

    Written only with committed changelog records, after their transaction committed; a
    process killed mid-write leaves SQLite's last transaction, whose position matches its rows.
    """

    def __init__(self, folder: Path, *, max_age_s: float, durable_writes: bool = True) -> None:
        """``durable_writes``: every write survives an OS crash (a standby copy, trusted as it
        is written); without, writes reach only the OS until :meth:`mark_clean` (an owner's
        table, trusted only after a clean stop anyway)."""
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self._broken = False
        self._durable = durable_writes
        self._lock = _lock(folder / "lock")
        try:
            try:
                self._open(max_age_s)
            except (sqlite3.DatabaseError, StoreBrokenError) as exc:
                # A cache the topic can rebuild: a file SQLite cannot use is thrown away.
                logger.warning(
                    "folder=<%s>, error=<%s> | local session store unreadable: removed",
                    folder,
                    exc,
                )
                self._remove_files()
                self._broken = False
                self._open(max_age_s)
        except BaseException:
            os.close(self._lock)
            raise

    def _open(self, max_age_s: float) -> None:
        marker = self.folder / UNSYNCED
        if marker.exists():
            # Written without syncing by an owner that did not stop cleanly: after an OS crash
            # any page may be stale, even the one that says whether it stopped cleanly.
            logger.warning(
                "folder=<%s>, reason=<its last owner did not stop cleanly> | "
                "local session store wiped",
                self.folder,
            )
            self._remove_files()
        if not self._durable:
            _create_durably(marker)
        self._db = sqlite3.connect(self.folder / "store.sqlite", isolation_level=None)
        try:
            self._setup()
            self._position = self._trusted_position(max_age_s)
            self._set_meta("clean", 0)
        except BaseException:
            self._db.close()
            raise

    def _remove_files(self) -> None:
        """Delete the SQLite file and its log, then the unsynced marker (the folder's lock
        stays held)."""
        for name in ("store.sqlite", "store.sqlite-wal", "store.sqlite-shm", UNSYNCED):
            path = self.folder / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)  # put there by hand: SQLite can open no folder
            else:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    @contextlib.contextmanager
    def _io(self) -> Iterator[None]:
        """SQLite's failures as :class:`StoreBrokenError`; the file is removed at close."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            self._broken = True
            raise StoreBrokenError(f"local session store {self.folder}: {exc}") from exc

    def _setup(self) -> None:
        db = self._db
        # 16 KiB pages and a rowid table: measured the fastest layout for these values
        # (bench/store_choice.py, docs/runtime.md); the page size counts only before the first
        # table exists.
        db.execute("PRAGMA page_size=16384")
        db.execute("PRAGMA journal_mode=WAL")
        # A process crash never loses a committed SQLite transaction in WAL mode; with NORMAL an
        # OS crash may lose the last ones, which only moves the position back (the tail is read
        # again). OFF syncs nothing, not even at checkpoints: see UNSYNCED.
        db.execute(f"PRAGMA synchronous={'NORMAL' if self._durable else 'OFF'}")
        db.execute("PRAGMA cache_size=-16384")
        db.execute(
            "CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY, value BLOB NOT NULL, "
            "seq INTEGER NOT NULL, written_ms INTEGER NOT NULL, head INTEGER NOT NULL)"
        )
        db.execute("CREATE INDEX IF NOT EXISTS idle ON kv (head, written_ms)")
        db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value) WITHOUT ROWID")

    def _meta(self, name: str) -> object:
        row = self._db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return None if row is None else row[0]

    def _trusted_position(self, max_age_s: float) -> int:
        """The stored position, or 0 after wiping a table that cannot be trusted: another
        layout, or older than tombstones are kept on the topic (a delete compacted away since
        would never be seen)."""
        position = self._meta("position")
        schema = self._meta("schema")
        written_at = self._meta("written_at")
        reason = None
        if position is None:
            reason = None if self.heads() == 0 else "no position recorded"
        elif self._meta("clean") != 1:
            # Its owner died or failed: a commit it saw succeed may still have been aborted
            # since (a broker restart can lose the markers of a completed transaction).
            reason = "its last owner did not stop cleanly"
        elif schema != SCHEMA:
            reason = f"layout {schema} is not {SCHEMA}"
        elif not isinstance(written_at, float) or time.time() - written_at > max_age_s:
            reason = "older than deleted sessions stay visible on the changelog"
        if reason is not None:
            self.wipe(reason)
            return 0
        return int(position) if isinstance(position, int) else 0

    def wipe(self, reason: str) -> None:
        logger.warning("folder=<%s>, reason=<%s> | local session store wiped", self.folder, reason)
        db = self._db
        with self._io():
            db.execute("BEGIN")
            db.execute("DELETE FROM kv")
            db.execute("DELETE FROM meta")
            db.execute("COMMIT")
        self._position = 0

    @property
    def position(self) -> int:
        return self._position

    def mark_clean(self) -> None:
        """Its owner stopped cleanly, its last commit done: the next one may trust it (unless
        the file failed meanwhile: it is removed at close). A table written without syncing is
        synced first (its log copied into the file, then both synced) and durable from then
        on."""
        if self._broken:
            return
        with self._io():
            self._set_meta("clean", 1)
            if self._durable:
                return
            db = self._db
            db.execute("PRAGMA synchronous=NORMAL")
            busy, _, _ = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            return  # not synced: the marker stays, and the next opener wipes it
        self._durable = True
        _remove_durably(self.folder / UNSYNCED)

    def _set_meta(self, name: str, value: object) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", (name, value))

    def get(self, key: bytes) -> tuple[bytes, int] | None:
        with self._io():
            row = self._db.execute("SELECT value, seq FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else (row[0], row[1])

    def scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        upper = prefix[:-1] + bytes([prefix[-1] + 1])
        with self._io():
            rows = self._db.execute(
                "SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key",
                (prefix, upper),
            )
            return [(key, value) for key, value in rows]

    def apply(self, rows: Iterable[Row], position: int) -> None:
        # Only the last record of a key counts, so a batch is applied as its last record per
        # key, in two statements (far cheaper than one per record).
        last = {row[0]: row for row in rows}
        with self._io():
            self._apply(last, position)

    def _apply(self, last: dict[bytes, Row], position: int) -> None:
        db = self._db
        db.execute("BEGIN")
        try:
            db.executemany(
                "DELETE FROM kv WHERE key = ?",
                ((key,) for key, value, _, _ in last.values() if value is None),
            )
            db.executemany(
                "INSERT OR REPLACE INTO kv (key, value, seq, written_ms, head) "
                "VALUES (?, ?, ?, ?, ?)",
                (
                    (key, value, seq, written_ms, not is_history_key(key))
                    for key, value, seq, written_ms in last.values()
                    if value is not None
                ),
            )
            position = max(position, self._position)
            db.executemany(
                "INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)",
                (("position", position), ("schema", SCHEMA), ("written_at", time.time())),
            )
            db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise
        self._position = position

    def heads(self) -> int:
        with self._io():
            row = self._db.execute("SELECT count(*) FROM kv WHERE head = 1").fetchone()
        return int(row[0])

    def written_ms(self, key: bytes) -> int | None:
        with self._io():
            row = self._db.execute("SELECT written_ms FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else int(row[0])

    def idle(
        self, before_ms: int, limit: int, after: tuple[str, int] | None = None
    ) -> list[tuple[str, int]]:
        since_ms, since_key = (-1, b"") if after is None else (after[1], after[0].encode())
        with self._io():
            rows = self._db.execute(
                "SELECT key, written_ms FROM kv WHERE head = 1 AND written_ms < ? "
                "AND written_ms >= ? AND (written_ms > ? OR key > ?) "
                "ORDER BY written_ms, key LIMIT ?",
                (before_ms, since_ms, since_ms, since_key, limit),
            )
            return [(key.decode(), written_ms) for key, written_ms in rows]

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
        if self._broken:
            logger.warning("folder=<%s> | local session store failed in use: removed", self.folder)
            self._remove_files()
        with contextlib.suppress(OSError):
            os.close(self._lock)


def _create_durably(path: Path) -> None:
    """An empty file whose name is on disk when this returns."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
    _sync_folder(path.parent)


def _remove_durably(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    _sync_folder(path.parent)


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _lock(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        os.close(fd)
        raise StoreLockedError(f"the local session store {path.parent} is in use") from exc
    return fd
