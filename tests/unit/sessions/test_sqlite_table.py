"""The local store's SQLite file is a cache of the sessions topic: a file SQLite cannot use is
removed, never trusted and never a reason for its partition to stop."""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path

import pytest

from service.sessions import table as table_module
from service.sessions.table import UNSYNCED, MemoryTable, SqliteTable, StoreBrokenError

FILE = "store.sqlite"


def _filled(folder: Path, *, clean: bool = True) -> None:
    """A table of a few sessions whose last owner stopped cleanly (or not)."""
    table = SqliteTable(folder, max_age_s=3600)
    table.apply([(f"s{n}".encode(), b"x" * 3000, n, 1_000 + n) for n in range(40)], 77)
    if clean:
        table.mark_clean()
    table.close()


def _overwrite_pages_of(folder: Path, *names: str) -> None:
    """Garbage over every page of the named tables and indexes, the rest left as it was."""
    db = sqlite3.connect(folder / FILE)
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    placeholders = ",".join("?" * len(names))
    pages = [
        row[0]
        for row in db.execute(f"SELECT pageno FROM dbstat WHERE name IN ({placeholders})", names)
    ]
    db.close()
    assert pages, f"no pages of {names}"
    with (folder / FILE).open("r+b") as file:
        for page in pages:
            file.seek((page - 1) * page_size)
            file.write(b"\xa5" * page_size)


def test_a_file_that_is_not_a_database_is_removed_and_the_table_starts_empty(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tmp_path.joinpath(FILE).write_bytes(b"not sqlite at all " * 2000)

    with caplog.at_level(logging.WARNING):
        table = SqliteTable(tmp_path, max_age_s=3600)
    assert table.position == 0 and table.heads() == 0
    table.apply([(b"s", b"v", 1, 5)], 9)
    assert table.get(b"s") == (b"v", 1)
    table.mark_clean()
    table.close()
    assert "unreadable: removed" in caplog.text

    again = SqliteTable(tmp_path, max_age_s=3600)
    assert again.position == 9 and again.get(b"s") == (b"v", 1)
    again.close()


@pytest.mark.parametrize("name", [FILE, f"{FILE}-wal", UNSYNCED])
def test_a_folder_where_a_file_of_the_table_goes_is_removed_too(tmp_path: Path, name: str) -> None:
    _filled(tmp_path)
    tmp_path.joinpath(name).unlink(missing_ok=True)
    tmp_path.joinpath(name, "inside").mkdir(parents=True)

    table = SqliteTable(tmp_path, max_age_s=3600, durable_writes=False)
    table.apply([(b"s", b"v", 1, 5)], 3)
    assert table.get(b"s") == (b"v", 1)
    table.close()


def test_a_clean_table_whose_records_are_corrupt_fails_then_is_removed_at_close(
    tmp_path: Path,
) -> None:
    _filled(tmp_path)
    _overwrite_pages_of(tmp_path, "kv", "sqlite_autoindex_kv_1", "idle")

    table = SqliteTable(tmp_path, max_age_s=3600)  # its position and clean mark read fine
    assert table.position == 77
    with pytest.raises(StoreBrokenError, match="malformed"):
        table.get(b"s3")
    table.mark_clean()  # an owner stopping cleanly after the failure
    table.close()

    reopened = SqliteTable(tmp_path, max_age_s=3600)
    assert reopened.position == 0 and reopened.heads() == 0
    reopened.close()


@pytest.mark.parametrize("clean", [True, False])
def test_a_corrupt_table_is_removed_on_opening_whether_or_not_it_was_clean(
    tmp_path: Path, clean: bool
) -> None:
    """Unclean: the wipe on opening meets the corrupt pages. Clean: counting the sessions
    does, with no position recorded."""
    _filled(tmp_path, clean=clean)
    names = ("kv", "sqlite_autoindex_kv_1", "idle") + (() if not clean else ("meta",))
    _overwrite_pages_of(tmp_path, *names)

    table = SqliteTable(tmp_path, max_age_s=3600)
    assert table.position == 0 and table.heads() == 0
    table.apply([(b"s", b"v", 1, 5)], 3)
    assert table.scan(b"s") == [(b"s", b"v")]
    table.close()


def test_an_owners_table_writes_without_syncing_until_marked_clean_then_syncs_it_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unsynced marker is on disk (its folder synced) before the first write; marking the
    table clean copies the log into the file, syncs both, and then removes the marker."""
    synced: list[str] = []
    real_fsync = table_module.os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(table_module.os, "fsync", fsync)
    table = SqliteTable(tmp_path, max_age_s=3600, durable_writes=False)
    assert tmp_path.joinpath(UNSYNCED).exists()
    assert synced == [str(tmp_path)]
    assert table._db.execute("PRAGMA synchronous").fetchone() == (0,)
    table.apply([(f"s{n}".encode(), b"x" * 3000, n, 1_000 + n) for n in range(40)], 77)
    assert tmp_path.joinpath(f"{FILE}-wal").stat().st_size > 0
    assert synced == [str(tmp_path)]

    table.mark_clean()
    assert not tmp_path.joinpath(UNSYNCED).exists()
    assert synced == [str(tmp_path)] * 2  # SQLite syncs its files itself, not through os
    assert tmp_path.joinpath(f"{FILE}-wal").stat().st_size == 0
    assert table._db.execute("PRAGMA synchronous").fetchone() == (1,)
    table.close()

    again = SqliteTable(tmp_path, max_age_s=3600)
    assert again.position == 77 and again.get(b"s3") == (b"x" * 3000, 3)
    assert not tmp_path.joinpath(UNSYNCED).exists()
    again.close()


@pytest.mark.parametrize("durable_writes", [True, False])
def test_a_table_left_unsynced_is_removed_unread_whatever_its_pages_say(
    tmp_path: Path, durable_writes: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """An OS crash can leave any page of an unsynced table stale, the one saying its owner
    stopped cleanly too: the marker alone decides, for an owner's table and a standby's."""
    _filled(tmp_path)  # its pages say it stopped cleanly at 77
    tmp_path.joinpath(UNSYNCED).touch()

    with caplog.at_level(logging.WARNING):
        table = SqliteTable(tmp_path, max_age_s=3600, durable_writes=durable_writes)
    assert table.position == 0 and table.heads() == 0
    assert "did not stop cleanly" in caplog.text
    assert tmp_path.joinpath(UNSYNCED).exists() is not durable_writes
    table.close()


def test_an_owners_table_closed_without_marking_it_clean_is_wiped_by_the_next_opener(
    tmp_path: Path,
) -> None:
    table = SqliteTable(tmp_path, max_age_s=3600, durable_writes=False)
    table.apply([(b"s", b"v", 1, 5)], 9)
    table.close()
    assert tmp_path.joinpath(UNSYNCED).exists()

    again = SqliteTable(tmp_path, max_age_s=3600)
    assert again.position == 0 and again.get(b"s") is None
    assert not tmp_path.joinpath(UNSYNCED).exists()
    again.close()


def test_every_read_and_write_of_a_broken_file_raises_store_broken(tmp_path: Path) -> None:
    _filled(tmp_path)
    _overwrite_pages_of(tmp_path, "kv", "sqlite_autoindex_kv_1", "idle")
    table = SqliteTable(tmp_path, max_age_s=3600)
    calls = [
        lambda: table.get(b"s1"),
        lambda: table.scan(b"s"),
        lambda: table.heads(),
        lambda: table.idle(10_000, 5),
        lambda: table.written_ms(b"s1"),
        lambda: table.apply([(b"s1", b"y", 2, 9)], 80),
    ]
    for call in calls:
        with pytest.raises(StoreBrokenError):
            call()
    table.close()
    assert not tmp_path.joinpath(FILE).exists()


def test_a_record_is_known_by_when_it_was_written_as_in_memory(tmp_path: Path) -> None:
    rows = [(b"s1", b"a", 1, 1_000), (b"s1\x00m0", b"b", 1, 1_000), (b"s2", b"c", 2, 2_000)]
    later = [(b"s1", b"d", 3, 5_000), (b"s2", None, 4, 6_000)]
    sqlite, memory = SqliteTable(tmp_path, max_age_s=3600), MemoryTable()
    for table in (sqlite, memory):
        table.apply(rows, 3)
        table.apply(later, 5)
    keys = (b"s1", b"s1\x00m0", b"s2", b"s3")
    assert [sqlite.written_ms(key) for key in keys] == [5_000, 1_000, None, None]
    assert [memory.written_ms(key) for key in keys] == [5_000, 1_000, None, None]
    sqlite.close()


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_idle_sessions_are_listed_in_pages_that_go_on_after_the_last_one_given(
    tmp_path: Path, kind: str
) -> None:
    """Idle expiry pages through the idle sessions: ordered by when, then by id (many share a
    millisecond), each page starting after the session the previous one ended on, so sessions
    left where they are (busy, say) are never listed again in the same round."""
    table = SqliteTable(tmp_path, max_age_s=3600) if kind == "sqlite" else MemoryTable()
    rows = [(f"s{i}".encode(), b"v", i, 100 if i < 5 else 200 + i) for i in range(8)]
    rows.append((b"s0\x00m0", b"history", 9, 50))  # a history record is never a session
    rows.append((b"late", b"v", 10, 900))  # written after the bound
    table.apply(rows, 11)
    pages, after = [], None
    while page := table.idle(800, 3, after):
        pages.append(page)
        after = page[-1]
    assert pages == [
        [("s0", 100), ("s1", 100), ("s2", 100)],
        [("s3", 100), ("s4", 100), ("s5", 205)],
        [("s6", 206), ("s7", 207)],
    ]
    assert table.idle(800, 10, ("s4", 100)) == [("s5", 205), ("s6", 206), ("s7", 207)]
    table.close()
