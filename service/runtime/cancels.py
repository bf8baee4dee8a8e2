"""Cancels of one partition: what a cancel stops, skips or resolves, in order.

Guarantees: a cancel is answered by exactly one result of its own, saying what it covered,
committed with its control offset and the session state it leaves (so a crash before that commit
re-reads it, and a re-read after it is recognised by its applied id); a cancel of a session
Cairn holds no state for leaves no state, and its answer is committed with the input offsets
past its record instead. A running invocation it covers is signalled at once; a command it
covers never starts and is answered ``cancelled`` exactly once, before the cancel's own result
when it was read by the time the cancel was answered (see :class:`HeldAnswers`); a command an
earlier owner left mid-turn that a cancel covers is waited for, up to
:data:`LEFT_COMMAND_WAIT_S`, so its result too comes before the cancel's, which names it
``stopped``. What each answer says and records is derived in
:mod:`service.runtime.cancel_answers`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from service.agent.cancel import CancelSignal
from service.agent.state import SessionState
from service.observability.metrics import Metrics
from service.runtime import cancel_answers
from service.runtime.cancel_memory import AnsweredIds, Covers
from service.runtime.control import CancelReach, ControlLedger, HeldAnswer, HeldAnswers
from service.runtime.records import ParsedCommand, deleted_record, result_record
from service.runtime.work import (
    CommandWork,
    InputRecord,
    Origin,
    Outcome,
    StateWrite,
    commands_position,
)
from service.sessions.delivery import Delivery
from service.sessions.writer import SessionWriter
from service.settings import TopicSettings
from service.wire.commands import CancelCommand

logger = logging.getLogger(__name__)

LEFT_COMMAND_WAIT_S = 30.0
"""How long a cancel waits for the record of a command it covers that an earlier owner left
mid-turn (read again by this owner from the committed offsets, beside the control records):
past it, the cancel is answered first and the command, once read, after it."""


@dataclass(slots=True)
class _Running:
    work: CommandWork
    signal: CancelSignal


class CancelDesk:
    """Remembers the cancels of one partition's sessions and applies them to their commands.

    "Published before" is decided by record timestamps: a command whose record timestamp is not
    later than an untargeted cancel's is covered by it (Kafka orders nothing across topics, and
    the producer's timestamp is the only publication order the two topics share). What a
    cancel covers is remembered in memory from the moment it is read, and durably from its
    answer on: the session's delivery records committed with the cancel keep its timestamp
    (``cancelled_before_ms``) and a target not read yet (``targets``), so a covered command
    first read by a later owner, after the partition moved, is still answered ``cancelled``.
    A cancel never reaches past the moment it was read (by the instance's clock): the
    broker takes a record timestamp up to an hour ahead, and a cancel dated later would answer
    every command of its session ``cancelled`` until then. That bound is taken once, when the
    cancel is first read, and recorded with its answer, so a re-read covers the same commands.
    The two topics do not even arrive in order within one fetch: a cancel can be queued ahead
    of commands it covers, which is why its answer is held (:class:`HeldAnswers`).
    """

    def __init__(
        self,
        *,
        writer: SessionWriter,
        submit: Callable[[Outcome], None],
        topics: TopicSettings,
        metrics: Metrics | None = None,
        durable: Callable[[], Awaitable[None]] | None = None,
        settled: Callable[[Origin], Awaitable[None]] | None = None,
    ) -> None:
        self._writer = writer
        self._durable = durable
        self._settled = settled
        self._store = writer.store
        self._submit = submit
        self._topics = topics
        self._metrics = metrics if metrics is not None else Metrics()
        self._held = HeldAnswers(submit, topics.results, self._metrics)
        self._covers = Covers()
        self._targets: dict[str, set[str]] = {}
        self._running: dict[str, _Running] = {}
        self._reach: dict[str, dict[str, CancelReach]] = {}
        self._stateless = AnsweredIds()
        self._control_read = 0
        """The control offset after the last cancel read (where a delete read now waits for
        the control partition's offsets to be)."""
        self._control_before: dict[Origin, int] = {}
        self._arrivals: dict[str, set[str]] = {}
        """The commands read of each session with a cancel or delete read and not answered."""
        self._awaited: dict[str, tuple[str, asyncio.Event]] = {}
        """By session, the command left mid-turn its cancel waits for, and the wake-up."""
        self._repeats: set[Origin] = set()
        """Cancels and deletes read with the id of a command of their session not answered
        then, until their turn (see :meth:`repeat`)."""

    @property
    def tracking(self) -> int:
        """Sessions the desk keeps something for until a turn comes: a cancel or a delete read
        and not answered, a running command, a target not read yet (what it remembers for
        repeats is bounded apart: :mod:`service.runtime.cancel_memory`)."""
        return len(self._reach.keys() | self._targets.keys() | self._running.keys())

    @property
    def ledger(self) -> ControlLedger:
        """The partition's control records on their way through session queues."""
        return self._held.ledger

    def read(
        self, record: InputRecord, cancel: CancelCommand, *, taken: bool = False
    ) -> CommandWork:
        """Take a cancel as it is read: signal what it stops now; the work answers it in order.

        ``taken``: its id is that of a command of its session read before it and not answered
        yet (being handled or queued). The cancel is then a repeat of that command, as it is
        of one the session answered: it does nothing and gets no result of its own (a command
        id answers once)."""
        session_id = cancel.session_id
        work = CommandWork(record, session_id, cancel)
        self._control_read = max(self._control_read, record.origin.offset + 1)
        target = cancel.target_command_id
        if taken:
            self._repeats.add(record.origin)
            self.ledger.read(record.origin.offset)
            return work
        if self._answered(session_id, cancel.command_id):
            # Read again after a restart: what it covers was recorded with its answer (in the
            # session's state, or here for a session without), bounded by when it was first
            # read; taken again from its timestamp now, it could reach commands published since.
            self.ledger.read(record.origin.offset)
            return work
        reaches = self._reach.setdefault(session_id, {})
        if cancel.command_id in reaches:
            # Its id read again before its answer (published twice): the first one acts alone,
            # whatever this one says, and the repeat is answered as one when its turn comes.
            self.ledger.read(record.origin.offset)
            return work
        reach = reaches[cancel.command_id] = CancelReach(self._until(record), target)
        running = self._running.get(session_id)
        if target is not None:
            self._targets.setdefault(session_id, set()).add(target)
            hit = running is not None and running.work.command_id == target
        else:
            covered = self._covers.cover(session_id, reach.timestamp_ms)
            hit = running is not None and running.work.record.timestamp_ms <= covered
        if running is not None and hit:
            running_id = running.work.command_id
            logger.info(
                "session_id=<%s>, command_id=<%s>, cancel_id=<%s> | signalling running invocation",
                session_id,
                running_id,
                cancel.command_id,
            )
            running.signal.cancel(cancel.message, after_current_tools=cancel.after_current_tools)
            if running_id is not None and reach.covers(
                running_id, running.work.record.timestamp_ms
            ):
                self._claim_stopped(session_id, reach, running_id)
        self.ledger.read(record.origin.offset)
        return work

    def deleting(self, work: CommandWork, command: ParsedCommand, *, taken: bool = False) -> None:
        """Take a delete as it is read: the session's running invocation stops now, and its
        queued commands published before the delete (and not after it was read, whatever its
        record timestamp) are answered ``cancelled`` unrun. ``taken`` as for :meth:`read`."""
        session_id = work.session_id
        command_id = command.command_id
        timestamp_ms = self._until(work.record)
        running = self._running.get(session_id)
        if (
            taken
            or self._applied(session_id, command_id)
            or (running is not None and running.work.command_id == command_id)
        ):
            # Its id is a command the session answered, is running or has queued: the delete
            # is a repeat, skipped at its turn (a command id answers once).
            if taken:
                self._repeats.add(work.record.origin)
            return
        self._control_before[work.record.origin] = self._control_read
        reach = self._reach.setdefault(session_id, {}).setdefault(
            command_id, CancelReach(timestamp_ms, None)
        )
        covered = self._covers.cover(session_id, timestamp_ms)
        if running is not None and running.work.record.timestamp_ms <= covered:
            running_id = running.work.command_id
            logger.info(
                "session_id=<%s>, command_id=<%s>, delete_id=<%s> | stopping the running "
                "invocation of a session being deleted",
                session_id,
                running_id,
                command_id,
            )
            running.signal.cancel(None)
            if running_id is not None:
                self._claim_stopped(session_id, reach, running_id)

    async def delete(self, work: CommandWork, command: ParsedCommand) -> None:
        """The delete's turn in its session's queue: tombstones for every record of the
        session, and its one result (with its input offset, as no state remembers it).

        No state remembers a delete, so it must never be read again once answered: it waits
        until every earlier record of its partition is finished (``settled``), and its commit
        moves the input offsets past it. Read again, it would delete what the session did
        since and run that again. The same holds for the cancels read before it, whose answers
        the session's state remembered until the delete: it waits until their control
        offsets are committed too. It also waits for the session's earlier writes to commit, so
        the local table lists every key they wrote, and for its own, so that nothing of the
        session is read back from the table before its tombstones are there.
        """
        session_id = work.session_id
        origin = work.record.origin
        control_before = self._control_before.pop(origin, 0)
        if self._settled is not None:
            await self._settled(origin)
            control = Origin(self._topics.control, origin.partition, control_before)
            await self._settled(control)
        if self._durable is not None:
            await self._durable()
        reach = self._take_reach(session_id, command.command_id)
        if reach is None:
            reach = CancelReach(self._until(work.record), None)
        stored = self._store.get(session_id)
        # A state that only remembers command ids (a refusal's) is no session: its records
        # go all the same, and are counted.
        existed = stored is not None and stored.exists
        if stored is not None:
            self.forgetting(session_id, stored.delivery.applied)
        write = self._writer.delete(session_id) if stored is not None else None
        # Everything still queued for the session was published after the delete.
        self._covers.end_at(session_id, reach.timestamp_ms)
        self._targets.pop(session_id, None)
        removed = len(write.records) if write is not None else 0
        record = deleted_record(
            self._topics.results,
            session_id,
            command.command_id,
            existed=existed,
            records=removed,
            stopped=reach.stopped,
            skipped=reach.skipped,
            metadata=command.metadata,
            headers=work.trace,
        )
        logger.info(
            "session_id=<%s>, command_id=<%s>, existed=<%s>, records=<%d> | session deleted",
            session_id,
            command.command_id,
            existed,
            removed,
        )
        self._submit(
            Outcome(
                records=[record],
                state=write,
                finished=[work.record.origin],
                results=1,
                replay_unsafe=True,
                counted=self._count_delete,
            )
        )
        if self._durable is not None:
            await self._durable()

    def _count_delete(self) -> None:
        self._metrics.command("delete", "ok")
        self._metrics.result("end_turn")

    def repeat(self, work: CommandWork) -> bool:
        """The cancel or delete was read with the id of a command of its session not answered
        then (``taken``): a repeat of that command, whether or not its answer recorded the id.
        Asked once, at its turn."""
        if work.record.origin not in self._repeats:
            return False
        self._repeats.remove(work.record.origin)
        return True

    @property
    def awaiting(self) -> int:
        """Cancels waiting for the record of a command left mid-turn."""
        return len(self._awaited)

    def arrived(self, work: CommandWork) -> None:
        """A command was read (and queued in its session): a cancel of its session waiting for
        it goes on."""
        session_id = work.session_id
        if session_id not in self._reach or work.command_id is None:
            return
        self._arrivals.setdefault(session_id, set()).add(work.command_id)
        awaited = self._awaited.get(session_id)
        if awaited is not None and awaited[0] == work.command_id:
            awaited[1].set()

    async def left_mid_turn(self, work: CommandWork, cancel: CancelCommand) -> None:
        """Before the cancel's turn: if it covers a command an earlier owner left mid-turn
        whose record this owner has not read yet, wait until it is read (it then waits behind
        the cancel in the session's queue, and is answered ahead of it), up to
        :data:`LEFT_COMMAND_WAIT_S`. The committed input offsets never pass a command left
        mid-turn, so its record is read again; only the order of the two topics' fetches
        decides which comes first."""
        session_id = work.session_id
        if work.record.origin in self._repeats:
            return
        stored = self._store.get(session_id)
        inflight = stored.state.inflight if stored is not None else None
        if stored is None or inflight is None or self._answered(session_id, cancel.command_id):
            return
        left = inflight.command_id
        target = cancel.target_command_id
        if target is not None and target != left:
            return
        reach = self._reach.get(session_id, {}).get(cancel.command_id)
        published = stored.delivery.inflight_published_ms
        if target is None and (
            reach is None or (published is not None and published > reach.timestamp_ms)
        ):
            return  # published after the cancel: it goes on, uncancelled
        if left in self._arrivals.get(session_id, ()):
            return
        logger.info(
            "session_id=<%s>, cancel_id=<%s>, command_id=<%s> | cancel waits for the command "
            "an earlier owner left mid-turn to be read",
            session_id,
            cancel.command_id,
            left,
        )
        read = asyncio.Event()
        self._awaited[session_id] = (left, read)
        try:
            async with asyncio.timeout(LEFT_COMMAND_WAIT_S):
                await read.wait()
        except TimeoutError:
            logger.warning(
                "session_id=<%s>, cancel_id=<%s>, command_id=<%s>, waited_s=<%s> | command "
                "left mid-turn not read: the cancel is answered first",
                session_id,
                cancel.command_id,
                left,
                LEFT_COMMAND_WAIT_S,
            )
        finally:
            self._awaited.pop(session_id, None)

    def answer(self, work: CommandWork, cancel: CancelCommand) -> None:
        """The cancel's turn in its session's queue: its own result, held until the covered
        commands queued behind it are answered (see :class:`HeldAnswers`).

        Should answering it fail, what waits behind it is let go before the failure passes on
        (to be answered as any unexpected failure is), so nothing waits for it for ever.
        """
        try:
            self._answer(work, cancel)
        except Exception:
            self._held.release(work.session_id)
            self.ledger.answered(work.record.origin.offset)
            raise

    def release(self, session_id: str) -> None:
        """Let the session's held answers go: whatever the session does next comes after them."""
        self._held.release(session_id)

    @contextmanager
    def running(self, work: CommandWork) -> Iterator[CancelSignal]:
        """Mark ``work`` as its session's running invocation for the body's duration: a cancel
        read meanwhile that covers it fires the signal it is given (``work.cancel``)."""
        signal = CancelSignal()
        work.cancel = signal
        self._running[work.session_id] = _Running(work, signal)
        try:
            yield signal
        finally:
            self._running.pop(work.session_id, None)

    def covered(self, work: CommandWork, command: ParsedCommand) -> bool:
        """A cancel read so far (here, or by an earlier owner and recorded in the session's
        state) covers the command: it must not run."""
        session_id = work.session_id
        if self._applied(session_id, command.command_id):
            return False  # a redelivery: answered before, it is not answered again
        targets = self._targets.get(session_id)
        if targets is not None and command.command_id in targets:
            return True
        stored = self._store.get(session_id)
        if stored is not None and command.command_id in stored.delivery.targets:
            return True
        durable = stored.delivery.cancelled_before_ms if stored is not None else None
        covered = max(self._covers.until(session_id), -1 if durable is None else durable)
        return work.record.timestamp_ms <= covered

    def skip(self, work: CommandWork, command: ParsedCommand) -> None:
        """Answer a covered command ``cancelled`` without running it."""
        session_id = work.session_id
        held = self._held.of(session_id)
        stored = self._store.get(session_id)
        state = (
            stored.state
            if stored is not None
            else SessionState(session_id=session_id, agent=command.agent or "")
        )
        delivery = stored.delivery if stored is not None else Delivery()
        inflight = state.inflight
        left_mid_turn = inflight is not None and inflight.command_id == command.command_id
        # The earliest cancel that covers it answered it (those answered and held were read
        # before those still waiting for their turn).
        for reach in [*(a.reach for a in held), *self._reach.get(session_id, {}).values()]:
            if reach.covers(command.command_id, work.record.timestamp_ms):
                if left_mid_turn:
                    self._claim_stopped(session_id, reach, command.command_id)
                else:
                    reach.skip(command.command_id)
                break
        self._forget_target(session_id, command.command_id)
        result, state, delivery = cancel_answers.skipped(state, delivery, command.command_id)
        delivery = delivery.through(commands_position(work.record, self._topics.commands))
        logger.info(
            "session_id=<%s>, command_id=<%s> | command covered by a cancel, answered cancelled",
            session_id,
            command.command_id,
        )
        self._metrics.command(command.type, "skipped")
        self._metrics.result(result.stop_reason)
        record = result_record(
            self._topics.results,
            session_id,
            command.command_id,
            result,
            command.metadata,
            work.trace,
        )
        seq = stored.event_seq if stored is not None else 0
        write = self._recorded(state, delivery, held, seq)
        if held:
            # Queued behind a cancel answered in this run of the queue: it goes out with that
            # cancel's answer, ahead of it.
            self._held.hold(session_id, work.record.origin, ahead=[record], state=write)
        else:
            self._submit(
                Outcome(records=[record], state=write, finished=[work.record.origin], results=1)
            )

    def _claim_stopped(self, session_id: str, reach: CancelReach, command_id: str) -> None:
        """``reach`` stopped ``command_id``, unless an earlier cancel of the session did."""
        held = (answer.reach for answer in self._held.of(session_id))
        for other in [*held, *self._reach.get(session_id, {}).values()]:
            if other is not reach and other.stopped == command_id:
                return
        reach.stopped = reach.stopped or command_id

    def _until(self, record: InputRecord) -> int:
        """The publication time up to which a cancel or a delete read now covers its session's
        commands: its record timestamp, but never later than now."""
        return min(record.timestamp_ms, int(time.time() * 1000))

    def _applied(self, session_id: str, command_id: str) -> bool:
        # Asked as a cancel or a delete is read too: the delivery records alone, never a
        # large session decoded on the event loop for them.
        delivery = self._store.delivery(session_id)
        return delivery is not None and delivery.answered(command_id)

    def forgetting(self, session_id: str, command_ids: Iterable[str]) -> None:
        """The session's state, which recognises these command ids, is being deleted (a delete,
        an idle expiry): a cancel among them read again (one published before can be read
        after, the control partition read behind the commands partition after a rebalance),
        or a targeted cancel naming one, is recognised by this owner, as for a session
        without state."""
        for command_id in command_ids:
            self._stateless.remember(session_id, command_id)

    def _answered(self, session_id: str, cancel_id: str) -> bool:
        """Answered before: recorded in its session's state, or here for a session without (or
        one this owner deleted since)."""
        known = self._stateless.knows(session_id, cancel_id)
        return known or self._applied(session_id, cancel_id)

    def _answer(self, work: CommandWork, cancel: CancelCommand) -> None:
        """The cancel's own result, after everything before it in its session was dealt with."""
        session_id = work.session_id
        origin = work.record.origin
        if self.repeat(work) or self._answered(session_id, cancel.command_id):
            self._metrics.command("cancel", "duplicate")
            self._metrics.cancel("duplicate")
            if not self._applied(session_id, cancel.command_id):
                # Recognised only by this owner's memory: a later owner must not read it again.
                self.ledger.after_earlier(origin.offset, Outcome(finished=[origin]))
                return
            self._submit(Outcome(finished=[origin]))
            self.ledger.answered(origin.offset)
            return
        reach = self._take_reach(session_id, cancel.command_id)
        if reach is None:
            reach = CancelReach(self._until(work.record), cancel.target_command_id)
        stored = self._store.get(session_id)
        state = stored.state if stored is not None else None
        delivery = stored.delivery if stored is not None else Delivery()
        target = cancel.target_command_id
        if target is None:
            if state is None:
                result = cancel_answers.plain_cancelled(SessionState(session_id=session_id))
            else:
                result, state, delivery = cancel_answers.untargeted(state, delivery, cancel, reach)
        else:
            self._forget_target(session_id, target)
            result, state, delivery = cancel_answers.targeted(
                session_id,
                state,
                delivery,
                target,
                deleted_here=self._stateless.knows(session_id, target),
            )
        answer = HeldAnswer(work, cancel, result, reach)
        seq = stored.event_seq if stored is not None else 0
        write = (
            None
            if state is None
            else self._recorded(state, delivery, [*self._held.of(session_id), answer], seq)
        )
        self._held.hold(session_id, origin, answer=answer, state=write)
        if state is None:
            # Nothing to record it in: this owner recognises a repeat; the ledger a re-read.
            self._stateless.remember(session_id, cancel.command_id)
        logger.info(
            "session_id=<%s>, cancel_id=<%s>, target=<%s>, stopped=<%s>, resolved=<%s> | "
            "cancel answered",
            session_id,
            cancel.command_id,
            target,
            reach.stopped,
            reach.resolved,
        )

    def _take_reach(self, session_id: str, command_id: str) -> CancelReach | None:
        """What the cancel or delete ``command_id`` reached since it was read, forgotten now
        that its turn came (with the session's entry once it holds no other)."""
        reaches = self._reach.get(session_id)
        if reaches is None:
            return None
        reach = reaches.pop(command_id, None)
        if not reaches:
            del self._reach[session_id]
            self._arrivals.pop(session_id, None)
        return reach

    def _forget_target(self, session_id: str, command_id: str) -> None:
        targets = self._targets.get(session_id)
        if targets is None:
            return
        targets.discard(command_id)
        if not targets:
            del self._targets[session_id]

    def _recorded(
        self, state: SessionState, delivery: Delivery, answers: list[HeldAnswer], seq: int
    ) -> StateWrite:
        """``state`` written with every held cancel recorded in ``delivery``."""
        return self._writer.write(state, seq, cancel_answers.recording(delivery, answers))
