"""Property: whatever steps a session takes, with crashes and compaction between them, the
session read back from the changelog equals the one last committed, and a head never points at
history that is not there."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from service.agent.state import PendingBatch, SessionState
from service.sessions.delivery import Delivery
from service.sessions.store import SessionStore
from service.sessions.table import MemoryTable
from service.sessions.writer import SessionWriter, StateWrite

RECORD_MAX = 6_000
"""Small, so that large messages are split across several records."""

Changelog = list[tuple[bytes, bytes | None]]


def _message(role: str, size: int, seed: int) -> dict[str, Any]:
    text = os.urandom(size // 2).hex() if seed % 2 else f"word{seed} " * (size // 6 + 1)
    return {"role": role, "content": [{"text": text}]}


def _result(tool_use_id: str, size: int) -> dict[str, Any]:
    return {
        "toolResult": {
            "toolUseId": tool_use_id,
            "status": "success",
            "content": [{"text": "r" * size}],
        }
    }


step = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 3), st.integers(0, 20_000)),
    st.tuples(st.just("replace_last"), st.just(1), st.integers(0, 9_000)),
    st.tuples(st.just("rollback"), st.integers(1, 4), st.just(0)),
    st.tuples(st.just("pending"), st.integers(0, 3), st.integers(0, 8_000)),
    st.tuples(st.just("crash"), st.just(0), st.just(0)),
    st.tuples(st.just("forget_ids"), st.integers(0, 3), st.just(0)),
    st.tuples(st.just("compact"), st.just(0), st.just(0)),
)


def _compacted(log: Changelog) -> Changelog:
    """What compaction leaves: the newest record of each key (tombstones included)."""
    newest: dict[bytes, int] = {}
    for index, (key, _) in enumerate(log):
        newest[key] = index
    return [record for index, record in enumerate(log) if newest[record[0]] == index]


def _restored(log: Changelog) -> SessionStore:
    store = SessionStore(MemoryTable())
    for key, value in log:
        store.load(key, value, [])
    return store


Session = tuple[SessionState, Delivery]


def _apply(session: Session, kind: str, count: int, size: int, n: int) -> Session:
    state, delivery = session[0].snapshot(), session[1]
    if kind == "append":
        for i in range(count):
            role = "user" if (len(state.messages) + i) % 2 == 0 else "assistant"
            state.messages.append(_message(role, size, n + i))
        state.pending = None
    elif kind == "replace_last" and state.messages:
        state.messages[-1] = _message(state.messages[-1]["role"], size, n)
    elif kind == "rollback":
        del state.messages[max(0, len(state.messages) - count) :]
        state.pending = None
    elif kind == "forget_ids":
        # Not a change the runtime makes, but the writer must store any list of ids.
        return state, replace(delivery, applied=delivery.applied[:count])
    elif kind == "pending":
        uses = [{"toolUse": {"toolUseId": f"t{n}-{i}", "name": "x", "input": {}}} for i in range(3)]
        assistant = {"role": "assistant", "content": uses}
        if state.pending is None:
            state.messages.append(assistant)
            state.pending = PendingBatch(assistant)
        results = dict(state.pending.results)
        for i in range(count):
            results[f"t{n}-{i}"] = _result(f"t{n}-{i}", size)
        state.pending.results = results
    return state, delivery.applying(f"c{n}")


@settings(max_examples=60, deadline=None)
@given(st.lists(step, min_size=1, max_size=25))
def test_the_changelog_always_reads_back_as_the_last_committed_state(
    steps: list[tuple[str, int, int]],
) -> None:
    store = SessionStore(MemoryTable())
    writer = SessionWriter(store, record_max_bytes=RECORD_MAX)
    log: Changelog = []
    committed: Session = (SessionState(session_id="s", agent="a"), Delivery())
    session = committed
    for n, (kind, count, size) in enumerate(steps):
        if kind == "crash":
            # Written but not committed is lost; the next owner restores from the changelog.
            store = _restored(log)
            writer = SessionWriter(store, record_max_bytes=RECORD_MAX)
            loaded = store.get("s")
            session = (loaded.state, loaded.delivery) if loaded is not None else committed
            assert session == committed
            continue
        if kind == "compact":
            log = _compacted(log)
            continue
        session = _apply(session, kind, count, size, n)
        write: StateWrite = writer.write(session[0], n, session[1])
        assert all(value is None or len(value) <= RECORD_MAX for _, value in write.records)
        assert write.records[-1][0] == b"s", "the head is written last"
        log.extend(write.records)
        rows = [(k, v, n, n) for k, v in write.records]
        store.committed(rows, len(log), {"s": write.version})
        committed = session
        for view in (log, _compacted(log)):
            reread = _restored(view).get("s")
            assert reread is not None
            assert (reread.state, reread.delivery) == committed


def test_a_step_writes_only_what_it_added() -> None:
    store = SessionStore(MemoryTable())
    writer = SessionWriter(store, record_max_bytes=RECORD_MAX)
    state = SessionState(session_id="s", agent="a")
    state.messages.extend(_message("user", 400, i) for i in range(500))
    writer.write(state, 0)
    state = state.snapshot()
    state.messages.append(_message("assistant", 400, 501))
    write = writer.write(state, 1)
    assert [key for key, _ in write.records] == [b"s\x00m0000000500", b"s"]


def test_a_state_put_back_after_a_refused_write_still_counts_its_own_bytes() -> None:
    """A write whose output the broker refused puts the state before it back in the store; the
    refused write must not have changed what that state counts."""
    store = SessionStore(MemoryTable())
    writer = SessionWriter(store, record_max_bytes=RECORD_MAX)
    state = SessionState(session_id="s", agent="a")
    state.messages.extend(_message("user", 300, i) for i in range(40))
    writer.write(state, 0)
    before = store.get("s")
    assert before is not None
    size = before.size
    refused = state.snapshot()
    refused.messages[-1] = _message("assistant", 5_000, 41)
    refused.messages.append(_message("user", 7_000, 42))
    writer.write(refused, 1)
    store.put("s", before)
    assert before.size == size and len(before.sizes) == len(before.history) == 40
    after = state.snapshot()
    after.messages.append(_message("assistant", 200, 43))
    writer.write(after, 1)
    fresh = SessionStore(MemoryTable())
    SessionWriter(fresh, record_max_bytes=RECORD_MAX).write(after, 1)
    got, expected = store.get("s"), fresh.get("s")
    assert got is not None and expected is not None
    assert got.history_bytes == expected.history_bytes and list(got.sizes) == list(expected.sizes)


def test_applied_command_ids_past_the_kept_window_read_back_in_order() -> None:
    """Ids go round-robin into 256 slots: each step writes one, a reload has the newest 256."""
    store = SessionStore(MemoryTable())
    writer = SessionWriter(store, record_max_bytes=RECORD_MAX)
    log: Changelog = []
    state = SessionState(session_id="s", agent="a")
    delivery = Delivery()
    for n in range(300):
        delivery = delivery.applying(f"command-{n}")
        write = writer.write(state, n, delivery)
        assert len(write.records) == 2, "one id slot and the head"
        log.extend(write.records)
    reread = _restored(_compacted(log)).get("s")
    assert reread is not None
    assert reread.delivery.applied == tuple(f"command-{n}" for n in range(44, 300))
