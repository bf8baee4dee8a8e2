"""Versions of a session: numbered per step, kept within the bound, listed newest first, read
back whole by a fork; and the fork's refusals."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from service.agent.errors import SessionExistsError, VersionUnavailableError
from service.agent.state import Inflight, PendingBatch, SessionState
from service.agent.types import Checkpoint, Interrupt, Message
from service.runtime.answers import Answers
from service.runtime.cancels import CancelDesk
from service.runtime.command_path import CommandPath
from service.runtime.forks import SessionVersions, exists, source_state
from service.runtime.records import ParsedCommand
from service.runtime.work import CommandWork, InputRecord, Origin, Outcome
from service.sessions import history
from service.sessions.store import SessionStore
from service.sessions.versions import Step, page
from service.sessions.writer import SessionWriter, StateWrite
from service.settings import TopicSettings

TOPICS = TopicSettings()


def _user(text: str) -> Message:
    return {"role": "user", "content": [{"text": text}]}


def _assistant(text: str) -> Message:
    return {"role": "assistant", "content": [{"text": text}]}


class Log:
    """A session's records as the compacted topic ends up holding them."""

    def __init__(self) -> None:
        self.records: dict[bytes, bytes] = {}

    def apply(self, write: StateWrite) -> None:
        for key, value in write.records:
            if value is None:
                self.records.pop(key, None)
            else:
                self.records[key] = value

    def restored(self) -> SessionStore:
        store = SessionStore()
        rows = [(key, value, 0, 0) for key, value in self.records.items()]
        store.committed(rows, 1, {})
        store.flush()
        return store


def _writer(kept: int = 100) -> SessionWriter:
    return SessionWriter(SessionStore(), record_max_bytes=1 << 20, versions_kept=kept)


def _turn(writer: SessionWriter, log: Log, steps: int, session_id: str = "s") -> list[SessionState]:
    """``steps`` steps, each adding a message; returns the state at each version."""
    states = []
    state = SessionState(session_id=session_id, agent="a")
    for i in range(steps):
        state = state.snapshot()
        state.messages.append(_user(f"u{i}") if i % 2 == 0 else _assistant(f"a{i}"))
        state.cycle_index = i // 2
        log.apply(writer.write(state, i, step=Step(i // 2, f"c{i}", position="after_model")))
        states.append(state)
    return states


def test_every_step_is_the_next_version_and_other_writes_are_none() -> None:
    writer, log = _writer(), Log()
    states = _turn(writer, log, 3)
    # A write that is no step (progress, a refusal) keeps the version.
    log.apply(writer.write(states[-1], 9))
    stored = writer.store.get("s")
    assert stored is not None
    assert [e["version"] for e in stored.versions] == [1, 2, 3]
    assert stored.last_version == 3
    assert [e["messages"] for e in stored.versions] == [1, 2, 3]
    # A takeover reads the same versions back from the records.
    again = log.restored().get("s")
    assert again is not None
    assert again.versions == stored.versions
    # And numbering goes on from there.
    next_writer = SessionWriter(again_store := log.restored(), record_max_bytes=1 << 20)
    next_writer.write(states[-1], 10, step=Step(2, "c9", stop_reason="end_turn"))
    latest = again_store.get("s")
    assert latest is not None and latest.last_version == 4


def test_versions_past_the_bound_are_tombstoned_oldest_first() -> None:
    writer, log = _writer(kept=3), Log()
    _turn(writer, log, 5)
    stored = log.restored().get("s")
    assert stored is not None
    assert [e["version"] for e in stored.versions] == [3, 4, 5]
    kept = {k for k in log.records if history.is_history_key(k) and k[2:3] in (b"v", b"b")}
    assert kept == {history.version_key("s", v) for v in (3, 4, 5)} | {
        history.body_key("s", v) for v in (3, 4, 5)
    }


def test_a_rollback_removes_the_versions_after_its_own_and_numbering_resumes_there() -> None:
    """A command that failed after committing boundaries leaves the session as before it: the
    versions those boundaries made go too, for the next turn rewrites the messages they read."""
    writer, log = _writer(), Log()
    states = _turn(writer, log, 4)
    log.apply(writer.write(states[1], 9, rollback_to=2))
    stored = log.restored().get("s")
    assert stored is not None
    assert [e["version"] for e in stored.versions] == [1, 2]
    kept = {k for k in log.records if history.is_history_key(k) and k[2:3] in (b"v", b"b")}
    assert kept == {history.version_key("s", v) for v in (1, 2)} | {
        history.body_key("s", v) for v in (1, 2)
    }
    log.apply(writer.write(states[2], 10, step=Step(1, "c5", position="after_model")))
    latest = writer.store.get("s")
    assert latest is not None and latest.last_version == 3
    # Back to before the first version: none is left.
    log.apply(writer.write(SessionState(session_id="s", agent="a"), 11, rollback_to=0))
    assert log.restored().get("s").versions == []  # type: ignore[union-attr]


@pytest.mark.parametrize("boundaries", [2, 5])
def test_a_rollback_finds_the_versions_the_session_had_before_its_command(
    boundaries: int,
) -> None:
    """Versions kept: 3. A command commits ``boundaries`` boundaries while it runs (its
    in-flight marker set), then fails: the session is back to before it, with the three
    versions it had then, listed and forkable, and numbering goes on after the newest. The
    command's boundaries dropped none of them, five boundaries (past the bound) included."""
    writer, log = _writer(kept=3), Log()
    states = _turn(writer, log, 4)  # versions 1-4; 2, 3 and 4 kept
    running = states[-1]
    for i in range(boundaries):
        running = running.snapshot()
        running.messages.append(_user(f"more {i}"))
        running.inflight = Inflight("c9", "after_tools", i, False)
        log.apply(writer.write(running, 10 + i, step=Step(i, "c9", position="after_tools")))
    during = writer.store.get("s")
    assert during is not None
    assert [e["version"] for e in during.versions] == list(range(2, 5 + boundaries))
    log.apply(writer.write(states[-1], 20, rollback_to=4))
    for store in (writer.store, log.restored()):
        stored = store.get("s")
        assert stored is not None
        assert [e["version"] for e in stored.versions] == [2, 3, 4]
    forked, at = source_state(log.records, "s", 2, "f")
    assert at["version"] == 2 and forked.messages == states[1].messages
    kept = {k for k in log.records if history.is_history_key(k) and k[2:3] in (b"v", b"b")}
    assert kept == {history.version_key("s", v) for v in (2, 3, 4)} | {
        history.body_key("s", v) for v in (2, 3, 4)
    }
    # The next command's end is version 5, and the bound holds again from there.
    ended = states[-1].snapshot()
    ended.messages.append(_assistant("done"))
    log.apply(writer.write(ended, 21, step=Step(0, "c10", stop_reason="end_turn")))
    latest = log.restored().get("s")
    assert latest is not None and [e["version"] for e in latest.versions] == [3, 4, 5]


def test_a_command_that_ends_drops_the_versions_past_the_bound_its_boundaries_kept() -> None:
    writer, log = _writer(kept=3), Log()
    running = _turn(writer, log, 3)[-1]
    for i in range(4):
        running = running.snapshot()
        running.messages.append(_user(f"more {i}"))
        running.inflight = Inflight("c9", "after_tools", i, False)
        log.apply(writer.write(running, 10 + i, step=Step(i, "c9", position="after_tools")))
    running = running.snapshot()
    running.inflight = None
    log.apply(writer.write(running, 20, step=Step(4, "c9", stop_reason="end_turn")))
    stored = log.restored().get("s")
    assert stored is not None and [e["version"] for e in stored.versions] == [6, 7, 8]
    kept = {k for k in log.records if history.is_history_key(k) and k[2:3] in (b"v", b"b")}
    assert len(kept) == 6


def test_history_pages_newest_first_with_a_cursor() -> None:
    entries: list[dict[str, Any]] = [{"version": v, "parts": 1} for v in range(3, 9)]
    first, cursor = page(entries, 4, None)
    assert [e["version"] for e in first] == [8, 7, 6, 5]
    assert all("parts" not in e for e in first)
    assert cursor == 5
    second, cursor = page(entries, 4, cursor)
    assert [e["version"] for e in second] == [4, 3]
    assert cursor is None
    assert page([], 4, None) == ([], None)


def test_a_version_reads_back_as_it_was_though_the_session_went_on() -> None:
    writer, log = _writer(), Log()
    state = SessionState(session_id="s", agent="a", messages=[_user("hi")])
    log.apply(writer.write(state, 1, step=Step(0, "c1", stop_reason="end_turn")))
    paused = state.snapshot()
    use = {"toolUse": {"toolUseId": "t1", "name": "f", "input": {}}}
    asked: Message = {"role": "assistant", "content": [{"text": "let me see"}, use]}
    paused.messages.append(asked)
    paused.pending = PendingBatch(assistant_message=asked)
    paused.checkpoint = Checkpoint(position="after_model", cycle_index=0)
    log.apply(writer.write(paused, 2, step=Step(0, "c2", position="after_model")))
    # Later: the tool's result, a reply, and the last message replaced by a joined one.
    later = paused.snapshot()
    later.pending, later.checkpoint = None, None
    later.messages.append(_user("result"))
    later.messages.append(_assistant("done"))
    log.apply(writer.write(later, 3, step=Step(1, "c3", stop_reason="end_turn")))
    joined = later.snapshot()
    joined.messages[-1] = _assistant("done, and more")
    log.apply(writer.write(joined, 4, step=Step(1, "c4", stop_reason="end_turn")))

    forked, found = source_state(log.records, "s", 2, "s2")
    assert found["position"] == "after_model"
    assert forked.session_id == "s2"
    assert forked.messages == paused.messages
    assert forked.checkpoint == paused.checkpoint
    assert forked.pending is not None and forked.pending.assistant_message == asked
    at_three, _ = source_state(log.records, "s", 3, "s3")
    assert at_three.messages == later.messages


def test_a_version_that_ran_on_forks_into_a_pause_at_its_boundary() -> None:
    writer, log = _writer(), Log()
    state = SessionState(session_id="s", agent="a", messages=[_user("hi"), _assistant("x")])
    state.inflight = Inflight("c1", "after_tools", 2)
    log.apply(writer.write(state, 1, step=Step(2, "c1", position="after_tools")))
    forked, _ = source_state(log.records, "s", 1, "f")
    assert forked.inflight is None
    assert forked.checkpoint == Checkpoint(position="after_tools", cycle_index=2)
    assert forked.turn_checkpointing is True


def test_versions_not_kept_are_refused() -> None:
    writer, log = _writer(kept=2), Log()
    _turn(writer, log, 4)
    with pytest.raises(VersionUnavailableError, match="not kept"):
        source_state(log.records, "s", 1, "f")  # compacted away
    with pytest.raises(VersionUnavailableError, match="not kept"):
        source_state(log.records, "s", 9, "f")  # never reached
    with pytest.raises(VersionUnavailableError, match="no state"):
        source_state(log.records, "gone", 1, "f")
    # A version record the head does not name (left over) is not forked from.
    log.records[history.version_key("s", 7)] = log.records[history.version_key("s", 4)]
    log.records[history.body_key("s", 7)] = log.records[history.body_key("s", 4)]
    with pytest.raises(VersionUnavailableError, match="not kept"):
        source_state(log.records, "s", 7, "f")
    # A lost message record is refused too, not forked into a shorter conversation.
    del log.records[history.message_key("s", 1)]
    with pytest.raises(VersionUnavailableError):
        source_state(log.records, "s", 4, "f")


class Desk:
    """The history and fork answers of one partition, the source read from ``source``."""

    def __init__(self, source: Log, max_bytes: int = 1 << 20) -> None:
        self.store = SessionStore()
        self.writer = SessionWriter(self.store, record_max_bytes=1 << 20)
        self.outcomes: list[Outcome] = []
        self.reads: list[str] = []

        async def records(session_id: str) -> dict[bytes, bytes]:
            self.reads.append(session_id)
            return dict(source.records)

        answers = Answers(writer=self.writer, submit=self.outcomes.append, topics=TOPICS)
        self.versions = SessionVersions(
            store=self.store,
            writer=self.writer,
            answers=answers,
            submit=self.outcomes.append,
            topics=TOPICS,
            session_records=records,
            max_bytes=max_bytes,
        )

    async def send(self, kind: str, session_id: str, command_id: str, **options: Any) -> None:
        command = ParsedCommand(kind, command_id, session_id, None, None, options=options)
        record = InputRecord(Origin(TOPICS.commands, 0, len(self.outcomes)), b"", b"{}", [], 0)
        await self.versions.answer(CommandWork(record, session_id, command), command)

    def last_result(self) -> dict[str, Any]:
        record = self.outcomes[-1].records[-1]
        assert record.value is not None
        loaded: dict[str, Any] = orjson.loads(record.value)
        return loaded


async def test_a_fork_writes_the_new_session_at_its_version_one() -> None:
    log = Log()
    _turn(_writer(), log, 3)
    desk = Desk(log)
    await desk.send("fork", "f", "k1", source_session_id="s", version=2)
    result = desk.last_result()
    assert result["forked_from"] == {"session_id": "s", "version": 2}
    assert result["version"] == 1 and result["stop_reason"] == "end_turn"
    stored = desk.store.get("f")
    assert stored is not None
    assert [e["version"] for e in stored.versions] == [1]
    assert stored.versions[0]["forked_from"] == {"session_id": "s", "version": 2}
    assert len(stored.state.messages) == 2
    assert stored.delivery.answered("k1")
    # A history of the fork lists that one version.
    await desk.send("history", "f", "h1", limit=10, before=None)
    page_ = desk.last_result()["history"]
    assert [e["version"] for e in page_["versions"]] == [1]
    assert page_["next_before"] is None and page_["oldest_kept"] == 1


async def test_a_fork_into_an_existing_session_is_refused_session_exists() -> None:
    log = Log()
    _turn(_writer(), log, 2)
    desk = Desk(log)
    await desk.send("fork", "f", "k1", source_session_id="s", version=1)
    await desk.send("fork", "f", "k2", source_session_id="s", version=2)
    result = desk.last_result()
    assert result["stop_reason"] == "error"
    assert result["error"]["code"] == SessionExistsError.code == "session_exists"
    stored = desk.store.get("f")
    assert stored is not None and len(stored.state.messages) == 1  # still version 1's state
    # The existing session is not even read from: the refusal needs no source.
    assert desk.reads == ["s"]


async def test_a_fork_of_a_version_not_kept_is_refused_and_leaves_no_session() -> None:
    log = Log()
    _turn(_writer(kept=2), log, 4)
    desk = Desk(log)
    await desk.send("fork", "f", "k1", source_session_id="s", version=1)
    result = desk.last_result()
    assert result["error"]["code"] == VersionUnavailableError.code == "version_unavailable"
    # Only the refused command's id is kept (it is answered once), which is no session.
    stored = desk.store.get("f")
    assert stored is not None and not exists(stored) and stored.delivery.answered("k1")
    # The same target may be forked once the version asked for is one kept.
    await desk.send("fork", "f", "k2", source_session_id="s", version=4)
    assert desk.last_result()["forked_from"] == {"session_id": "s", "version": 4}


async def test_the_command_path_answers_a_fork_once_even_when_it_is_read_again() -> None:
    log = Log()
    _turn(_writer(), log, 2)
    desk = Desk(log)
    cancels = CancelDesk(writer=desk.writer, submit=desk.outcomes.append, topics=TOPICS)
    answers = Answers(writer=desk.writer, submit=desk.outcomes.append, topics=TOPICS)
    path = CommandPath(
        store=desk.store,
        cancels=cancels,
        invoker=None,  # type: ignore[arg-type]  # no engine command is sent
        answers=answers,
        submit=desk.outcomes.append,
        agents={},
        topics=TOPICS,
        versions=desk.versions,
    )
    command = ParsedCommand(
        "fork", "k1", "f", None, None, options={"source_session_id": "s", "version": 2}
    )
    for offset in (0, 0, 1):  # read twice at its offset, then published again
        record = InputRecord(Origin(TOPICS.commands, 0, offset), b"f", b"{}", [], 0)
        await path.handle(CommandWork(record, "f", command))
    results = [r for o in desk.outcomes for r in o.records if r.topic == TOPICS.results]
    assert len(results) == 1
    assert len(desk.outcomes) == 3  # the answer, then two offsets finished without one
    assert desk.reads == ["s"]


async def test_a_fork_of_a_partly_answered_interrupt_pause_lists_only_the_open_interrupts() -> None:
    # The source's result at that version listed the interrupts still waiting for an answer;
    # the fork's result must list the same ones, not those answered before (kept in the state
    # until the batch completes), or a client answering "every id" answers one twice.
    writer, log = _writer(), Log()
    asked: Message = {
        "role": "assistant",
        "content": [
            {"toolUse": {"toolUseId": f"t{n}", "name": "ask", "input": {}}} for n in range(3)
        ],
    }
    state = SessionState(session_id="s", agent="a", messages=[_user("hi")])
    state.pending = PendingBatch(
        asked,
        interrupts=[
            Interrupt("i0", "ask-0", {"n": 0}, response="answered"),
            Interrupt("i1", "ask-1", {"n": 1}),
            Interrupt("i2", "ask-2", {"n": 2}),
        ],
    )
    log.apply(writer.write(state, 1, step=Step(0, "c1", stop_reason="interrupt")))
    desk = Desk(log)
    await desk.send("fork", "f", "k1", source_session_id="s", version=1)
    result = desk.last_result()
    assert result["stop_reason"] == "interrupt"
    assert [i["id"] for i in result["interrupts"]] == ["i1", "i2"]
    assert all(i["response"] is None for i in result["interrupts"])
    # The fork keeps the answer given in the source: its batch still needs it.
    stored = desk.store.get("f")
    assert stored is not None and stored.state.pending is not None
    assert [i.response for i in stored.state.pending.interrupts] == ["answered", None, None]


async def test_a_fork_result_carries_the_message_of_the_pause_it_is_at() -> None:
    # As the source's own result at that version did: the tool calls a checkpoint or an
    # interrupt waits on (a client approves them from `message`), or the turn's last answer.
    writer, log = _writer(), Log()
    state = SessionState(session_id="s", agent="a", messages=[_user("hi"), _assistant("hello")])
    log.apply(writer.write(state, 1, step=Step(0, "c1", stop_reason="end_turn")))
    use = {"toolUse": {"toolUseId": "t1", "name": "f", "input": {}}}
    asked: Message = {"role": "assistant", "content": [{"text": "let me see"}, use]}
    paused = state.snapshot()
    paused.messages += [_user("look it up"), asked]
    paused.pending = PendingBatch(assistant_message=asked)
    paused.checkpoint = Checkpoint(position="after_model", cycle_index=0)
    log.apply(writer.write(paused, 2, step=Step(0, "c2", stop_reason="checkpoint")))
    ran = paused.snapshot()
    ran.pending = None
    ran.messages.append(
        {"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "content": []}}]}
    )
    ran.checkpoint = Checkpoint(position="after_tools", cycle_index=0)
    log.apply(writer.write(ran, 3, step=Step(0, "c3", stop_reason="checkpoint")))
    waiting = paused.snapshot()
    waiting.checkpoint = None
    waiting.pending = PendingBatch(asked, interrupts=[Interrupt("i1", "approve")])
    log.apply(writer.write(waiting, 4, step=Step(0, "c4", stop_reason="interrupt")))
    desk = Desk(log)
    expected = {1: ("end_turn", _assistant("hello")), 2: ("checkpoint", asked)}
    expected |= {3: ("checkpoint", asked), 4: ("interrupt", asked)}
    for version, (stop_reason, message) in expected.items():
        await desk.send(
            "fork", f"f{version}", f"k{version}", source_session_id="s", version=version
        )
        result = desk.last_result()
        assert (result["stop_reason"], result["message"]) == (stop_reason, message), version


async def test_a_fork_result_too_large_with_its_message_is_sent_without_it() -> None:
    writer, log = _writer(), Log()
    long_answer = _assistant("x" * 5_000)
    state = SessionState(session_id="s", agent="a", messages=[_user("hi"), long_answer])
    log.apply(writer.write(state, 1, step=Step(0, "c1", stop_reason="end_turn")))
    desk = Desk(log, max_bytes=4_000)
    await desk.send("fork", "f", "k1", source_session_id="s", version=1)
    result = desk.last_result()
    assert result["forked_from"] == {"session_id": "s", "version": 1}
    assert result["message"] is None
    stored = desk.store.get("f")
    assert stored is not None and stored.state.messages[-1] == long_answer
