"""The local session store: a cache rebuilt from changelog records in log order."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import pytest

from service.agent.state import SessionState
from service.runtime.work import Outcome
from service.sessions import store as store_module
from service.sessions.cache import SessionCache
from service.sessions.codec import encode_state
from service.sessions.delivery import Delivery
from service.sessions.store import SessionStore, StoredSession, event_seq_header
from service.sessions.table import MemoryTable, Row, StoreBrokenError
from tests.support.session_records import decodes_in, restored, writer_for


def test_latest_record_wins_and_a_tombstone_deletes() -> None:
    store = SessionStore()
    first = SessionState(session_id="s1", agent="a")
    second = SessionState(session_id="s1", agent="b")
    store.load(b"s1", encode_state(first, Delivery(("c1",))), [event_seq_header(3)])
    store.load(b"s1", encode_state(second, Delivery(("c1", "c2"))), [event_seq_header(7)])
    store.load(b"s2", encode_state(SessionState(session_id="s2")), [])
    got = store.get("s1")
    assert got is not None
    assert got.state == second and got.delivery.applied == ("c1", "c2")
    assert got.event_seq == 7
    assert len(store) == 2
    store.load(b"s2", None, [])
    assert store.get("s2") is None
    assert len(store) == 1


def test_put_replaces_what_was_restored() -> None:
    store = SessionStore()
    store.load(b"s1", encode_state(SessionState(session_id="s1")), [])
    store.put("s1", StoredSession(SessionState(session_id="s1", agent="new"), event_seq=2))
    got = store.get("s1")
    assert got is not None
    assert (got.state.agent, got.event_seq) == ("new", 2)
    assert store.get("unknown") is None


class _CountedTable(MemoryTable):
    """A memory table that counts its writes and can be made to fail the next one."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.fail_next = False

    def apply(self, rows: Iterable[Row], position: int) -> None:
        if self.fail_next:
            self.fail_next = False
            raise StoreBrokenError("disk full")
        self.writes += 1
        super().apply(rows, position)


def _written(store: SessionStore, session_id: str, agent: str) -> tuple[list[Row], dict[str, int]]:
    """Put a new state of ``session_id`` and return what its commit hands the store."""
    state = SessionState(session_id=session_id, agent=agent)
    store.put(session_id, StoredSession(state, head_size=100))
    stored = store.get(session_id)
    assert stored is not None
    value = encode_state(stored.state, Delivery())
    return [(session_id.encode(), value, 0, 1)], {session_id: stored.version}


def test_commits_reach_the_table_in_one_write_and_only_then_may_be_evicted() -> None:
    table = _CountedTable()
    store = SessionStore(table, cache_max_bytes=0)
    for position, agent in enumerate(["a", "b", "c"], start=1):
        store.committed(*_with_position(_written(store, "s1", agent), position))
    rows, versions = _written(store, "s2", "x")
    store.committed(rows, 4, versions)
    # Committed, not yet in the table: held in memory whatever the budget.
    assert (table.writes, table.position, table.get(b"s1")) == (0, 0, None)
    assert store.cached_bytes > 0
    got = store.get("s1")
    assert got is not None and got.state.agent == "c"
    store.flush()
    assert (table.writes, table.position) == (1, 4)
    assert store.cached_bytes == 0  # durable now, and over the budget: evicted
    again = store.get("s1")
    assert again is not None and again.state.agent == "c"
    store.flush()
    assert table.writes == 1  # nothing waited


def _with_position(
    written: tuple[list[Row], dict[str, int]], position: int
) -> tuple[list[Row], int, dict[str, int]]:
    return written[0], position, written[1]


def test_a_commit_writes_the_table_once_the_wait_is_over_or_enough_rows_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = _CountedTable()
    store = SessionStore(table)
    monkeypatch.setattr(store_module, "FLUSH_EVERY_S", 0.0)
    store.committed(*_with_position(_written(store, "s1", "a"), 1))
    assert (table.writes, table.position) == (1, 1)
    monkeypatch.setattr(store_module, "FLUSH_EVERY_S", 3600.0)
    monkeypatch.setattr(store_module, "FLUSH_ROWS", 3)
    store.committed(*_with_position(_written(store, "s1", "b"), 2))
    store.committed(*_with_position(_written(store, "s2", "b"), 3))
    assert table.writes == 1
    store.committed(*_with_position(_written(store, "s3", "b"), 4))
    assert (table.writes, table.position) == (2, 4)


def test_what_reads_the_table_itself_sees_every_commit_first() -> None:
    table = _CountedTable()
    store = SessionStore(table)
    store.committed(*_with_position(_written(store, "s1", "a"), 1))
    assert len(store) == 1 and table.writes == 1
    store.committed(*_with_position(_written(store, "s2", "a"), 2))
    assert [session for session, _ in store.idle(2, 10)] == ["s1", "s2"]
    store.committed(*_with_position(_written(store, "s3", "a"), 3))
    assert store.keys_of("s3") == [b"s3"] and table.get(b"s3") is not None
    # A restored record lands after what was committed before it, never under it.
    store.committed(*_with_position(_written(store, "s4", "old"), 4))
    store.load(b"s4", encode_state(SessionState(session_id="s4", agent="new")), [])
    store.flush()
    got = store.get("s4")
    assert got is not None and got.state.agent == "new"


def test_a_failed_write_keeps_the_records_waiting_and_the_sessions_held() -> None:
    table = _CountedTable()
    store = SessionStore(table, cache_max_bytes=0)
    store.committed(*_with_position(_written(store, "s1", "a"), 1))
    table.fail_next = True
    with pytest.raises(StoreBrokenError):
        store.flush()
    assert table.get(b"s1") is None and store.cached_bytes > 0
    store.flush()
    assert table.position == 1 and table.get(b"s1") is not None and store.cached_bytes == 0


def test_a_dropped_session_stays_gone_while_its_tombstones_wait() -> None:
    table = _CountedTable()
    store = SessionStore(table)
    store.committed(*_with_position(_written(store, "s1", "a"), 1))
    store.flush()
    version = store.drop("s1")
    store.committed([(b"s1", None, 0, 2)], 2, {"s1": version})
    assert store.get("s1") is None and table.get(b"s1") is not None
    store.flush()
    assert store.get("s1") is None and table.get(b"s1") is None


def _loaded(store: SessionStore, session_id: str) -> StoredSession:
    """A committed session of ``store`` read into the cache."""
    store.load(session_id.encode(), encode_state(SessionState(session_id=session_id)), [])
    got = store.get(session_id)
    assert got is not None
    return got


def test_the_stores_of_an_instance_share_one_budget_least_recently_used_first() -> None:
    one = _loaded(SessionStore(), "a").size
    assert one > 0
    cache = SessionCache(budget=3 * one)
    left, right = SessionStore(cache=cache), SessionStore(cache=cache)
    _loaded(left, "a")
    _loaded(right, "b")
    _loaded(left, "c")
    assert cache.total == 3 * one
    left.get("a")  # used again: "b" is now the least recently used
    _loaded(right, "d")
    assert cache.total == 3 * one
    assert (cache.held_by(left), cache.held_by(right)) == (2 * one, one)
    assert cache.peek(right, "b") is None and cache.peek(left, "a") is not None
    # A store sees only its own sessions, and a store that is done leaves nothing behind.
    assert cache.get(right, "a") is None
    left.release()
    assert cache.total == one and cache.held_by(left) == 0
    # A written session not yet committed is never evicted, whatever the budget.
    written = StoredSession(SessionState(session_id="w"), head_size=4 * one)
    right.put("w", written)
    _loaded(right, "e")
    assert cache.peek(right, "w") is written and written.durable is False
    assert cache.total == 4 * one  # every committed one went, the budget notwithstanding


def test_a_session_in_use_stays_decoded_whatever_its_size_until_let_go() -> None:
    store = SessionStore(cache_max_bytes=0)
    with store.in_use("big"):
        first = _loaded(store, "big")
        store.flush()
        # Over the budget and committed, but a command of it is being handled: kept, so its
        # steps never decode it again.
        assert store.get("big") is first
        with store.in_use("big"):
            pass
        store.flush()
        assert store.get("big") is first
    store.flush()
    assert store.cached_bytes == 0
    assert store.get("big") is not first  # read from the table again


async def test_a_large_session_is_decoded_off_the_event_loop_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    off_loop, go = decodes_in(monkeypatch)
    go.set()
    store = SessionStore()
    big = SessionState(session_id="big", agent="a")
    big.messages = [{"role": "user", "content": [{"text": f"{i} " * 40}]} for i in range(100)]
    value = encode_state(big, Delivery(("c1",)))
    small = encode_state(SessionState(session_id="small"))
    assert len(small) < len(value)
    store.load(b"big", value, [event_seq_header(4)])
    store.load(b"small", small, [])
    monkeypatch.setattr(store_module, "DECODE_OFF_LOOP_BYTES", len(value))
    await store.prefetch("big")
    await store.prefetch("small")  # under the threshold: decoded on the loop
    got = store.get("big")
    assert got is not None and got.state == big and got.event_seq == 4
    assert store.get("small") is not None
    assert off_loop == [True, False]


async def test_what_a_prefetch_decoded_is_dropped_if_the_session_was_written_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    off_loop, go = decodes_in(monkeypatch)
    monkeypatch.setattr(store_module, "DECODE_OFF_LOOP_BYTES", 1)
    store = SessionStore()
    store.load(b"s1", encode_state(SessionState(session_id="s1", agent="old")), [])
    prefetching = asyncio.create_task(store.prefetch("s1"))
    async with asyncio.timeout(10):
        while not off_loop:
            await asyncio.sleep(0)
    store.put("s1", StoredSession(SessionState(session_id="s1", agent="new"), event_seq=2))
    go.set()
    await prefetching
    got = store.get("s1")
    assert got is not None and got.state.agent == "new"


async def test_a_small_session_prefetched_is_read_from_the_table_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = SessionStore()
    store.load(b"small", encode_state(SessionState(session_id="small", agent="a")), [])
    reads: list[bytes] = []
    table_get = store.table.get

    def counted(key: bytes) -> tuple[bytes, int] | None:
        reads.append(key)
        return table_get(key)

    monkeypatch.setattr(store.table, "get", counted)
    await store.prefetch("small")
    got = store.get("small")
    assert got is not None and got.state.agent == "a"
    assert reads == [b"small"]


def test_the_delivery_of_a_session_not_in_memory_is_read_without_its_conversation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    said = [{"role": "user", "content": [{"text": f"{i} " * 40}]} for i in range(50)]
    applied = tuple(f"c{i}" for i in range(300))  # more ids than slots: the oldest are dropped
    delivery = Delivery(applied=applied, cancelled_before_ms=7).through((41, 1_000, "T1:0"))
    write = writer_for().write(SessionState("s", agent="a", messages=said), 3, delivery)
    table = restored([Outcome(state=write)]).table
    whole = SessionStore(table).get("s")
    assert whole is not None and whole.delivery.answered("c299")

    def no_decode(head: bytes, records: Any) -> Any:
        raise AssertionError("the whole session was decoded")

    monkeypatch.setattr(store_module, "decode_session", no_decode)
    store = SessionStore(table)
    assert store.delivery("s") == whole.delivery
    assert store.done("s") == (3, whole.delivery)
    assert store.delivery("unknown") is None
    store.drop("s")
    assert store.delivery("s") is None  # its tombstones not committed yet: gone all the same
    cached = SessionStore(table)
    cached.put("s", StoredSession(SessionState("s"), delivery=Delivery(applied=("new",))))
    assert cached.delivery("s") == Delivery(applied=("new",))
    cached.put("s", StoredSession(SessionState("s"), event_seq=5))
    assert cached.done("s") == (5, Delivery())
