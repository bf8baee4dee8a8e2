"""The cancel desk without a broker: what a cancel covers, signals and answers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import orjson
import pytest

from service.agent.definition import AgentDefinition
from service.agent.state import Inflight, PendingBatch, SessionState
from service.agent.types import Checkpoint, Interrupt
from service.observability.metrics import CANCEL_OUTCOMES, Metrics
from service.runtime.answers import Answers
from service.runtime.bad_input import classify_refusal
from service.runtime.cancels import CancelDesk
from service.runtime.command_path import CommandPath
from service.runtime.records import ParsedCommand
from service.runtime.session_queue import SessionQueues
from service.runtime.work import CommandWork, InputRecord, Origin, Outcome, OutRecord
from service.sessions import store as store_module
from service.sessions.delivery import Delivery
from service.sessions.store import SessionStore, StoredSession
from service.settings import TopicSettings
from service.wire.codec import decode_command
from service.wire.commands import CancelCommand
from service.wire.errors import WireError
from tests.support.agents import CycleModel
from tests.support.session_records import decodes_in, restored, writer_for

TOPICS = TopicSettings()


def _record(topic: str, offset: int, ts: int, value: bytes = b"{}") -> InputRecord:
    return InputRecord(Origin(topic, 0, offset), b"s", value, [], ts)


def _command(command_id: str, offset: int, ts: int, session_id: str = "s") -> CommandWork:
    parsed = ParsedCommand(
        type="invoke", command_id=command_id, session_id=session_id, agent="a", input="hi"
    )
    return CommandWork(_record(TOPICS.commands, offset, ts), session_id, parsed)


def _cancel(offset: int, ts: int, **fields: Any) -> tuple[InputRecord, CancelCommand]:
    command = CancelCommand(command_id=f"x{offset}", session_id="s", **fields)
    return _record(TOPICS.control, offset, ts), command


Step = Callable[[CommandWork], Awaitable[None]]


class _Engine:
    """Stands in for the invoker: every command that reaches the engine goes to ``step``."""

    def __init__(self, step: Step) -> None:
        self.step = step

    async def run(self, work: CommandWork, *_: object) -> None:
        await self.step(work)


class _Desk:
    def __init__(self, store: SessionStore | None = None) -> None:
        self.store = store if store is not None else SessionStore()
        self.outcomes: list[Outcome] = []
        self.ran: list[str] = []
        self.metrics = Metrics()
        self.writer = writer_for(self.store)
        self.settled: list[Origin] = []
        """What the desk waited to be finished and committed before answering (in order)."""
        self.desk = CancelDesk(
            writer=self.writer,
            submit=self.outcomes.append,
            topics=TOPICS,
            metrics=self.metrics,
            settled=self._settled,
        )

    async def _settled(self, origin: Origin) -> None:
        self.settled.append(origin)

    def path(self, step: Step) -> CommandPath:
        """The command path over this desk, its engine replaced by ``step``."""
        return CommandPath(
            store=self.store,
            cancels=self.desk,
            invoker=_Engine(step),
            answers=Answers(writer=self.writer, submit=self.outcomes.append, topics=TOPICS),
            submit=self.outcomes.append,
            agents={"a": AgentDefinition(name="a", model=CycleModel(1))},
            topics=TOPICS,
            metrics=self.metrics,
        )

    async def run(self, work: CommandWork) -> None:
        """Handle one record as its session queue would, then give the event loop a turn."""

        async def handler(item: CommandWork) -> None:
            self.ran.append(item.command.command_id)

        await self.path(handler).handle(work)
        await asyncio.sleep(0)

    def cancels(self) -> dict[str, float]:
        """The cancels metric, by outcome, leaving out the outcomes never counted."""
        found = {}
        for outcome in CANCEL_OUTCOMES:
            value = self.metrics.registry.get_sample_value(
                "cairn_cancels_total", {"outcome": outcome}
            )
            if value:
                found[outcome] = value
        return found

    def answered(self) -> list[tuple[str, str]]:
        found = []
        for outcome in self.outcomes:
            for record in outcome.records:
                assert record.value is not None
                body = orjson.loads(record.value)
                found.append((body["command_id"], body["stop_reason"]))
        return found


async def test_a_cancel_covers_commands_published_up_to_its_timestamp() -> None:
    t = _Desk()
    t.desk.read(*_cancel(0, ts=100))
    await t.run(_command("early", 1, ts=99))
    await t.run(_command("same", 2, ts=100))
    await t.run(_command("later", 3, ts=101))
    assert t.ran == ["later"]
    assert t.answered() == [("early", "cancelled"), ("same", "cancelled")]
    stored = t.store.get("s")
    assert stored is not None and {"early", "same"} <= set(stored.delivery.applied)


async def test_a_running_invocation_is_signalled_only_when_covered() -> None:
    t = _Desk()
    seen: list[bool] = []
    gate = asyncio.Event()

    async def handler(item: CommandWork) -> None:
        await gate.wait()
        assert item.cancel is not None
        seen.append(item.cancel.immediate)

    running = asyncio.create_task(t.path(handler).handle(_command("c", 1, ts=200)))
    await asyncio.sleep(0)
    t.desk.read(*_cancel(0, ts=150))  # published before the running command: not covered
    gate.set()
    await running
    gate.clear()
    running = asyncio.create_task(t.path(handler).handle(_command("d", 2, ts=200)))
    await asyncio.sleep(0)
    t.desk.read(*_cancel(1, ts=250, message="stop"))
    gate.set()
    await running
    assert seen == [False, True]


async def test_a_target_not_seen_yet_is_answered_once_its_session_reads_it() -> None:
    t = _Desk()
    work = t.desk.read(*_cancel(0, ts=100, target_command_id="t"))
    await t.run(work)
    assert t.answered() == [("x0", "cancelled")]
    # Arriving later (even published later, at the next owner) it is answered unrun, once.
    after = _Desk(restored(t.outcomes))
    await after.run(_command("t", 1, ts=500))
    await after.run(_command("t", 1, ts=500))
    assert after.ran == []
    assert after.answered() == [("t", "cancelled")]
    stored = after.store.get("s")
    assert stored is not None and stored.delivery.answered("t")
    assert stored.delivery.targets == ()


async def test_a_target_of_another_session_gets_no_result_from_the_cancel() -> None:
    t = _Desk()
    await t.run(t.desk.read(*_cancel(0, ts=100, target_command_id="t")))
    await t.run(_command("t", 1, ts=90, session_id="other"))
    # Its own session runs and answers it: one result for the id, and not "cancelled".
    assert t.ran == ["t"]
    assert t.answered() == [("x0", "cancelled")]


async def test_a_repeated_cancel_is_answered_once() -> None:
    t = _Desk()
    for _ in range(2):
        await t.run(t.desk.read(*_cancel(0, ts=100)))
    assert t.answered() == [("x0", "cancelled")]
    assert len(t.outcomes) == 2  # the repeat still finishes its offset


def _refused(value: dict[str, Any]) -> CommandWork:
    raw = orjson.dumps(value)
    try:
        decode_command(raw)
    except WireError as exc:
        return CommandWork(_record(TOPICS.commands, 0, 0, raw), "s", None, exc)
    raise AssertionError("the wire accepted it")


def test_refused_checkpoint_resume_follows_the_engine_order() -> None:
    agents = {
        "on": AgentDefinition(name="on", model=CycleModel(1), checkpointing=True),
        "off": AgentDefinition(name="off", model=CycleModel(1)),
    }
    wrapped = {
        "type": "resume",
        "command_id": "c",
        "session_id": "s",
        "resume": [{"checkpointResume": {"checkpoint": {}}}],
    }
    work = _refused(wrapped)
    paused = SessionState(session_id="s", agent="on", checkpoint=Checkpoint("after_model", 0))
    asked = paused.copy()
    asked.pending = PendingBatch(
        assistant_message={"role": "assistant", "content": []},
        interrupts=[Interrupt("i", "approval")],
    )
    off = SessionState(session_id="s", agent="off")

    def code(state: SessionState) -> str:
        error = classify_refusal(work, StoredSession(state), agents)
        assert isinstance(error, WireError) and error.command_id == "c"
        return error.code

    assert code(asked) == "interrupt_pending"
    assert code(off) == "checkpointing_disabled"
    assert code(paused) == "checkpoint_incompatible"


def _idle() -> SessionStore:
    """A store holding one idle session ``s`` (a cancel records its coverage in that state)."""
    store = SessionStore()
    store.put("s", StoredSession(SessionState(session_id="s", agent="a")))
    return store


async def test_a_cancel_read_again_after_a_restart_still_covers_older_commands() -> None:
    before = _Desk(_idle())
    await before.run(before.desk.read(*_cancel(0, ts=100)))
    after = _Desk(before.store)  # the next owner, with the sessions it restored
    await after.run(after.desk.read(*_cancel(0, ts=100)))
    await after.run(_command("old", 1, ts=90))
    await after.run(_command("new", 2, ts=110))
    assert after.ran == ["new"]
    assert after.answered() == [("old", "cancelled")]


async def test_an_answered_cancel_covers_older_commands_first_read_by_the_next_owner() -> None:
    before = _Desk(_idle())
    await before.run(before.desk.read(*_cancel(0, ts=100)))
    # What the next owner restores: the state committed with it.
    after = _Desk(
        restored(before.outcomes)
    )  # never reads the cancel: its offset was committed with its answer
    await after.run(_command("old", 1, ts=100))
    await after.run(_command("new", 2, ts=101))
    assert after.ran == ["new"]
    assert after.answered() == [("old", "cancelled")]


async def test_a_cancel_leaves_the_inflight_marker_of_a_command_published_after_it() -> None:
    t = _Desk(_left_mid_turn("later", published_ms=300))
    await t.run(t.desk.read(*_cancel(0, ts=200)))
    stored = t.store.get("s")
    assert stored is not None and stored.state.inflight == Inflight("later", "after_model", 0)
    assert stored.delivery.cancelled_before_ms == 200
    await t.run(_command("later", 1, ts=300))
    assert t.ran == ["later"]  # continues from its boundary, uncancelled
    # Published before the cancel, it is covered: the cancel resolves the marker (its record,
    # read again by this owner, was read first).
    t = _Desk(_left_mid_turn("later", published_ms=150))
    cancel = t.desk.read(*_cancel(1, ts=200))
    t.desk.arrived(_command("later", 2, ts=150))
    await t.run(cancel)
    stored = t.store.get("s")
    assert stored is not None and stored.state.inflight is None


async def test_a_cancel_that_skipped_queued_commands_is_counted_queued() -> None:
    t = _Desk()
    work = t.desk.read(*_cancel(0, ts=100))
    # Both were in the session's queue, ahead of the cancel, when it was read.
    await t.run(_command("q1", 1, ts=90))
    await t.run(_command("q2", 2, ts=95))
    await t.run(work)
    assert t.answered() == [("q1", "cancelled"), ("q2", "cancelled"), ("x0", "cancelled")]
    assert t.cancels() == {"queued": 1}
    assert (
        t.metrics.registry.get_sample_value(
            "cairn_commands_total", {"type": "invoke", "outcome": "skipped"}
        )
        == 2
    )
    # The next cancel met nothing; a command read only after it was answered is not its doing.
    await t.run(t.desk.read(*_cancel(3, ts=200)))
    await t.run(_command("late", 4, ts=150))
    assert t.cancels() == {"queued": 1, "idle": 1}


async def test_a_cancel_that_met_a_pause_is_counted_paused_even_with_queued_commands() -> None:
    store = SessionStore()
    paused = SessionState(session_id="s", agent="a", checkpoint=Checkpoint("after_model", 0))
    store.put("s", StoredSession(paused))
    t = _Desk(store)
    work = t.desk.read(*_cancel(0, ts=100))
    await t.run(_command("q", 1, ts=90))
    await t.run(work)
    assert t.cancels() == {"paused": 1}


async def test_commands_skipped_by_target_do_not_make_another_cancel_queued() -> None:
    t = _Desk()
    targeted = t.desk.read(*_cancel(0, ts=100, target_command_id="t"))
    untargeted = t.desk.read(*_cancel(1, ts=50))
    await t.run(_command("t", 2, ts=90))  # covered by its target only
    await t.run(targeted)
    await t.run(untargeted)
    assert ("t", "cancelled") in t.answered()
    assert t.cancels() == {"targeted": 1, "idle": 1}


async def test_a_repeated_cancel_takes_no_count_from_the_first() -> None:
    t = _Desk()
    first = t.desk.read(*_cancel(0, ts=100))
    await t.run(_command("q", 1, ts=90))
    await t.run(first)
    await t.run(t.desk.read(*_cancel(0, ts=100)))
    assert t.cancels() == {"queued": 1, "duplicate": 1}


def _results(t: _Desk) -> dict[str, dict[str, Any]]:
    """Every result written so far, by command id."""
    found = {}
    for outcome in t.outcomes:
        for record in outcome.records:
            assert record.value is not None
            body = orjson.loads(record.value)
            found[body["command_id"]] = body
    return found


async def _route_as_one_fetch(t: _Desk, *works: CommandWork) -> None:
    """Put records into real session queues in one go, as the consumer loop routes a fetch."""

    async def handler(item: CommandWork) -> None:
        t.ran.append(item.command.command_id)
        await asyncio.sleep(0)  # a real invocation yields to the event loop

    async with asyncio.TaskGroup() as tasks:
        queues = SessionQueues(tasks, t.path(handler).handle)
        for work in works:
            queues.put(work)
            t.desk.arrived(work)
        await queues.wait_idle()
    await asyncio.sleep(0)


async def test_a_cancel_read_ahead_of_commands_it_covers_is_answered_after_them() -> None:
    t = _Desk()
    # One fetch, the control partition's records routed before the commands partition's.
    await _route_as_one_fetch(
        t,
        t.desk.read(*_cancel(0, ts=100)),
        _command("early", 1, ts=90),
        _command("same", 2, ts=100),
        _command("later", 3, ts=110),
    )
    assert t.answered() == [("early", "cancelled"), ("same", "cancelled"), ("x0", "cancelled")]
    assert t.ran == ["later"]
    # The covered commands' results and the cancel's go out in one outcome, the cancel's last.
    (together,) = [o for o in t.outcomes if o.records]
    assert len(together.records) == together.results == 3
    assert _results(t)["x0"]["cancel"] == {
        "stopped": None,
        "skipped": ["early", "same"],
        "resolved": None,
    }
    stored = t.store.get("s")
    assert stored is not None and {"early", "same", "x0"} <= set(stored.delivery.applied)
    assert stored.delivery.cancelled_before_ms == 100


async def test_a_cancel_read_ahead_of_an_invocation_it_stopped_at_a_takeover() -> None:
    # The previous owner left "c" at a boundary; the next one reads the cancel, then "c".
    t = _Desk(_left_mid_turn("c", published_ms=90))
    await _route_as_one_fetch(t, t.desk.read(*_cancel(0, ts=100)), _command("c", 1, ts=90))
    assert t.answered() == [("c", "cancelled"), ("x0", "cancelled")]
    assert t.ran == []
    assert _results(t)["x0"]["cancel"] == {"stopped": "c", "skipped": [], "resolved": None}


async def _behind_running(
    t: _Desk, queued: Callable[[SessionQueues], list[CommandWork]], *first: CommandWork
) -> list[str]:
    """Run "c" (published at 90), and queue ``first`` behind it, until what ``queued`` makes
    (given the queues), once "c" runs, is read and queued behind them; then let "c" end
    (answered by its runner) and the rest take their turns. Returns the ids of the
    invocations a cancel signalled."""
    gate = asyncio.Event()
    signalled: list[str] = []

    async def handler(item: CommandWork) -> None:
        await gate.wait()
        if item.cancel is not None and item.cancel.immediate:
            signalled.append(item.command_id or "")
        t.outcomes.append(Outcome(records=[_stub_result(item.command.command_id)]))

    async with asyncio.TaskGroup() as tasks:
        queues = SessionQueues(tasks, t.path(handler).handle)
        queues.put(_command("c", 1, ts=90))
        for work in first:
            queues.put(work)
        await asyncio.sleep(0)
        for work in queued(queues):
            queues.put(work)
        gate.set()
        await queues.wait_idle()
    await asyncio.sleep(0)
    return signalled


async def test_a_running_invocation_is_answered_before_the_cancel_that_stopped_it() -> None:
    t = _Desk()
    await _behind_running(t, lambda _: [t.desk.read(*_cancel(0, ts=100)), _command("q", 2, ts=95)])
    assert t.answered() == [("c", "cancelled"), ("q", "cancelled"), ("x0", "cancelled")]
    assert _results(t)["x0"]["cancel"] == {"stopped": "c", "skipped": ["q"], "resolved": None}


async def test_what_an_earlier_cancel_stopped_and_skipped_is_not_named_by_a_later_one() -> None:
    t = _Desk()
    await _behind_running(
        t,
        lambda _: [
            _command("q", 2, ts=95),
            t.desk.read(*_cancel(0, ts=100)),
            t.desk.read(*_cancel(1, ts=110)),
        ],
    )
    assert t.answered() == [
        ("c", "cancelled"),
        ("q", "cancelled"),
        ("x0", "cancelled"),
        ("x1", "cancelled"),
    ]
    results = _results(t)
    assert results["x0"]["cancel"] == {"stopped": "c", "skipped": ["q"], "resolved": None}
    assert results["x1"]["cancel"] == {"stopped": None, "skipped": [], "resolved": None}


async def test_a_cancel_id_read_again_before_its_answer_acts_once_as_first_read() -> None:
    t = _Desk()
    first = _cancel(0, ts=100, target_command_id="q")
    again = (
        _record(TOPICS.control, 1, 105),
        first[1].model_copy(update={"target_command_id": None}),
    )
    signalled = await _behind_running(
        t, lambda _: [_command("q", 2, ts=95), t.desk.read(*first), t.desk.read(*again)]
    )
    # "c" was not signalled: the repeat, untargeted, is not a second cancel.
    assert signalled == []
    assert t.answered() == [("c", "cancelled"), ("q", "cancelled"), ("x0", "cancelled")]
    assert _results(t)["x0"]["cancel"] == {"stopped": None, "skipped": ["q"], "resolved": None}


@pytest.mark.parametrize("reused", ["c", "q"])
async def test_a_cancel_reusing_the_id_of_a_command_handled_or_queued_is_a_repeat(
    reused: str,
) -> None:
    # As of a command the session answered (clients.md): a repeat of that command, which
    # stops and skips nothing and gets no result of its own, not a cancel acting unanswered.
    t = _Desk()
    cancel: list[CommandWork] = []

    def read(queues: SessionQueues) -> list[CommandWork]:
        record, command = _cancel(5, ts=100)
        command = command.model_copy(update={"command_id": reused})
        taken = queues.holds("s", reused)
        cancel.append(t.desk.read(record, command, taken=taken))
        return cancel

    signalled = await _behind_running(t, read, _command("q", 2, ts=95))
    assert signalled == []
    assert t.answered() == [("c", "cancelled"), ("q", "cancelled")]  # both from their runner
    assert t.cancels() == {"duplicate": 1.0}
    assert [cancel[0].record.origin] in [outcome.finished for outcome in t.outcomes]
    assert t.desk.tracking == 0


async def test_a_delete_reusing_the_id_of_a_queued_command_is_a_repeat() -> None:
    t = _Desk()
    erase = ParsedCommand(type="delete", command_id="q", session_id="s", agent=None, input=None)
    delete = CommandWork(_record(TOPICS.commands, 9, 110), "s", erase)

    def read(queues: SessionQueues) -> list[CommandWork]:
        t.desk.deleting(delete, erase, taken=queues.holds("s", "q"))
        return [delete]

    signalled = await _behind_running(t, read, _command("q", 2, ts=95))
    assert signalled == []
    assert t.answered() == [("c", "cancelled"), ("q", "cancelled")]  # both from their runner
    assert t.outcomes[-1].finished == [delete.record.origin]
    assert t.desk.tracking == 0


async def test_a_command_left_mid_turn_skipped_before_its_cancel_is_named_stopped() -> None:
    # The previous owner left "c" at a boundary; the next one reads "c" and then the cancel,
    # and "c" takes its turn while the cancel waits for its own.
    t = _Desk(_left_mid_turn("c", published_ms=90))
    command = _command("c", 1, ts=90)
    cancel = t.desk.read(*_cancel(0, ts=100))
    await _route_as_one_fetch(t, command, _command("q", 2, ts=95), cancel)
    assert t.answered() == [("c", "cancelled"), ("q", "cancelled"), ("x0", "cancelled")]
    assert t.ran == []
    assert _results(t)["x0"]["cancel"] == {"stopped": "c", "skipped": ["q"], "resolved": None}


def _left_mid_turn(command_id: str, *, published_ms: int) -> SessionStore:
    """A store whose session "s" an earlier owner left at a boundary of ``command_id``."""
    inflight = Inflight(command_id, "after_model", 0)
    state = SessionState(session_id="s", agent="a", inflight=inflight)
    store = SessionStore()
    store.put("s", StoredSession(state, delivery=Delivery(inflight_published_ms=published_ms)))
    return store


def _stub_result(command_id: str) -> OutRecord:
    body = {"command_id": command_id, "stop_reason": "cancelled"}
    return OutRecord(TOPICS.results, b"s", orjson.dumps(body))


async def test_a_cancel_of_an_unknown_session_says_so_and_leaves_no_state() -> None:
    t = _Desk()
    work = t.desk.read(*_cancel(0, ts=100))
    await t.run(work)
    assert t.answered() == [("x0", "cancelled")]
    (outcome,) = t.outcomes
    assert outcome.state is None and t.store.get("s") is None
    body = _results(t)["x0"]
    assert body["message"] is None
    assert body["cancel"] == {"stopped": None, "skipped": [], "resolved": None}
    # Nothing records it but its offset: that must be committed with it.
    assert outcome.replay_unsafe and outcome.finished == [work.record.origin]
    assert t.cancels() == {"idle": 1}
    # A repeat is recognised by this owner and answered never again (still no state).
    await t.run(t.desk.read(*_cancel(0, ts=100)))
    assert t.answered() == [("x0", "cancelled")]
    assert len(t.outcomes) == 2 and t.outcomes[1].replay_unsafe
    assert t.store.get("s") is None


async def test_a_stateless_answer_waits_for_every_earlier_control_record() -> None:
    t = _Desk(_idle())
    gate = asyncio.Event()

    async def handler(item: CommandWork) -> None:
        await gate.wait()

    async with asyncio.TaskGroup() as tasks:
        queues = SessionQueues(tasks, t.path(handler).handle)
        queues.put(_command("c", 0, ts=200))  # published after the cancel: it runs on
        await asyncio.sleep(0)
        queues.put(t.desk.read(*_cancel(1, ts=100)))  # waits behind "c"
        unknown = CancelCommand(command_id="u", session_id="u")
        queues.put(
            t.desk.read(InputRecord(Origin(TOPICS.control, 0, 2), b"u", b"{}", [], 100), unknown)
        )
        for _ in range(3):
            await asyncio.sleep(0)
        # Answered, but an earlier control record is not: committing the offsets with it
        # now would not pass its record, so a crash could have it read and answered again.
        assert t.answered() == []
        gate.set()
        await queues.wait_idle()
    await asyncio.sleep(0)
    assert t.answered() == [("x1", "cancelled"), ("u", "cancelled")]
    assert t.outcomes[-1].replay_unsafe and t.outcomes[-1].state is None


async def test_a_cancel_of_an_unknown_session_is_recorded_once_it_covers_a_command() -> None:
    t = _Desk()
    await _route_as_one_fetch(t, t.desk.read(*_cancel(0, ts=100)), _command("early", 1, ts=90))
    assert t.answered() == [("early", "cancelled"), ("x0", "cancelled")]
    (outcome,) = t.outcomes
    assert outcome.state is not None and not outcome.replay_unsafe
    stored = t.store.get("s")
    assert stored is not None and {"early", "x0"} <= set(stored.delivery.applied)
    assert stored.delivery.cancelled_before_ms == 100
    assert _results(t)["x0"]["cancel"]["skipped"] == ["early"]


async def test_a_cancel_says_which_pause_it_resolved() -> None:
    paused = SessionState(session_id="s", agent="a", checkpoint=Checkpoint("after_model", 0))
    asked = SessionState(
        session_id="s",
        agent="a",
        pending=PendingBatch(
            assistant_message={"role": "assistant", "content": []},
            interrupts=[Interrupt("i", "approval")],
        ),
    )
    for state, kind in ((paused, "checkpoint"), (asked, "interrupt")):
        store = SessionStore()
        store.put("s", StoredSession(state))
        t = _Desk(store)
        await t.run(t.desk.read(*_cancel(0, ts=100)))
        assert _results(t)["x0"]["cancel"] == {"stopped": None, "skipped": [], "resolved": kind}


async def test_a_targeted_cancel_names_its_target() -> None:
    t = _Desk()
    await t.run(t.desk.read(*_cancel(0, ts=100, target_command_id="t")))
    assert _results(t)["x0"]["cancel"] == {"stopped": None, "skipped": [], "resolved": None}
    # The target not read yet is answered only if the session reads it: it is recorded.
    stored = t.store.get("s")
    assert stored is not None and "x0" in stored.delivery.applied
    assert stored.delivery.targets == ("t",) and not stored.delivery.answered("t")
    t = _Desk()
    await _route_as_one_fetch(
        t, t.desk.read(*_cancel(0, ts=100, target_command_id="t")), _command("t", 1, ts=200)
    )
    assert t.answered() == [("t", "cancelled"), ("x0", "cancelled")]
    assert _results(t)["x0"]["cancel"] == {"stopped": None, "skipped": ["t"], "resolved": None}
    t = _Desk(_idle())
    stored = t.store.get("s")
    assert stored is not None
    t.store.put("s", replace(stored, delivery=stored.delivery.applying("done")))
    await t.run(t.desk.read(*_cancel(0, ts=100, target_command_id="done")))
    assert _results(t)["x0"]["cancel"] == {"stopped": None, "skipped": [], "resolved": None}


async def test_a_delete_waits_for_its_offset_and_the_cancels_read_before_it() -> None:
    """A cancel answered before the delete is remembered by the session's state only, which the
    delete removes: read again after a takeover, it would cancel the fresh session's work."""
    t = _Desk(_applied_store("earlier"))
    await t.run(t.desk.read(*_cancel(4, ts=100)))
    await _delete(t)
    assert t.settled == [Origin(TOPICS.commands, 0, 9), Origin(TOPICS.control, 0, 5)]
    assert [command_id for command_id, _ in t.answered()] == ["x4", "d"]


async def test_a_cancel_answered_before_a_delete_and_read_again_after_it_is_not_answered() -> None:
    """After a rebalance the control partition can be read behind the commands partition: a
    cancel the old owner answered before the delete, whose offset it had not committed, is then
    read again after the delete took the session's state (and its command ids) away."""
    t = _Desk(_applied_store("earlier", "x4"))
    await _delete(t)
    await t.run(_command("fresh", 10, ts=120))  # the session starts afresh
    assert t.ran == ["fresh"]
    t.store.put("s", StoredSession(SessionState(session_id="s", agent="a")))
    again = t.desk.read(*_cancel(4, ts=100))
    await t.run(again)
    assert [command_id for command_id, _ in t.answered()] == ["d"]
    # Its offset is finished, after every earlier control record: no state recognises it.
    assert t.outcomes[-1].finished == [again.record.origin] and t.outcomes[-1].replay_unsafe


async def _delete(t: _Desk, command_id: str = "d") -> CommandWork:
    """A delete of session "s" (offset 9, published at 110), read and handled."""
    erase = ParsedCommand(
        type="delete", command_id=command_id, session_id="s", agent=None, input=None
    )
    work = CommandWork(_record(TOPICS.commands, 9, 110), "s", erase)
    t.desk.deleting(work, erase)
    await t.run(work)
    return work


def _applied_store(*command_ids: str) -> SessionStore:
    store = SessionStore()
    state = SessionState(session_id="s", agent="a")
    store.put("s", StoredSession(state, delivery=Delivery(applied=command_ids)))
    return store


async def test_a_delete_reusing_an_id_the_session_answered_is_a_repeat() -> None:
    t = _Desk(_applied_store("x"))
    work = await _delete(t, "x")
    assert t.answered() == [] and t.store.get("s") is not None
    assert t.outcomes[-1].finished == [work.record.origin]


async def test_a_targeted_cancel_read_after_the_delete_leaves_its_answered_target_alone() -> None:
    t = _Desk(_applied_store("c1"))
    await _delete(t)
    await t.run(t.desk.read(*_cancel(4, ts=120, target_command_id="c1")))
    # c1 was answered before the delete: one result for it, ever; the cancel says it skipped
    # nothing and leaves no state for the deleted session.
    assert [command_id for command_id, _ in t.answered()] == ["d", "x4"]
    assert _results(t)["x4"]["cancel"] == {"stopped": None, "skipped": [], "resolved": None}
    assert t.store.get("s") is None


async def test_a_future_dated_cancel_covers_nothing_published_after_it_was_read() -> None:
    now = int(time.time() * 1000)
    t = _Desk(_idle())
    await t.run(t.desk.read(*_cancel(0, ts=now + 50 * 60_000)))  # the broker takes up to 1 h
    await t.run(_command("before", 1, ts=now - 1))
    await t.run(_command("after", 2, ts=now + 1_000))
    assert t.ran == ["after"]
    assert t.answered()[-1] == ("before", "cancelled")
    stored = t.store.get("s")
    assert stored is not None and stored.delivery.cancelled_before_ms is not None
    assert now <= stored.delivery.cancelled_before_ms < now + 1_000
    # Read again later (its offset not committed), it covers what it covered when first read.
    again = _Desk(restored(t.outcomes))
    await again.run(again.desk.read(*_cancel(0, ts=now + 50 * 60_000)))
    await again.run(_command("later", 3, ts=now + 2_000))
    assert again.ran == ["later"]


async def test_a_cancel_reusing_an_answered_command_id_is_a_repeat_with_no_result() -> None:
    # As clients.md says of a delete: an id the session answered is a repeat of that command.
    t = _Desk(_applied_store("x0"))
    await _route_as_one_fetch(t, t.desk.read(*_cancel(0, ts=100)), _command("early", 1, ts=90))
    assert t.ran == ["early"]
    assert t.answered() == []
    assert [outcome.finished for outcome in t.outcomes] == [[Origin(TOPICS.control, 0, 0)]]


async def test_a_future_dated_delete_leaves_a_cancel_read_after_it_its_cover(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Read with a record timestamp an hour ahead, the delete covered until then; the end of its
    turn took that cover away, and with it the cover of a cancel read after it."""
    clock = [1_000_000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    now = int(clock[0] * 1000)
    t = _Desk(_applied_store("earlier"))
    erase = ParsedCommand(type="delete", command_id="d", session_id="s", agent=None, input=None)
    delete = CommandWork(_record(TOPICS.commands, 9, now + 50 * 60_000), "s", erase)
    t.desk.deleting(delete, erase)
    clock[0] += 1.0
    cancel = t.desk.read(*_cancel(4, ts=now + 1_000))
    await t.run(delete)
    await t.run(_command("between", 10, ts=now + 500))  # published before the cancel
    await t.run(cancel)
    await t.run(_command("after", 11, ts=now + 2_000))
    assert t.ran == ["after"]
    assert ("between", "cancelled") in t.answered()


async def test_a_cancel_read_again_decodes_no_session_until_its_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As it is read, a cancel (or a delete) asks only whether its session answered its id: a
    session not in memory is not decoded on the event loop for that; its turn decodes it once,
    off the loop when large."""
    said = [{"role": "user", "content": [{"text": f"{i} " * 40}]} for i in range(50)]
    store = SessionStore()
    store.put("s", StoredSession(SessionState(session_id="s", agent="a", messages=said)))
    before = _Desk(store)
    await before.run(before.desk.read(*_cancel(0, ts=100)))
    monkeypatch.setattr(store_module, "DECODE_OFF_LOOP_BYTES", 1)
    off_loop, go = decodes_in(monkeypatch)
    go.set()
    after = _Desk(restored(before.outcomes))  # the next owner: the session is in its table
    work = after.desk.read(*_cancel(0, ts=100))  # read again after a restart
    delete = ParsedCommand(type="delete", command_id="d", session_id="s", agent=None, input=None)
    after.desk.deleting(_command("d", 1, ts=90), delete)
    assert off_loop == []
    await after.run(work)
    assert off_loop == [True]
    assert after.answered() == []  # answered before: not again


async def test_a_desk_keeps_nothing_of_a_session_once_its_cancels_and_deletes_are_answered() -> (
    None
):
    # A desk lives as long as its partition's owner: what it keeps for a cancel or a delete
    # until its turn must go with the answer, or it grows with every session ever cancelled.
    t = _Desk(_applied_store("earlier"))
    offset = 0
    for session_id in ("s", "other", "third"):
        for target in (None, "later"):
            offset += 1
            record = InputRecord(
                Origin(TOPICS.control, 0, offset), session_id.encode(), b"{}", [], 100
            )
            cancel = CancelCommand(
                command_id=f"x{offset}", session_id=session_id, target_command_id=target
            )
            work = t.desk.read(record, cancel)
            assert t.desk.tracking > 0
            await t.run(work)
    await _delete(t)
    assert len(t.answered()) == 7
    assert t.desk.tracking == 0


async def test_a_delete_of_a_state_that_only_remembers_ids_says_no_session_existed() -> None:
    # A refused command leaves a state holding only its id: the delete takes it away, counts
    # its records, and says no session existed, as a delete of a session never invoked would.
    t = _Desk(_applied_store("refused"))
    await _delete(t)
    [outcome] = t.outcomes
    [record] = outcome.records
    assert record.value is not None
    report = orjson.loads(record.value)["deleted"]
    assert report["existed"] is False and report["records"] > 0
    assert t.store.get("s") is None
