"""The control-topic seam of one partition: where cancels arrive and how their answers leave.

Guarantee: every control record is accounted for exactly once, its offset committed only with
its effect: a cancel's own result (saying what it covered) and state, through its session queue;
an ``error`` result for an invalid one that names its session and id; or a dead-letter record
for the rest. A cancel's result goes out after the results of the covered commands queued
behind it, in the same outcome; an answer no session state records goes out with the input
offsets, once every earlier control record was answered, so the commit passes its record.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from service.agent.types import AgentResult
from service.observability.metrics import Metrics
from service.runtime.records import RECORD_MAX_BYTES, check_home
from service.runtime.work import CommandWork, InputRecord, Origin, Outcome, OutRecord, StateWrite
from service.wire.codec import decode_control, encode_result
from service.wire.commands import CancelCommand
from service.wire.errors import WireError
from service.wire.results import CancelReport
from service.wire.results import result_record as wire_result

if TYPE_CHECKING:
    from service.runtime.cancels import CancelDesk

logger = logging.getLogger(__name__)

SKIPPED_LISTED = 1_000
"""At most this many skipped commands are named in a cancel's result, so it stays small."""


def parse_cancel(
    record: InputRecord, max_bytes: int = RECORD_MAX_BYTES, partitions: int | None = None
) -> CancelCommand:
    """Decode a control-topic record; raises :class:`WireError` when it is not a cancel, or not
    on the partition its key belongs on (:func:`~service.runtime.records.check_home`).

    A value larger than ``max_bytes`` is refused before a byte of it is parsed.
    """
    if record.value is None:
        raise WireError("record has no value")
    cancel = decode_control(record.value, key=record.key, max_bytes=max_bytes)
    check_home(record, cancel.session_id, cancel.command_id, partitions)
    return cancel


@dataclass(slots=True)
class CancelReach:
    """What one cancel covered so far, from when it is read until its result goes out."""

    timestamp_ms: int
    target: str | None
    stopped: str | None = None
    skipped: list[str] = field(default_factory=list)
    resolved: Literal["checkpoint", "interrupt"] | None = None

    def covers(self, command_id: str, timestamp_ms: int) -> bool:
        if self.target is not None:
            return command_id == self.target
        return timestamp_ms <= self.timestamp_ms

    def skip(self, command_id: str) -> None:
        if command_id == self.stopped or command_id in self.skipped:
            return
        if len(self.skipped) < SKIPPED_LISTED:
            self.skipped.append(command_id)

    def outcome(self, after_current_tools: bool) -> str:
        """What the cancel met first, in session order, for the cancels metric."""
        if self.target is not None:
            return "targeted"
        if self.stopped is not None:
            return "deferred" if after_current_tools else "running"
        if self.resolved is not None:
            return "paused"
        return "queued" if self.skipped else "idle"


@dataclass(slots=True)
class HeldAnswer:
    """A cancel answered; its result goes out when its session's held answers do."""

    work: CommandWork
    cancel: CancelCommand
    result: AgentResult
    reach: CancelReach
    record: OutRecord | None = None


@dataclass(slots=True)
class _Held:
    ahead: list[OutRecord] = field(default_factory=list)
    answers: list[HeldAnswer] = field(default_factory=list)
    finished: list[Origin] = field(default_factory=list)
    state: StateWrite | None = None


class ControlLedger:
    """The control records of one partition that wait in session queues, in offset order.

    Guarantee: an outcome handed to :meth:`after_earlier` is submitted only once every control
    record read before its own was answered (submitted), and it carries the input offsets
    (``replay_unsafe``). The committer finishes offsets in submission order, so the offset it
    commits then is past that record: an answer nothing else records (a cancel of a session
    Cairn holds no state for) is read again only if it was never committed.
    """

    def __init__(self, submit: Callable[[Outcome], None]) -> None:
        self._submit = submit
        self._open: dict[int, bool] = {}
        """Offsets read and not yet passed, in read (offset) order: answered or not."""
        self._waiting: dict[int, Outcome] = {}

    def read(self, offset: int) -> None:
        """A control record is on its way to a session queue (called in offset order)."""
        self._open[offset] = False

    def answered(self, offset: int) -> None:
        """The record's outcome was submitted (or its failure is answered in its place)."""
        if offset in self._open:
            self._open[offset] = True
            self._flush()

    def after_earlier(self, offset: int, outcome: Outcome) -> None:
        """Submit ``outcome``, the answer to the record at ``offset``, after every earlier one."""
        outcome.replay_unsafe = True
        if offset not in self._open:
            self._submit(outcome)
            return
        self._waiting[offset] = outcome
        self._flush()

    def _flush(self) -> None:
        while self._open:
            first = next(iter(self._open))
            waiting = self._waiting.pop(first, None)
            if waiting is not None:
                self._submit(waiting)
            elif not self._open[first]:
                return
            del self._open[first]


class HeldAnswers:
    """Cancels' answers of one partition, kept back per session while its queue handles only
    cancels, skips and repeats, so covered commands queued behind a cancel are answered ahead
    of it.

    Guarantee: a session's held answers go out in one outcome, covered commands' results first
    and the cancels' own last, before anything else of the session is answered (a repeat of a
    command answered before answers nothing) and at the latest on the event loop's next turn;
    without a session state each cancel's answer goes out through the ledger. Every record is
    built when it is held, so letting them go cannot fail.
    """

    def __init__(
        self, submit: Callable[[Outcome], None], results_topic: str, metrics: Metrics
    ) -> None:
        self._submit = submit
        self._topic = results_topic
        self._metrics = metrics
        self.ledger = ControlLedger(submit)
        self._held: dict[str, _Held] = {}

    def of(self, session_id: str) -> list[HeldAnswer]:
        held = self._held.get(session_id)
        return held.answers if held is not None else []

    def hold(
        self,
        session_id: str,
        finished: Origin,
        *,
        answer: HeldAnswer | None = None,
        ahead: list[OutRecord] | None = None,
        state: StateWrite | None = None,
    ) -> None:
        """Hold one more answer of the session (a cancel's, or ``ahead`` of the cancels'),
        ``state`` the session's latest (every held cancel recorded in it)."""
        answers = [*self.of(session_id), *([answer] if answer is not None else [])]
        records = [self._record(held) for held in answers]
        held = self._held.get(session_id)
        if held is None:
            held = self._held[session_id] = _Held()
            # A run of the queue handles cancels and skips without yielding to the event loop,
            # and a fetch is routed whole before the queue runs: by the loop's next turn every
            # covered command read with the cancel and queued behind it has joined.
            asyncio.get_running_loop().call_soon(self.release, session_id)
        held.ahead.extend(ahead or [])
        held.finished.append(finished)
        held.answers = answers
        if state is not None:
            held.state = state if held.state is None else held.state.then(state)
        for waiting, record in zip(answers, records, strict=True):
            waiting.record = record

    def release(self, session_id: str) -> None:
        """Submit the session's held answers: covered commands' results first, cancels' last."""
        held = self._held.pop(session_id, None)
        if held is None:
            return
        for answer in held.answers:
            self._metrics.cancel(answer.reach.outcome(answer.cancel.after_current_tools))
            self._metrics.command("cancel", "ok")
            self._metrics.result(answer.result.stop_reason)
        if held.state is None:
            # No state records them (the session has none, and a skip would have made one):
            # each goes out with an input offset past its record, so that once committed it is
            # never read and answered again.
            for answer in held.answers:
                origin = answer.work.record.origin
                records = [answer.record] if answer.record is not None else []
                outcome = Outcome(records=records, finished=[origin], results=len(records))
                self.ledger.after_earlier(origin.offset, outcome)
            return
        records = [*held.ahead, *(a.record for a in held.answers if a.record is not None)]
        self._submit(
            Outcome(records=records, state=held.state, finished=held.finished, results=len(records))
        )
        for answer in held.answers:
            self.ledger.answered(answer.work.record.origin.offset)

    def _record(self, answer: HeldAnswer) -> OutRecord:
        """The cancel's own result, with what it covered (its ``cancel`` field)."""
        work, reach = answer.work, answer.reach
        report = CancelReport(
            stopped=reach.stopped, skipped=list(reach.skipped), resolved=reach.resolved
        )
        body = wire_result(
            answer.result, session_id=work.session_id, command_id=answer.cancel.command_id
        )
        body = body.model_copy(update={"cancel": report})
        return OutRecord(
            topic=self._topic,
            key=work.session_id.encode(),
            value=encode_result(body),
            headers=work.trace or [],
        )


class ControlHandler:
    def __init__(
        self,
        desk: CancelDesk,
        put: Callable[[CommandWork], None],
        holds: Callable[[str, str], bool],
        undecodable: Callable[[InputRecord, WireError], CommandWork | None],
        max_bytes: int = RECORD_MAX_BYTES,
        partitions: int | None = None,
    ) -> None:
        """``holds``: whether a command of the session with this id was put and is not done
        (:meth:`SessionQueues.holds`)."""
        self._holds = holds
        self._max_bytes = max_bytes
        self._partitions = partitions
        self._desk = desk
        self._put = put
        self._undecodable = undecodable

    def handle(self, record: InputRecord) -> None:
        try:
            cancel = parse_cancel(record, self._max_bytes, self._partitions)
        except WireError as exc:
            work = self._undecodable(record, exc)
            if work is not None:
                # Answered in its session's queue: answers that wait for earlier control
                # records wait for this one too.
                self._desk.ledger.read(record.origin.offset)
                self._put(work)
            return
        logger.info(
            "session_id=<%s>, cancel_id=<%s>, target=<%s> | cancel read",
            cancel.session_id,
            cancel.command_id,
            cancel.target_command_id,
        )
        taken = self._holds(cancel.session_id, cancel.command_id)
        self._put(self._desk.read(record, cancel, taken=taken))
