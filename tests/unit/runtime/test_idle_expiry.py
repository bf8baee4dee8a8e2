"""Idle expiry: an idle session is deleted with a ``session_expired`` event, and a stray copy of
a session another partition owns is deleted without one."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
import pytest

from service.agent.state import SessionState
from service.observability.metrics import Metrics
from service.runtime import idle_expiry
from service.runtime.idle_expiry import Outages, Reachability, expire_idle
from service.runtime.session_queue import SessionQueues
from service.runtime.work import CommandWork, InputRecord, Origin, Outcome
from service.sessions import store as store_module
from service.sessions.delivery import Delivery
from service.sessions.store import SessionStore
from tests.support.session_records import decodes_in, restored, writer_for

EVENTS = "t.events"


COMMANDS = "t.commands"
CONTROL = "t.control"


def _now_ms() -> int:
    """A broker that answers every fetch: idle time runs with the wall clock."""
    return int(time.time() * 1000)


class _Idle:
    def __init__(self, reads: dict[str, dict[str, int]] | None = None) -> None:
        self._reads = reads or {}

    def busy(self, session_id: str) -> bool:
        return False

    def reads(self, session_id: str) -> dict[str, int]:
        return dict(self._reads.get(session_id, {}))

    def forget(self, session_id: str) -> None:
        self._reads.pop(session_id, None)

    def forget_passed(self, passed: Callable[[str, int], bool]) -> None:
        pass


async def _all_committed() -> None:
    """What the committer's flush does when every submitted outcome is committed at once."""


def _expiry(
    store: SessionStore,
    ttl_s: float,
    submit: Callable[[Outcome], None],
    stopping: Callable[[], bool],
    fetched: Callable[[], int | None],
    outages: Outages | None = None,
) -> Coroutine[Any, Any, None]:
    """Idle expiry over ``store`` of a partition with nothing queued, every offset passed."""
    return expire_idle(
        ttl_s,
        writer_for(store),
        submit,
        _all_committed,
        _Idle(),  # type: ignore[arg-type]
        stopping,
        EVENTS,
        Metrics(),
        passed=lambda topic, offset: True,
        commands_topic=COMMANDS,
        forgetting=lambda session_id, ids: None,
        fetched=fetched,
        outages=outages,
    )


async def test_a_stray_copy_and_a_state_of_ids_only_are_deleted_without_an_event() -> None:
    first = writer_for()
    said = [{"role": "user", "content": [{"text": "hi"}]}]
    written = [
        Outcome(
            state=first.write(
                SessionState(session_id=sid, messages=list(said) if sid != "ids" else []),
                3,
                Delivery(applied=("c1",)),
            )
        )
        for sid in ("mine", "stray", "ids")
    ]
    store = restored(written)  # all last written at time 0: long idle
    submitted: list[Outcome] = []
    metrics = Metrics()

    def committed_at_once(outcome: Outcome) -> None:
        submitted.append(outcome)
        if outcome.counted is not None:
            outcome.counted()

    await expire_idle(
        0.001,
        writer_for(store),
        committed_at_once,
        _all_committed,
        _Idle(),  # type: ignore[arg-type]
        lambda: len(submitted) >= 3,
        EVENTS,
        metrics,
        owns=lambda session_id: session_id != "stray",
        passed=lambda topic, offset: True,
        commands_topic=COMMANDS,
        forgetting=lambda session_id, ids: None,
        fetched=_now_ms,
    )
    by_session = {outcome.state.session_id: outcome for outcome in submitted if outcome.state}
    assert set(by_session) == {"mine", "stray", "ids"}
    # Only remembered command ids (a refusal's, a delete's): no session whose end is announced.
    assert by_session["ids"].records == []
    for outcome in by_session.values():
        assert outcome.state is not None
        assert all(value is None for _, value in outcome.state.records)  # tombstones only
    [event] = by_session["mine"].records
    body = orjson.loads(event.value or b"")
    assert (event.topic, body["type"], body["session_id"]) == (EVENTS, "session_expired", "mine")
    assert by_session["stray"].records == []  # the session lives on its own partition
    assert metrics.registry.get_sample_value("cairn_sessions_expired_total") == 1


async def test_a_session_expires_only_once_the_offsets_are_past_its_records() -> None:
    """Its command ids go with it: a record of it read again after a fault would run again, so
    the input offsets must be past every record of it first (the newest command it answered,
    recorded in its state, and what this owner read of it: a cancel, a command read again)."""
    said = [{"role": "user", "content": [{"text": "hi"}]}]
    delivery = Delivery(applied=("c1", "c2")).through((41, 1_000, None))
    store = restored(
        [Outcome(state=writer_for().write(SessionState("s", messages=said), 3, delivery))]
    )
    committed = {COMMANDS: 41, CONTROL: 7}
    submitted: list[Outcome] = []
    forgotten: list[tuple[str, list[str]]] = []
    rounds = 0

    def stopping() -> bool:
        nonlocal rounds
        rounds += 1
        if rounds == 3:
            assert submitted == [], "c2's offset, 41, is not passed yet"
            committed[COMMANDS] = 42
        if rounds == 5:
            assert submitted == [], "the cancel this owner read, at 9, is not passed yet"
            committed[CONTROL] = 10
        return bool(submitted)

    await expire_idle(
        0.001,
        writer_for(store),
        submitted.append,
        _all_committed,
        _Idle({"s": {CONTROL: 9, COMMANDS: 30}}),  # type: ignore[arg-type]
        stopping,
        EVENTS,
        Metrics(),
        passed=lambda topic, offset: committed[topic] > offset,
        commands_topic=COMMANDS,
        forgetting=lambda session_id, ids: forgotten.append((session_id, list(ids))),
        fetched=_now_ms,
    )
    assert rounds >= 5
    [outcome] = submitted
    assert outcome.state is not None and outcome.state.session_id == "s"
    assert forgotten == [("s", ["c1", "c2"])], "its ids are remembered for cancels read later"


@pytest.mark.parametrize(("log", "expires"), [("T2:0", True), ("T1:0", False), (None, False)])
async def test_the_newest_answered_command_holds_a_session_only_in_its_own_log(
    log: str | None, expires: bool
) -> None:
    """Answered at offset 41 of the commands topic with id T1, partition 0: an owner of that
    log (or one that knows none) waits for the offsets to pass 41; an owner of the topic
    created anew (id T2), whose offsets start again, does not wait for an offset of the old."""
    said = [{"role": "user", "content": [{"text": "hi"}]}]
    delivery = Delivery(applied=("c1",)).through((41, 1_000, "T1:0"))
    store = restored(
        [Outcome(state=writer_for().write(SessionState("s", messages=said), 3, delivery))]
    )
    submitted: list[Outcome] = []
    rounds = 0

    def stopping() -> bool:
        nonlocal rounds
        rounds += 1
        return bool(submitted) or rounds >= 12

    await expire_idle(
        0.001,
        writer_for(store),
        submitted.append,
        _all_committed,
        _Idle(),  # type: ignore[arg-type]
        stopping,
        EVENTS,
        Metrics(),
        passed=lambda topic, offset: offset < 5,
        commands_topic=COMMANDS,
        commands_log=log,
        forgetting=lambda session_id, ids: None,
        fetched=_now_ms,
    )
    assert bool(submitted) is expires


async def test_nothing_expires_while_fetches_go_unanswered_nor_for_a_ttl_after() -> None:
    """While the broker answers no fetch (away, restarting), a command a client published for
    the session may be held in its producer: it must reach the session before it can expire."""
    first = writer_for()
    said = [{"role": "user", "content": [{"text": "hi"}]}]
    written = [
        Outcome(
            state=first.write(
                SessionState(session_id="s1", messages=list(said)), 3, Delivery(applied=("c1",))
            )
        )
    ]
    store = restored(written)  # last written at time 0: idle for ages by the wall clock
    submitted: list[tuple[float, Outcome]] = []
    stale = 8  # fetches of the first samples lag: the newest answer is from long ago
    back: list[float] = []

    def fetched() -> int | None:
        nonlocal stale
        if stale:
            stale -= 1
            return 1_000
        if not back:
            back.append(time.time())
        return _now_ms()

    def stopping() -> bool:
        if stale:
            assert not submitted, "expired while no fetch was answered"
        return bool(submitted)

    await _expiry(
        store, 1.0, lambda outcome: submitted.append((time.time(), outcome)), stopping, fetched
    )
    [(at, outcome)] = submitted
    assert outcome.state is not None and outcome.state.session_id == "s1"
    assert at - back[0] >= 1.0, "expired within a ttl of the broker's return"


async def test_an_owner_made_after_an_outage_its_instance_saw_holds_expiry_for_a_ttl() -> None:
    """The owner that saw the broker go away ended before it came back (its partition was
    reassigned by the rebalance the outage brought): the next owner, made once the broker
    answers again, must not take the wall clock's idle time as the session's."""
    said = [{"role": "user", "content": [{"text": "hi"}]}]
    write = writer_for().write(SessionState(session_id="s1", messages=said), 3, Delivery())
    store = restored([Outcome(state=write)])  # last written at time 0
    outages = Outages()
    submitted: list[tuple[float, Outcome]] = []

    def run(fetched: Callable[[], int | None], stopping: Callable[[], bool]) -> Any:
        def submit(outcome: Outcome) -> None:
            submitted.append((time.time(), outcome))

        return _expiry(store, 1.0, submit, stopping, fetched, outages)

    await run(lambda: 1_000, lambda: outages.unfinished)  # it saw the outage, and ended
    assert submitted == []
    back = time.time()
    await run(_now_ms, lambda: bool(submitted))
    [(at, outcome)] = submitted
    assert outcome.state is not None and outcome.state.session_id == "s1"
    assert at - back >= 1.0, "expired within a ttl of the broker's return"


def _large_idle() -> SessionStore:
    said = [{"role": "user", "content": [{"text": f"{i} " * 40}]} for i in range(50)]
    write = writer_for().write(SessionState("s", agent="a", messages=said), 3, Delivery())
    return restored([Outcome(state=write)])  # last written at time 0: long idle


async def _expire_once(
    store: SessionStore, decodes: tuple[list[bool], threading.Event], during: Callable[[], None]
) -> list[Outcome]:
    """A round of expiry over ``store``; ``during()`` runs on the event loop once a session's
    decode began (``decodes``, from :func:`decodes_in`), before a decode off the loop may end."""
    off_loop, go = decodes
    submitted: list[Outcome] = []
    checks_after_decode = 0

    def stopping() -> bool:
        # The check right after the decode lets the round go on; the next one ends it.
        nonlocal checks_after_decode
        if go.is_set():
            checks_after_decode += 1
        return checks_after_decode >= 2

    expiring = asyncio.create_task(_expiry(store, 0.001, submitted.append, stopping, _now_ms))
    async with asyncio.timeout(10):
        while not off_loop:
            await asyncio.sleep(0.01)
        during()
        go.set()
        await expiring
    return submitted


async def test_a_large_idle_session_is_decoded_off_the_event_loop_and_expired(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(store_module, "DECODE_OFF_LOOP_BYTES", 1)
    decodes = decodes_in(monkeypatch)
    submitted = await _expire_once(_large_idle(), decodes, lambda: None)
    off_loop, _ = decodes
    assert off_loop == [True]
    [outcome] = submitted
    assert outcome.state is not None and outcome.state.session_id == "s"


async def test_a_session_written_while_expiry_decoded_it_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(store_module, "DECODE_OFF_LOOP_BYTES", 1)
    decodes = decodes_in(monkeypatch)
    store = _large_idle()
    writer = writer_for(store)

    def command_ran() -> None:
        # A command of the session came, ran and committed meanwhile.
        said = [{"role": "user", "content": [{"text": "again"}]}]
        write = writer.write(SessionState("s", agent="a", messages=said), 4, Delivery(("c9",)))
        rows = [(key, value, 4, _now_ms()) for key, value in write.records]
        store.committed(rows, 0, {"s": write.version})
        store.flush()

    assert await _expire_once(store, decodes, command_ran) == []
    assert decodes[0][0] is True  # the write itself read the session too, as a command would
    kept = store.get("s")
    assert kept is not None and kept.delivery.answered("c9")


def test_the_first_answer_after_an_outage_ends_it_for_every_owner() -> None:
    answers: list[int] = [1_000]  # the newest answer is from long ago: away
    outages = Outages()
    seen = Reachability(lambda: answers[-1], outages)
    assert seen.sample() is False and outages.unfinished
    later = Reachability(lambda: answers[-1], outages)  # made during it: away too
    answers.append(_now_ms())
    assert seen.sample() is True, "answered again: the outage is over"
    assert not outages.unfinished and seen.back_ms == outages.back_ms > 0
    assert later.sample() is True and later.back_ms >= outages.back_ms


async def test_a_round_forgets_the_reads_the_input_offsets_passed() -> None:
    # Sessions with no state to expire (a deleted one, a refused one) are still read: each
    # round lets go of what the offsets passed, so the owner does not keep them for its life.
    async def handle(work: CommandWork) -> None:
        pass

    async with asyncio.TaskGroup() as tasks:
        queues = SessionQueues(tasks, handle, track_reads=True)
        for offset, session in enumerate(["deleted", "refused"]):
            record = InputRecord(Origin(COMMANDS, 0, offset), session.encode(), b"", [], 0)
            queues.put(CommandWork(record, session, None))
        await asyncio.wait_for(queues.wait_idle(), 5)
        deadline = time.monotonic() + 10

        def stopping() -> bool:
            return not queues.reads("deleted") or time.monotonic() > deadline

        await expire_idle(
            2,
            writer_for(),
            lambda outcome: None,
            _all_committed,
            queues,
            stopping,
            EVENTS,
            Metrics(),
            passed=lambda topic, offset: offset < 1,
            commands_topic=COMMANDS,
            forgetting=lambda session_id, ids: None,
            fetched=_now_ms,
        )
        # Only the read the offsets passed is forgotten.
        assert queues.reads("deleted") == {}
        assert queues.reads("refused") == {COMMANDS: 1}


async def test_a_round_expires_every_idle_session_a_batch_at_a_time_past_busy_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More idle sessions than a batch all expire in one round (new sessions may come faster
    than a batch per round), each batch once the deletes of the one before are committed; the
    busy ones are left where they are and the round goes on past them."""
    monkeypatch.setattr(idle_expiry, "_BATCH", 3)
    said = [{"role": "user", "content": [{"text": "hi"}]}]
    writer = writer_for()
    store = restored(
        [
            Outcome(state=writer.write(SessionState(f"s{i}", messages=said), 3, Delivery()))
            for i in range(10)
        ]
    )
    submitted: list[Outcome] = []
    at_commit: list[int] = []

    class _Busy(_Idle):
        def busy(self, session_id: str) -> bool:
            return session_id in {"s0", "s1", "s2", "s3"}

    async def committed() -> None:
        at_commit.append(len(submitted))

    await expire_idle(
        0.001,
        writer_for(store),
        submitted.append,
        committed,
        _Busy(),  # type: ignore[arg-type]
        lambda: len(submitted) >= 6,
        EVENTS,
        Metrics(),
        passed=lambda topic, offset: True,
        commands_topic=COMMANDS,
        forgetting=lambda session_id, ids: None,
        fetched=_now_ms,
    )
    expired = [outcome.state.session_id for outcome in submitted if outcome.state is not None]
    assert expired == ["s4", "s5", "s6", "s7", "s8", "s9"]
    # Three full batches, each followed by a wait for its deletes; the fourth is the last.
    assert at_commit == [0, 2, 5]
