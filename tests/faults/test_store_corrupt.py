"""A local session store damaged on disk between two runs of a service: the partitions go on
from the topic, every session keeps its conversation, and no command is answered with an error.

The first service stops cleanly (its stores are marked trusted), the files are damaged, and a
second service starts on the same folder: either no store is a database any more, or their
records are garbage under an intact position (found only when a session is read).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.support.runtime_harness import Client, Cluster, invoke, services, unique

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.timeout(180)]

SESSIONS = 8


def _stores(root: Path) -> list[Path]:
    found = sorted(root.rglob("store.sqlite"))
    assert found, f"no local store under {root}"
    return found


def _damage(store: Path, how: str) -> None:
    if how == "not-a-database":
        store.write_bytes(b"\x00garbage" * 4096)
        return
    db = sqlite3.connect(store)
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    pages = [
        row[0]
        for row in db.execute(
            "SELECT pageno FROM dbstat WHERE name IN ('kv', 'sqlite_autoindex_kv_1', 'idle')"
        )
    ]
    db.close()
    with store.open("r+b") as file:
        for page in pages:
            file.seek((page - 1) * page_size)
            file.write(b"\xa5" * page_size)


@pytest.mark.parametrize("how", ["not-a-database", "records-garbled"])
async def test_a_damaged_local_store_is_rebuilt_and_every_session_goes_on(
    cluster: Cluster, tmp_path: Path, how: str
) -> None:
    root = tmp_path / "store"
    env = {"CAIRN_SESSIONS__STORE_DIR": str(root)}
    session_ids = [unique("s") for _ in range(SESSIONS)]
    first = [invoke(sid, "one") for sid in session_ids]
    second = [invoke(sid, "two") for sid in session_ids]
    with services() as procs:
        async with Client(cluster) as client:
            before = cluster.start("before", **env)
            procs.append(before)
            await before.wait_ready()
            await client.send(*first)
            for command in first:
                result = await client.result(command["command_id"], 60, alive=before)
                assert result["message"]["content"] == [{"text": "done turn 1"}], result
            assert await before.terminate() == 0

            for store in _stores(root):
                _damage(store, how)

            after = cluster.start("after", **env)
            procs.append(after)
            await client.send(*second)
            for command in second:
                result = await client.result(command["command_id"], 90, alive=after)
                assert result["error"] is None, result
                # The turn count comes from the conversation: the first turn is still there.
                assert result["message"]["content"] == [{"text": "done turn 2"}], result
            await client.caught_up()
            for command in first + second:
                assert len(client.results_for(command["command_id"])) == 1, command
            assert after.alive
