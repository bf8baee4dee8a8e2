"""What a new owner publishes again of the batches it found left open (no broker)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition

from service.agent.state import SessionState
from service.observability.metrics import Metrics
from service.runtime import left_open
from service.runtime.left_open import (
    Done,
    Held,
    Repairing,
    published,
    published_again,
    restore_repaired,
    vouched,
)
from service.runtime.transactions import PROBE_KEY, LeftOpen
from service.runtime.work import OutRecord
from service.sessions import store as store_module
from service.sessions.delivery import Delivery
from service.sessions.store import SessionStore, event_seq_header
from service.sessions.table import MemoryTable
from service.sessions.writer import SessionWriter, StateWrite
from service.settings import TopicSettings

TOPICS = TopicSettings(
    commands="t.commands",
    control="t.control",
    sessions="t.sessions",
    results="t.results",
    events="t.events",
    dlq="t.dlq",
)
PARTITION = 3


def result(session: str, command: str) -> OutRecord:
    body = {"type": "agent_result", "session_id": session, "command_id": command}
    return OutRecord(TOPICS.results, session.encode(), orjson.dumps(body), partition=PARTITION)


def event(session: str, seq: Any) -> OutRecord:
    body = {"type": "tool_started", "session_id": session, "seq": seq}
    return OutRecord(TOPICS.events, session.encode(), orjson.dumps(body), partition=PARTITION)


def message(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "content": [{"text": text}]}


def as_records(write: StateWrite) -> list[OutRecord]:
    head = write.session_id.encode()
    return [
        OutRecord(
            TOPICS.sessions,
            key,
            value,
            [event_seq_header(write.event_seq)] if key == head else [],
            PARTITION,
        )
        for key, value in write.records
    ]


@dataclass
class Steps:
    """Session s1 committed at event seq 7 with command ``old`` applied; the records of the
    step after it (event seq 9, command ``new`` applied, one message more), and a store restored
    from what was committed."""

    committed: list[OutRecord]
    step: list[OutRecord]
    restored: SessionStore = field(init=False)

    def __post_init__(self) -> None:
        self.restored = SessionStore(MemoryTable())
        for record in self.committed:
            self.restored.load(record.key, record.value, record.headers)


def steps() -> Steps:
    writer = SessionWriter(SessionStore(MemoryTable()), record_max_bytes=1 << 20)
    first = SessionState(session_id="s1", agent="a", messages=[message("user", "hi")])
    done = writer.write(first, 7, Delivery(applied=("old",)))
    writer.store.committed(
        [(k, v, 7, 0) for k, v in done.records], len(done.records), {"s1": done.version}
    )
    second = SessionState(
        session_id="s1",
        agent="a",
        messages=[message("user", "hi"), message("assistant", "hello")],
    )
    step = writer.write(second, 9, Delivery(applied=("old", "new")))
    return Steps(as_records(done), as_records(step))


class Tails:
    """Committed records at the end of each partition; counts what was read."""

    def __init__(self, **by_topic: list[OutRecord]) -> None:
        self.by_topic = by_topic
        self.asked: list[tuple[str, int]] = []

    async def partition_for(self, topic: str, session_id: str) -> int:
        return PARTITION

    async def committed_tail(self, tp: TopicPartition, offsets: int) -> list[OutRecord]:
        assert tp.partition == PARTITION
        self.asked.append((tp.topic, offsets))
        found = self.by_topic.get(tp.topic.removeprefix("t."), [])
        return found[max(0, len(found) - offsets) :]


async def again(left: list[OutRecord], store: SessionStore, tails: Tails) -> list[OutRecord]:
    return await published_again(left, store, tails, TOPICS, PARTITION)


def test_only_what_the_state_records_is_vouched_for() -> None:
    applied = Done(7, Delivery(applied=("done",)))
    left = [
        result("s1", "done"),
        result("s1", "redone"),
        result("unknown", "done"),
        event("s1", 7),
        event("s1", 8),
        event("s1", True),
        OutRecord(TOPICS.results, PROBE_KEY, None),
        OutRecord(TOPICS.results, b"s1", b"not json"),
        OutRecord(TOPICS.results, b"s1", b"[1]"),
    ]
    kept = vouched(left, lambda s: applied if s == "s1" else None, TOPICS)
    assert kept == [left[0], left[3]]


async def test_a_sessions_batch_whose_events_are_committed_is_published_again() -> None:
    # The restart dropped the step's marker on sessions only: its events are visible.
    s = steps()
    open_events = [event("s1", 8)]  # on a partition that lost its marker too
    open_results = [result("s1", "new"), result("s1", "other")]
    tails = Tails(events=[event("s1", 6), event("s1", 7), event("s1", 9)])
    kept = await again(s.step + open_results + open_events, s.restored, tails)
    # The session records as they were, then what the step's state records.
    assert kept == [*s.step, open_results[0], open_events[0]]
    assert all(topic == "t.events" for topic, _ in tails.asked)


async def test_a_sessions_batch_whose_result_is_committed_is_published_again() -> None:
    s = steps()
    tails = Tails(events=[event("s1", 7)], results=[result("s1", "old"), result("s1", "new")])
    assert await again(s.step, s.restored, tails) == s.step
    assert [topic for topic, _ in tails.asked] == ["t.events", "t.results"]


async def test_the_decision_decodes_no_conversation(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only heads and applied command ids are read, so a large session costs the owner's start
    # no decode of its messages on the event loop.
    s = steps()

    def whole(*_: Any) -> Any:
        raise AssertionError("a session was decoded whole")

    monkeypatch.setattr(store_module, "decode_session", whole)
    monkeypatch.setattr(left_open, "decode_session", whole, raising=False)
    tails = Tails(events=[event("s1", 9)])
    assert await again([*s.step, result("s1", "new")], s.restored, tails) == [
        *s.step,
        result("s1", "new"),
    ]
    redone = [*s.step, result("s1", "old"), result("s1", "new")]
    assert await again(redone, s.restored, Tails()) == [result("s1", "old")]


@pytest.mark.parametrize(
    "visible",
    [
        [],
        [event("s1", 7)],  # an earlier step's: the restored state has it
        [event("s1", 10)],  # past what the open records say
        [event("s2", 8)],  # another session's
        [event("s1", "8"), event("s1", None)],
        [OutRecord(TOPICS.events, b"s1", b"{oops"), OutRecord(TOPICS.events, PROBE_KEY, None)],
    ],
)
async def test_without_a_committed_part_the_sessions_batch_is_redone(
    visible: list[OutRecord],
) -> None:
    s = steps()
    left = [*s.step, result("s1", "old"), result("s1", "new"), event("s1", 8)]
    odd = OutRecord(TOPICS.results, b"s1", orjson.dumps({"session_id": "s1", "command_id": [1]}))
    tails = Tails(events=visible, results=[result("s1", "old"), odd])
    # Only what the restored state records: the step's records are not published again.
    assert await again(left, s.restored, tails) == [left[len(s.step)]]


async def test_the_committed_tails_are_read_wide_enough_for_the_step() -> None:
    s = steps()
    tails = Tails()
    await again(s.step, s.restored, tails)
    # Two events and one command are the step's; the read goes some way before them.
    assert [topic for topic, _ in tails.asked] == ["t.events", "t.results"]
    events, results = (offsets for _, offsets in tails.asked)
    assert events - results == 1
    assert results > 1_000


async def test_a_deleted_or_unreadable_session_reads_no_tail() -> None:
    s = steps()
    deleted = [OutRecord(TOPICS.sessions, b"s1", None, partition=PARTITION)]
    garbled = [OutRecord(TOPICS.sessions, b"s1", b"{not a head", [event_seq_header(9)], PARTITION)]
    history_only = [r for r in s.step if r.key != b"s1"]
    for left in (deleted, garbled, history_only, []):
        tails = Tails(events=[event("s1", 8)])
        assert await again(left, s.restored, tails) == []
        assert tails.asked == []


async def test_a_new_session_counts_from_nothing() -> None:
    # The open step created the session: nothing of it is restored.
    s = steps()
    tails = Tails(events=[event("s1", 1)])
    kept = await again(s.committed, SessionStore(MemoryTable()), tails)
    assert kept == s.committed


class HeldReader(Tails):
    """The sessions partition ends at ``end`` with nothing open; ``written`` committed records
    are at its end."""

    def __init__(self, end: int, written: list[OutRecord]) -> None:
        super().__init__(sessions=written)
        self.end = end

    async def stable_and_end(
        self, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, tuple[int, int]]:
        return dict.fromkeys(partitions, (self.end, self.end))

    async def read_open(self, tp: TopicPartition, start: int, end: int) -> list[OutRecord]:
        raise AssertionError("nothing is open")


async def restore() -> SessionStore:
    return SessionStore(MemoryTable())


async def no_abort(partitions: list[TopicPartition]) -> None:
    raise AssertionError("nothing to abort")


@pytest.mark.parametrize(
    ("end", "written", "published"),
    [
        (10, [], True),  # an earlier claim failed before it wrote anything
        (14, [], True),  # it wrote, and was aborted: nothing committed since
        (14, [result("s9", "x")], False),  # another owner wrote the partition since
        (8, [], False),  # the partition is not the one the records were held for
    ],
)
async def test_held_records_are_published_only_over_what_they_were_held_at(
    end: int, written: list[OutRecord], published: bool
) -> None:
    s = steps()
    held = {PARTITION: Held(10, s.step), PARTITION + 1: Held(3, s.committed)}
    reader = HeldReader(end, written)
    _, again = await restore_repaired(
        reader, restore, no_abort, LeftOpen(), held, Repairing(TOPICS, PARTITION, Metrics(), 0.0)
    )
    assert again == (s.step if published else [])
    # Held until the claim drops it; another partition's is not touched.
    assert (PARTITION in held) is published
    assert held[PARTITION + 1].records == s.committed
    if end - 10 >= 0 and end != 10:
        assert reader.asked == [("t.sessions", end - 10)]


def test_records_published_again_are_the_sessions_state_written_now() -> None:
    s = steps()
    store = s.restored
    assert store.get("s1") is not None  # cached as restored: the load replaces it
    published([*s.step, result("s1", "new")], store, TOPICS.sessions)
    stored = store.get("s1")
    assert stored is not None
    assert (stored.event_seq, stored.delivery.applied) == (9, ("old", "new"))
    assert len(stored.state.messages) == 2
    # Not idle since the epoch: an idle-session expiry does not take it at once.
    assert list(store.table.idle(int(time.time() * 1000) - 60_000, 10)) == []
