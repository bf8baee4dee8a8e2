"""The command path without a broker: its steps in order, and which answer wins.

The engine is a fake that records what reaches it; the cancel desk, the answers and the session
store are the real ones (none of them touches Kafka).
"""

from __future__ import annotations

import gc
import json
import logging
import weakref
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from service.agent.definition import AgentDefinition
from service.agent.errors import InterruptPendingError
from service.agent.state import Inflight, SessionState
from service.observability.metrics import Metrics
from service.runtime.answers import FALLBACK_RESULT_MAX_BYTES, Answers
from service.runtime.cancels import CancelDesk
from service.runtime.command_path import CommandPath
from service.runtime.control import parse_cancel
from service.runtime.invoker import AbandonedError
from service.runtime.partitioning import keyed_partition
from service.runtime.records import ParsedCommand, parse_command
from service.runtime.work import CommandWork, InputRecord, Origin, Outcome
from service.sessions import history
from service.sessions.codec import encode_state
from service.sessions.delivery import Delivery
from service.sessions.store import SessionStore, StoredSession
from service.sessions.versions import Step
from service.sessions.writer import StateTooLargeError
from service.settings import TopicSettings
from service.wire.commands import CancelCommand
from service.wire.errors import WireError
from tests.support.agents import CycleModel
from tests.support.session_records import restored, writer_for

TOPICS = TopicSettings()


class FakeEngine:
    """Stands in for the invoker: records every command that reaches it, then fails with
    ``fails`` if given (else it answers nothing, as a run its test does not look at)."""

    def __init__(self, fails: BaseException | None = None) -> None:
        self.fails = fails
        self.ran: list[str] = []

    async def run(
        self, work: CommandWork, command: ParsedCommand, agent: Any, stored: StoredSession
    ) -> None:
        self.ran.append(command.command_id)
        if self.fails is not None:
            raise self.fails


class Harness:
    def __init__(
        self,
        engine: FakeEngine | None = None,
        store: SessionStore | None = None,
        owns: Callable[[str], bool] | None = None,
        agents: tuple[str, ...] = ("a",),
    ) -> None:
        self.store = store if store is not None else SessionStore()
        self.outcomes: list[Outcome] = []
        self.metrics = Metrics()
        self.engine = engine if engine is not None else FakeEngine()
        writer = writer_for(self.store)
        self.desk = CancelDesk(
            writer=writer, submit=self._committed, topics=TOPICS, metrics=self.metrics
        )
        self.answers = Answers(
            writer=writer, submit=self._committed, topics=TOPICS, metrics=self.metrics
        )
        self.path = CommandPath(
            store=self.store,
            cancels=self.desk,
            invoker=self.engine,
            answers=self.answers,
            submit=self._committed,
            agents={name: AgentDefinition(name=name, model=CycleModel(1)) for name in agents},
            topics=TOPICS,
            metrics=self.metrics,
            owns=owns,
        )

    def _committed(self, outcome: Outcome) -> None:
        """As the committer does once an outcome is committed: counted then."""
        self.outcomes.append(outcome)
        if outcome.counted is not None:
            outcome.counted()

    def results(self) -> list[dict[str, Any]]:
        return [
            orjson.loads(record.value)
            for outcome in self.outcomes
            for record in outcome.records
            if record.topic == TOPICS.results and record.value is not None
        ]

    def counted(self, command_type: str, outcome: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "cairn_commands_total", {"type": command_type, "outcome": outcome}
        )
        return value or 0.0


def _record(topic: str, offset: int, ts: int, value: bytes = b"{}") -> InputRecord:
    return InputRecord(Origin(topic, 0, offset), b"s", value, [], ts)


def _command(command_id: str, offset: int, ts: int = 100, agent: str = "a") -> CommandWork:
    parsed = ParsedCommand(
        type="invoke", command_id=command_id, session_id="s", agent=agent, input="hi"
    )
    return CommandWork(_record(TOPICS.commands, offset, ts), "s", parsed)


def _refused(command_id: str, offset: int, ts: int = 100) -> CommandWork:
    """A command the wire refused that still named its session and id."""
    error = WireError("prompt: required", session_id="s", command_id=command_id)
    return CommandWork(_record(TOPICS.commands, offset, ts), "s", None, error)


def _applied(*command_ids: str) -> SessionStore:
    store = SessionStore()
    state = SessionState(session_id="s", agent="a")
    store.put("s", StoredSession(state, 2, Delivery(applied=command_ids)))
    return store


async def test_a_command_a_cancel_covers_never_reaches_the_engine() -> None:
    t = Harness()
    t.desk.read(_record(TOPICS.control, 0, 100), CancelCommand(command_id="x", session_id="s"))
    await t.path.handle(_command("early", 1, ts=90))
    await t.path.handle(_command("later", 2, ts=110))
    assert t.engine.ran == ["later"]
    [answer] = t.results()
    assert (answer["command_id"], answer["stop_reason"]) == ("early", "cancelled")


async def test_an_applied_command_is_skipped_before_a_cancel_or_the_engine_sees_it() -> None:
    t = Harness(store=_applied("c"))
    # Covered by a cancel too: being answered before wins, so it is not answered again.
    t.desk.read(_record(TOPICS.control, 0, 200), CancelCommand(command_id="x", session_id="s"))
    await t.path.handle(_command("c", 5, ts=100))
    assert t.engine.ran == []
    assert t.outcomes == [Outcome(finished=[Origin(TOPICS.commands, 0, 5)])]
    assert t.counted("invoke", "duplicate") == 1


async def test_an_engine_failure_is_answered_once_with_internal() -> None:
    t = Harness(FakeEngine(fails=RuntimeError("boom")))
    await t.path.handle(_command("c", 3))
    assert t.engine.ran == ["c"]
    [outcome] = t.outcomes
    assert outcome.finished == [Origin(TOPICS.commands, 0, 3)] and outcome.results == 1
    [answer] = t.results()
    assert answer["error"] == {"code": "internal", "message": "RuntimeError: boom"}
    stored = restored([outcome]).get("s")
    assert stored is not None and stored.delivery.answered("c")
    assert t.counted("invoke", "error") == 1
    # Read again after a crash: recognised, never run or answered a second time.
    await t.path.handle(_command("c", 3))
    assert t.engine.ran == ["c"] and len(t.results()) == 1


async def test_a_failure_outside_the_engine_is_answered_once_with_internal() -> None:
    t = Harness()

    def broken(work: CommandWork, command: ParsedCommand) -> bool:
        raise KeyError("surprise")

    t.desk.covered = broken
    await t.path.handle(_command("c", 3))
    assert t.engine.ran == []
    [answer] = t.results()
    assert answer["error"]["code"] == "internal"
    assert answer["error"]["message"].startswith("unexpected failure: KeyError")
    assert t.counted("invoke", "error") == 1


async def test_a_decode_error_is_answered_with_its_code_even_when_a_cancel_covers_it() -> None:
    t = Harness()
    t.desk.read(_record(TOPICS.control, 0, 200), CancelCommand(command_id="x", session_id="s"))
    await t.path.handle(_refused("bad", 1, ts=100))
    assert t.engine.ran == []
    [answer] = t.results()
    assert answer["command_id"] == "bad" and answer["stop_reason"] == "error"
    assert answer["error"] == {"code": "invalid_command", "message": "prompt: required"}
    # The refusal is remembered: published again, it is not answered again.
    await t.path.handle(_refused("bad", 2, ts=300))
    assert len(t.results()) == 1
    assert t.outcomes[-1] == Outcome(finished=[Origin(TOPICS.commands, 0, 2)])


@pytest.mark.parametrize(
    ("topic", "counted_as"), [(TOPICS.commands, "other"), (TOPICS.control, "cancel")]
)
def test_a_decode_error_naming_no_session_is_dead_lettered_as_it_is_read(
    topic: str, counted_as: str
) -> None:
    t = Harness()
    record = _record(topic, 4, 100, b"not json")
    assert t.path.undecodable(record, WireError("not a JSON object")) is None
    [outcome] = t.outcomes
    assert outcome.finished == [record.origin] and outcome.replay_unsafe
    [dead] = outcome.records
    assert dead.topic == TOPICS.dlq and dead.value == b"not json"
    assert t.counted(counted_as, "dlq") == 1
    assert t.metrics.registry.get_sample_value(
        "cairn_dlq_records_total", {"reason": "invalid_command"}
    )


def test_a_key_of_a_megabyte_is_cut_short_in_the_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    t = Harness()
    record = InputRecord(Origin(TOPICS.commands, 0, 7), b"k" * 1_000_000, b"not json", [], 0)
    with caplog.at_level(logging.WARNING, logger="service.runtime.command_path"):
        t.path.undecodable(record, WireError("not a JSON object"))
    [line] = [r.getMessage() for r in caplog.records if "sent to the dlq" in r.getMessage()]
    assert len(line) < 1_000 and "(1000000 characters)" in line
    [outcome] = t.outcomes
    assert outcome.records[0].key == record.key  # the dead letter keeps the key whole


def test_a_decode_error_naming_its_session_and_id_waits_for_its_session_queue() -> None:
    t = Harness()
    error = WireError("prompt: required", session_id="s", command_id="c")
    work = t.path.undecodable(_record(TOPICS.commands, 4, 100), error)
    assert work is not None and work.session_id == "s" and work.error is error
    assert t.outcomes == []


def _keyed(topic: str, partition: int, body: dict[str, Any]) -> InputRecord:
    key = body["session_id"].encode()
    return InputRecord(Origin(topic, partition, 9), key, orjson.dumps(body), [], 100)


INVOKE_S = {"type": "invoke", "command_id": "c", "session_id": "s", "agent": "a", "prompt": "x"}
CANCEL_S = {"type": "cancel", "command_id": "x", "session_id": "s"}


@pytest.mark.parametrize(
    ("topic", "body", "parse"),
    [(TOPICS.commands, INVOKE_S, parse_command), (TOPICS.control, CANCEL_S, parse_cancel)],
    ids=["command", "cancel"],
)
def test_a_record_off_its_keys_partition_is_refused_with_its_ids(
    topic: str, body: dict[str, Any], parse: Callable[..., Any]
) -> None:
    home = keyed_partition(b"s", 4)
    assert parse(_keyed(topic, home, body), partitions=4).session_id == "s"
    assert parse(_keyed(topic, (home + 1) % 4, body)).session_id == "s"  # unchecked
    with pytest.raises(WireError) as refused:
        parse(_keyed(topic, (home + 1) % 4, body), partitions=4)
    error = refused.value
    assert (error.session_id, error.command_id, error.code) == (
        "s",
        body["command_id"],
        "invalid_command",
    )
    assert f"its key belongs on partition {home}" in error.reason


async def test_a_refusal_for_another_partitions_session_is_answered_without_its_state() -> None:
    t = Harness(owns=lambda session_id: session_id != "s")
    error = WireError("on the wrong partition", session_id="s", command_id="c")
    record = _record(TOPICS.commands, 4, 100)
    work = t.path.undecodable(record, error)
    assert work is not None and work.foreign and not t.outcomes
    await t.path.handle(work)
    [outcome] = t.outcomes
    assert outcome.state is None  # nothing of a session another partition owns is written
    assert outcome.finished == [record.origin] and outcome.replay_unsafe
    [result] = t.results()
    assert (result["session_id"], result["command_id"]) == ("s", "c")
    assert result["error"] == {"code": "invalid_command", "message": "on the wrong partition"}
    owned = WireError("prompt: required", session_id="mine", command_id="c2")
    assert t.path.undecodable(record, owned) is not None  # its own sessions wait in their queue


def test_a_record_over_the_limit_is_dead_lettered_unread() -> None:
    t = Harness()
    body = {"type": "invoke", "command_id": "c", "session_id": "s", "agent": "a", "prompt": "x"}
    record = _record(TOPICS.commands, 6, 100, orjson.dumps(body) + b" " * 100)
    with pytest.raises(WireError) as refused:
        parse_command(record, max_bytes=64)
    assert t.path.undecodable(record, refused.value) is None
    [outcome] = t.outcomes
    assert [r.topic for r in outcome.records] == [TOPICS.dlq] and outcome.results == 0


async def test_an_agent_not_hosted_is_refused_before_the_engine() -> None:
    t = Harness()
    await t.path.handle(_command("c", 1, agent="elsewhere"))
    assert t.engine.ran == []
    [answer] = t.results()
    assert answer["error"]["code"] == "unknown_agent"


@pytest.mark.parametrize(
    ("failure", "code"),
    [
        (InterruptPendingError("an interrupt is pending"), "interrupt_pending"),
        (StateTooLargeError(2_000_000, 1_000_000), "limit_exceeded"),
    ],
)
async def test_the_engine_refusing_or_outgrowing_the_limit_answers_with_its_code(
    failure: Exception, code: str
) -> None:
    t = Harness(FakeEngine(fails=failure))
    await t.path.handle(_command("c", 1))
    [answer] = t.results()
    assert answer["error"]["code"] == code
    assert t.counted("invoke", "error") == 1


class BoundaryThenTooLarge(FakeEngine):
    """Commits a boundary of the command (its state, as the session's next version), then
    outgrows the record limit."""

    def __init__(self) -> None:
        super().__init__(StateTooLargeError(2_000_000, 1_000_000))
        self.writer: Any = None

    async def run(
        self, work: CommandWork, command: ParsedCommand, agent: Any, stored: StoredSession
    ) -> None:
        state = stored.state.snapshot()
        state.messages.append({"role": "user", "content": [{"text": "hi"}]})
        self.writer.write(state, 1, step=Step(0, command.command_id, position="after_model"))
        await super().run(work, command, agent, stored)


async def test_a_command_that_fails_after_a_boundary_takes_that_boundarys_version_back() -> None:
    engine = BoundaryThenTooLarge()
    t = Harness(engine)
    engine.writer = writer_for(t.store)
    await t.path.handle(_command("c", 1))
    stored = t.store.get("s")
    assert stored is not None and stored.versions == [] and stored.state.messages == []
    [answer] = t.results()
    assert answer["error"]["code"] == "limit_exceeded"
    write = t.outcomes[-1].state
    assert write is not None and (history.version_key("s", 1), None) in write.records


class SeesItsSession(FakeEngine):
    """Reads its session at each of a few steps, the cache's budget running out in between."""

    def __init__(self, store: SessionStore) -> None:
        super().__init__()
        self.store = store
        self.seen: list[StoredSession | None] = []

    async def run(
        self, work: CommandWork, command: ParsedCommand, agent: Any, stored: StoredSession
    ) -> None:
        for _ in range(3):
            self.store.flush()
            self.seen.append(self.store.get("s"))
        await super().run(work, command, agent, stored)


async def test_a_session_larger_than_the_cache_is_decoded_once_per_command() -> None:
    store = SessionStore(cache_max_bytes=0)
    store.load(b"s", encode_state(SessionState(session_id="s", agent="a")), [])
    engine = SeesItsSession(store)
    t = Harness(engine, store=store)
    await t.path.handle(_command("c", 1))
    first = engine.seen[0]
    assert first is not None and all(seen is first for seen in engine.seen)
    store.flush()
    assert store.cached_bytes == 0, "evicted once its command is done"


async def test_a_command_left_at_its_boundary_by_a_stopping_owner_is_not_answered() -> None:
    t = Harness(FakeEngine(fails=AbandonedError()))
    await t.path.handle(_command("c", 1))
    assert t.outcomes == []
    assert t.counted("invoke", "abandoned") == 1


def test_an_output_the_broker_refused_is_replaced_by_a_dead_letter_and_an_error() -> None:
    t = Harness()
    inflight = Inflight("c", "after_model", 0)
    before = StoredSession(SessionState(session_id="s", agent="a", inflight=inflight), 3)
    work = _command("c", 8)
    assert isinstance(work.command, ParsedCommand)
    work.command.metadata = {"echo": "x" * (2 * FALLBACK_RESULT_MAX_BYTES)}
    t.store.put("s", StoredSession(SessionState(session_id="s", agent="a"), 9))
    replacement = t.answers.instead_of_refused(work, before, before)(RuntimeError("too large"))
    dead, result = replacement.records
    assert dead.topic == TOPICS.dlq and result.topic == TOPICS.results
    assert result.value is not None and len(result.value) <= FALLBACK_RESULT_MAX_BYTES
    assert orjson.loads(result.value)["error"]["code"] == "internal"
    assert replacement.finished == [work.record.origin] and replacement.state is not None
    assert replacement.state.event_seq == 3
    stored = t.store.get("s")
    assert stored is not None and stored.state.inflight is None
    assert stored.delivery.answered("c")


def test_a_refused_output_takes_back_what_the_commands_earlier_boundaries_committed() -> None:
    """The session goes back to its state before the command, not to the last boundary the
    command committed (which may hold what made the output too large: retrying could never
    succeed)."""
    t = Harness()
    writer = writer_for(t.store)
    agent_state = SessionState(session_id="s", agent="a")
    writer.write(agent_state, 1, step=Step(0, "c0", stop_reason="end_turn"))
    before_command = t.store.get("s")
    assert before_command is not None and before_command.last_version == 1
    grown = agent_state.snapshot()
    grown.messages.append({"role": "user", "content": [{"text": "hi"}]})
    grown.agent_state = {"big": "x" * 1000}
    writer.write(grown, 2, step=Step(0, "c", position="after_tools"))
    at_boundary = t.store.get("s")
    assert at_boundary is not None and at_boundary.last_version == 2
    work = _command("c", 8)
    replacement = t.answers.instead_of_refused(work, at_boundary, before_command)(
        RuntimeError("too large")
    )
    stored = t.store.get("s")
    assert stored is not None
    assert stored.state.agent_state == {} and stored.state.messages == []
    assert stored.last_version == 1
    assert replacement.state is not None
    assert (history.version_key("s", 2), None) in replacement.state.records


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ({"checkpointResume": {"checkpoint": {}}}, "checkpoint_stale"),
        ([{"interruptResponse": {"interruptId": "i", "response": 1}}], "no_pending_interrupt"),
    ],
)
async def test_a_resume_naming_no_agent_of_a_session_without_state_has_nothing_pending(
    payload: Any, code: str
) -> None:
    t = Harness()
    parsed = ParsedCommand(type="resume", command_id="c", session_id="s", agent=None, input=payload)
    await t.path.handle(CommandWork(_record(TOPICS.commands, 1, 100), "s", parsed))
    assert t.engine.ran == []
    [answer] = t.results()
    assert answer["error"]["code"] == code
    assert "'s' has no state" in answer["error"]["message"]


async def test_a_command_naming_no_agent_hosted_is_unknown_agent_even_without_state() -> None:
    t = Harness()
    parsed = ParsedCommand(type="resume", command_id="c", session_id="s", agent="gone", input=[])
    await t.path.handle(CommandWork(_record(TOPICS.commands, 1, 100), "s", parsed))
    [answer] = t.results()
    assert answer["error"] == {
        "code": "unknown_agent",
        "message": "agent 'gone' is not hosted here",
    }


async def test_a_resume_naming_another_agent_than_its_sessions_is_refused() -> None:
    t = Harness(store=_applied(), agents=("a", "b"))
    for offset, (command_id, agent) in enumerate(
        (("other", "b"), ("same", "a"), ("left-out", None), ("unhosted", "gone")), start=1
    ):
        parsed = ParsedCommand(
            type="resume", command_id=command_id, session_id="s", agent=agent, input=[]
        )
        await t.path.handle(CommandWork(_record(TOPICS.commands, offset, 100), "s", parsed))
    # Naming the session's own agent, or none, continues it; naming another is refused, hosted
    # here or not (docs/clients.md, "Resume from a checkpoint").
    assert t.engine.ran == ["same", "left-out"]
    answers = {answer["command_id"]: answer["error"] for answer in t.results()}
    assert answers == {
        command_id: {
            "code": "invalid_command",
            "message": f"agent: {agent!r} is not the agent of session 's' ('a'); leave it out "
            "or name that one",
        }
        for command_id, agent in (("other", "b"), ("unhosted", "gone"))
    }


METADATA = {"tenant": "acme", "request_id": "req-2b1c", "n": [1, {"deep": True}]}


@pytest.mark.parametrize(
    ("body", "key", "partition"),
    [
        ({**INVOKE_S, "checkpointing": "yes"}, b"s", None),  # a field refused
        ({**INVOKE_S, "stray": 1}, b"s", None),  # an unknown field
        (INVOKE_S, b"other", None),  # keyed by another id
        (INVOKE_S, b"s", "off"),  # off its key's partition
        ({"type": "fork", "command_id": "c", "session_id": "s", "version": 0}, b"s", None),
        ({"type": "history", "command_id": "c", "session_id": "s", "limit": 101}, b"s", None),
    ],
    ids=["field", "unknown-field", "key", "partition", "fork", "history"],
)
async def test_a_command_the_wire_refuses_still_gets_its_metadata_echoed(
    body: dict[str, Any], key: bytes, partition: str | None
) -> None:
    # The contract: a result's metadata is the command's, unchanged ({} only when it had none
    # or echoing it would outgrow the record limit). A client correlates by it, refusals too.
    t = Harness()
    home = keyed_partition(b"s", 4)
    record = InputRecord(
        Origin(TOPICS.commands, home if partition is None else (home + 1) % 4, 9),
        key,
        orjson.dumps({**body, "metadata": METADATA}),
        [],
        100,
    )
    answer = await _answer_of_invalid(t, record, partitions=4)
    assert answer["metadata"] == METADATA
    assert "metadata_truncated" not in answer


async def _answer_of_invalid(
    t: Harness, record: InputRecord, *, partitions: int | None = None
) -> Any:
    """The one result answering ``record``, which the command path refuses as invalid."""
    with pytest.raises(WireError) as refused:
        parse_command(record, partitions=partitions)
    work = t.path.undecodable(record, refused.value)
    assert work is not None
    await t.path.handle(work)
    [answer] = t.results()
    assert answer["error"]["code"] == "invalid_command"
    return answer


def _nested(levels: int) -> Any:
    node: Any = []
    for _ in range(levels - 1):
        node = [node]
    return node


@pytest.mark.parametrize(
    ("body", "echoed"),
    [
        ({**INVOKE_S, "metadata": [1, 2]}, {}),  # no object: nothing to echo
        # Too deep in its prompt, not in its metadata: echoed.
        ({**INVOKE_S, "prompt": _nested(80), "metadata": {"m": 1}}, {"m": 1}),
        # Its metadata nests past the limit: a result could not hold it.
        ({**INVOKE_S, "metadata": {"m": _nested(80)}}, {}),
    ],
    ids=["not-object", "deep-prompt", "deep-metadata"],
)
async def test_a_refusal_echoes_metadata_only_as_an_object_within_the_nesting_limit(
    body: dict[str, Any], echoed: dict[str, Any]
) -> None:
    t = Harness()
    value = json.dumps(body).encode()
    record = InputRecord(Origin(TOPICS.commands, 0, 9), b"s", value, [], 100)
    answer = await _answer_of_invalid(t, record)
    assert answer["metadata"] == echoed


@pytest.mark.parametrize(
    "value",
    [
        {**INVOKE_S, "oops": 1},  # refused by the model's validation (an error it replaced)
        {**INVOKE_S, "type": "nope"},
        {"type": "invoke"},  # no ids: dead-lettered
    ],
    ids=["invalid", "unknown-type", "unaddressable"],
)
async def test_a_refused_record_is_freed_without_the_cycle_collector(value: dict[str, Any]) -> None:
    # The reader catches the error and keeps the work in a local: if the work kept the
    # error's tracebacks, every refused record would wait for a full collection, which the
    # service's collector thresholds make rare.
    t = Harness()
    record = InputRecord(Origin(TOPICS.commands, 0, 9), b"s", orjson.dumps(value), [], 100)

    def read() -> tuple[weakref.ref[WireError], CommandWork | None]:
        try:
            parse_command(record)
        except WireError as exc:
            work = t.path.undecodable(record, exc)
            return weakref.ref(exc), work
        raise AssertionError("the record decoded")

    gc.disable()
    try:
        error, work = read()
        if work is not None:
            await t.path.handle(work)
        del work
        t.outcomes.clear()
        assert error() is None
    finally:
        gc.enable()
