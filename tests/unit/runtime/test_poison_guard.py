"""The command path's last line without a broker: an unexpected failure answers its record once,
and only."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import orjson
import pytest

from service.agent.definition import AgentDefinition
from service.agent.state import Inflight, SessionState
from service.runtime import answers as answers_module
from service.runtime.answers import Answers
from service.runtime.cancels import CancelDesk
from service.runtime.command_path import CommandPath
from service.runtime.faults import FaultPoints
from service.runtime.invoker import Invoker
from service.runtime.records import ParsedCommand
from service.runtime.txn_stream import CommitFailedError
from service.runtime.work import CommandWork, InputRecord, Origin, Outcome, OutRecord
from service.sessions.delivery import Delivery
from service.sessions.store import SessionStore, StoredSession
from service.sessions.table import StoreBrokenError
from service.settings import FaultSettings, TopicSettings
from service.wire.dlq import read_dlq_headers
from service.wire.errors import ErrorCode
from tests.support.agents import CycleModel
from tests.support.session_records import restored, writer_for

TOPICS = TopicSettings()

Step = Callable[[CommandWork, ParsedCommand], bool]


def _work(command_id: str = "c", offset: int = 3) -> CommandWork:
    record = InputRecord(Origin(TOPICS.commands, 0, offset), b"s", b"{}", [], 10)
    parsed = ParsedCommand(
        type="invoke", command_id=command_id, session_id="s", agent="a", input="hi"
    )
    return CommandWork(record, "s", parsed)


class _Guarded:
    """A command path whose cancel-coverage step is ``step`` (a failure there is no engine's)."""

    def __init__(
        self,
        state: SessionState | None = None,
        delivery: Delivery | None = None,
        *,
        fail_command: str | None = None,
    ) -> None:
        self.store = SessionStore()
        if state is not None:
            self.store.put("s", StoredSession(state, 4, delivery or Delivery()))
        self.outcomes: list[Outcome] = []
        writer = writer_for(self.store)
        answers = Answers(writer=writer, submit=self.outcomes.append, topics=TOPICS)
        self.desk = CancelDesk(writer=writer, submit=self.outcomes.append, topics=TOPICS)

        async def durable() -> None:
            return None

        self.path = CommandPath(
            store=self.store,
            cancels=self.desk,
            invoker=Invoker(
                writer=writer,
                submit=self.outcomes.append,
                durable=durable,
                stopping=lambda: False,
                topics=TOPICS,
                answers=answers,
                state_max_bytes=1 << 20,
            ),
            answers=answers,
            submit=self.outcomes.append,
            agents={"a": AgentDefinition(name="a", model=CycleModel(0))},
            topics=TOPICS,
            faults=FaultPoints(FaultSettings(fail_command=fail_command)),
        )

    def failing(self, step: Step) -> CommandPath:
        self.desk.covered = step
        return self.path


def _broken(exc: Exception) -> Step:
    def step(work: CommandWork, command: ParsedCommand) -> bool:
        raise exc

    return step


async def test_an_unexpected_failure_is_answered_internal_with_its_offset_and_state() -> None:
    marker = Inflight("c", "after_model", 0)
    t = _Guarded(SessionState(session_id="s", agent="a", inflight=marker))

    await t.failing(_broken(KeyError("surprise"))).handle(_work())
    [outcome] = t.outcomes
    assert outcome.finished == [Origin(TOPICS.commands, 0, 3)] and outcome.results == 1
    [record] = outcome.records
    assert record.topic == TOPICS.results and record.value is not None
    body = orjson.loads(record.value)
    assert body["command_id"] == "c" and body["error"]["code"] == "internal"
    assert "KeyError" in body["error"]["message"]
    assert outcome.state is not None
    stored = restored([outcome]).get("s")
    assert stored is not None
    assert stored.state.inflight is None and stored.delivery.answered("c")
    assert outcome.state.event_seq == 4


async def test_a_failure_after_the_answer_adds_nothing() -> None:
    t = _Guarded(SessionState(session_id="s", agent="a"))

    def answers_then_fails(work: CommandWork, command: ParsedCommand) -> bool:
        stored = t.store.get("s")
        assert stored is not None
        t.store.put("s", replace(stored, delivery=stored.delivery.applying("c")))
        t.outcomes.append(Outcome(finished=[work.record.origin], results=1))
        raise RuntimeError("late")

    await t.failing(answers_then_fails).handle(_work())
    assert len(t.outcomes) == 1


async def test_a_failing_redelivery_of_an_answered_command_only_finishes_its_offset() -> None:
    t = _Guarded(
        SessionState(session_id="s", agent="a"), Delivery(applied=("c",)), fail_command="c"
    )

    await t.path.handle(_work())
    assert t.outcomes == [Outcome(finished=[Origin(TOPICS.commands, 0, 3)])]


async def test_a_commit_failure_is_not_the_records() -> None:
    t = _Guarded()

    with pytest.raises(CommitFailedError):
        await t.failing(_broken(CommitFailedError("unknown outcome"))).handle(_work())
    assert t.outcomes == []


async def test_a_failing_local_store_is_not_the_records() -> None:
    """Answering would lose the command for a cache's fault: the owner restarts instead, on a
    store rebuilt from the topic, and the command is read again."""
    t = _Guarded()

    with pytest.raises(StoreBrokenError):
        await t.failing(_broken(StoreBrokenError("malformed"))).handle(_work())
    assert t.outcomes == []


async def test_a_local_store_failing_while_the_engine_runs_is_not_the_records() -> None:
    t = _Guarded(SessionState(session_id="s", agent="a"))
    reads = 0
    read = t.store.get

    def failing_once_in_the_engine(session_id: str) -> StoredSession | None:
        nonlocal reads
        reads += 1
        if reads == 3:  # the first two are the command path's own, before the engine
            raise StoreBrokenError("disk I/O error")
        return read(session_id)

    t.store.get = failing_once_in_the_engine  # type: ignore[method-assign]
    with pytest.raises(StoreBrokenError):
        await t.failing(lambda work, command: False).handle(_work())
    assert reads == 3
    assert not [o for o in t.outcomes if o.results or o.finished]


def test_a_record_failing_before_its_session_queue_is_dead_lettered() -> None:
    t = _Guarded()
    record = InputRecord(Origin(TOPICS.control, 1, 7), b"k", b"raw", [("h", b"v")], 10)
    t.path.record_failed(record, ValueError("bad routing"))
    [outcome] = t.outcomes
    assert outcome.finished == [record.origin] and outcome.replay_unsafe
    [dead] = outcome.records
    assert dead.topic == TOPICS.dlq and dead.key == b"k" and dead.value == b"raw"
    headers = dict(dead.headers)
    assert headers["h"] == b"v"
    assert any(b"bad routing" in value for value in headers.values())


def test_a_record_whose_headers_defeat_its_dead_letter_is_dead_lettered_without_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    build = answers_module.dlq_record

    def picky(topic: str, record: InputRecord, reason: str, code: ErrorCode) -> OutRecord:
        if record.headers:
            raise TypeError("a header this build cannot take")
        return build(topic, record, reason, code)

    monkeypatch.setattr(answers_module, "dlq_record", picky)
    t = _Guarded()
    record = InputRecord(Origin(TOPICS.commands, 1, 7), b"k", b"raw", [("a", None), ("b", b"")], 10)
    t.path.record_failed(record, ValueError("bad routing"))
    [outcome] = t.outcomes
    assert outcome.finished == [record.origin] and outcome.replay_unsafe
    [dead] = outcome.records
    assert dead.value == b"raw" and dead.key == b"k"
    read = read_dlq_headers(dead.headers)
    assert (read.source_offset, read.headers_dropped) == ("7", "2")


def test_a_record_that_cannot_even_be_dead_lettered_is_skipped_not_left_to_stop_the_partition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*_: object) -> OutRecord:
        raise RuntimeError("no dead letter at all")

    monkeypatch.setattr(answers_module, "dlq_record", broken)
    t = _Guarded()
    record = InputRecord(Origin(TOPICS.control, 1, 7), b"k", b"raw", [], 10)
    t.path.record_failed(record, ValueError("bad routing"))
    assert t.outcomes == [Outcome(finished=[record.origin], replay_unsafe=True)]


PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _traced_work(headers: list[tuple[str, bytes]]) -> CommandWork:
    work = _work()
    work.record = InputRecord(work.record.origin, b"s", b"{}", headers, 10)
    return work


def _result_traceparent(outcome: Outcome) -> list[str]:
    [record] = outcome.records
    return [value.decode() for name, value in record.headers if name == "traceparent"]


async def test_a_failure_before_the_command_span_opened_still_answers_in_its_trace() -> None:
    t = _Guarded(SessionState(session_id="s", agent="a"), fail_command="c")

    await t.path.handle(_traced_work([("traceparent", PARENT.encode())]))
    [traceparent] = _result_traceparent(t.outcomes[0])
    version, trace_id, span_id, flags = traceparent.split("-")
    assert (version, trace_id, flags) == ("00", "4bf92f3577b34da6a3ce929d0e0e4736", "01")
    assert span_id not in ("00f067aa0ba902b7", "0" * 16) and len(span_id) == 16


async def test_a_failure_inside_the_command_span_answers_with_that_span() -> None:
    t = _Guarded(SessionState(session_id="s", agent="a"))
    own = [("traceparent", b"00-11111111111111111111111111111111-2222222222222222-01")]

    def broken_after_span(work: CommandWork, command: ParsedCommand) -> bool:
        work.trace = own
        raise KeyError("surprise")

    await t.failing(broken_after_span).handle(_traced_work([("traceparent", PARENT.encode())]))
    [record] = t.outcomes[0].records
    assert record.headers == own


async def test_a_failing_command_without_trace_context_starts_a_trace_of_its_own() -> None:
    t = _Guarded(SessionState(session_id="s", agent="a"), fail_command="c")

    await t.path.handle(_traced_work([]))
    [traceparent] = _result_traceparent(t.outcomes[0])
    version, trace_id, _span_id, _flags = traceparent.split("-")
    assert version == "00" and trace_id != "4bf92f3577b34da6a3ce929d0e0e4736"
