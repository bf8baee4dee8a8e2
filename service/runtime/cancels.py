"""Cancels of one partition: what a cancel stops, skips, resolves or answers ahead, in order.

Guarantees: a cancel is answered by exactly one result of its own, committed with its control
offset and the session state it leaves (so a crash before that commit re-reads it, and a
re-read after it is recognised by its applied id); a running invocation it covers is signalled at
once; a command it covers never starts and is answered ``cancelled`` exactly once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from service.agent.cancel import CancelSignal
from service.agent.definition import AgentDefinition
from service.agent.loop import resolve_cancel
from service.agent.state import SessionState
from service.agent.types import AgentResult
from service.observability.logs import log_context
from service.observability.metrics import Metrics
from service.observability.tracing import from_headers, span
from service.runtime.bad_input import classify_refusal
from service.runtime.records import ParsedCommand, result_record
from service.runtime.work import CommandWork, InputRecord, Outcome, OutRecord, StateWrite
from service.sessions.codec import encode_state
from service.sessions.store import SessionStore, StoredSession
from service.settings import TopicSettings
from service.wire.commands import CancelCommand
from service.wire.errors import WireError

logger = logging.getLogger(__name__)

Handler = Callable[[CommandWork], Awaitable[None]]

REMEMBERED_SESSIONS = 100_000
"""How many sessions' latest untargeted cancel an owner keeps in memory (oldest dropped)."""


@dataclass(slots=True)
class _Running:
    work: CommandWork
    signal: CancelSignal


@dataclass(slots=True)
class _Open:
    """A session's untargeted cancels read but not answered yet, and the commands they skipped."""

    cancel_ids: set[str] = field(default_factory=set)
    skipped: int = 0


class CancelDesk:
    """Remembers the cancels of one partition's sessions and applies them to their commands.

    "Published before" is decided by record timestamps: a command whose record timestamp is not
    later than an untargeted cancel's is covered by it (Kafka orders nothing across topics, and
    the producer's timestamp is the only publication order the two topics share). What a
    cancel covers is remembered in memory from the moment it is read, and durably from its
    answer on: the session state committed with the cancel keeps its timestamp
    (``cancelled_before_ms``) and a target it answered ahead (as applied), so a covered command
    first read by a later owner, after the partition moved, is still answered ``cancelled``.
    """

    def __init__(
        self,
        *,
        store: SessionStore,
        submit: Callable[[Outcome], None],
        topics: TopicSettings,
        agents: Mapping[str, AgentDefinition],
        metrics: Metrics | None = None,
    ) -> None:
        self._store = store
        self._submit = submit
        self._topics = topics
        self._agents = agents
        self._metrics = metrics if metrics is not None else Metrics()
        self._signalled: set[str] = set()
        self._covers_until: dict[str, int] = {}
        self._targets: dict[str, set[str]] = {}
        self._running: dict[str, _Running] = {}
        self._open: dict[str, _Open] = {}

    def read(self, record: InputRecord, cancel: CancelCommand) -> CommandWork:
        """Take a cancel as it is read: signal what it stops now; the work answers it in order."""
        session_id = cancel.session_id
        work = CommandWork(record, session_id, cancel)
        target = cancel.target_command_id
        if self._applied(session_id, cancel.command_id):
            if target is None:
                # Read again after a restart: what it covers is remembered again, so a covered
                # command read only now is still skipped; everything else was done already.
                self._cover(session_id, record.timestamp_ms)
            return work
        running = self._running.get(session_id)
        if target is not None:
            self._targets.setdefault(session_id, set()).add(target)
            hit = running is not None and _command_id(running.work) == target
        else:
            covered = self._cover(session_id, record.timestamp_ms)
            hit = running is not None and running.work.record.timestamp_ms <= covered
            self._open.setdefault(session_id, _Open()).cancel_ids.add(cancel.command_id)
        if running is not None and hit:
            logger.info(
                "session_id=<%s>, command_id=<%s>, cancel_id=<%s> | signalling running invocation",
                session_id,
                _command_id(running.work),
                cancel.command_id,
            )
            running.signal.cancel(cancel.message, after_current_tools=cancel.after_current_tools)
            self._signalled.add(cancel.command_id)
        return work

    def wrap(self, handler: Handler) -> Handler:
        """The session-queue handler: cancels answered, covered commands skipped, others run.

        Each command is handled inside its own span (parented by the trace context of its
        record) and log context, so its outputs carry the trace and its log lines its ids.
        """
        dispatch = self._dispatch(handler)

        async def handle(work: CommandWork) -> None:
            command = work.command
            command_id = command.command_id if command is not None else _wire_id(work.error)
            with span("cairn.command", from_headers(work.record.headers)) as trace:
                work.trace = trace.headers()
                with log_context(
                    session_id=work.session_id, command_id=command_id, trace_id=trace.trace_id
                ):
                    await dispatch(work)

        return handle

    def _dispatch(self, handler: Handler) -> Handler:
        async def handle(work: CommandWork) -> None:
            command = work.command
            if isinstance(command, CancelCommand):
                self._answer(work, command)
                return
            if command is None:
                stored = self._store.get(work.session_id)
                work.error = classify_refusal(work, stored, self._agents)
                await handler(work)
                return
            if self._covered(work, command):
                self._skip(work, command)
                return
            signal = CancelSignal()
            work.cancel = signal
            self._running[work.session_id] = _Running(work, signal)
            try:
                await handler(work)
            finally:
                self._running.pop(work.session_id, None)

        return handle

    def _cover(self, session_id: str, timestamp_ms: int) -> int:
        covered = max(self._covers_until.pop(session_id, -1), timestamp_ms)
        self._covers_until[session_id] = covered
        if len(self._covers_until) > REMEMBERED_SESSIONS:
            # The oldest cancel is forgotten: its late commands are long overdue by now.
            del self._covers_until[next(iter(self._covers_until))]
        return covered

    def _applied(self, session_id: str, command_id: str) -> bool:
        stored = self._store.get(session_id)
        return stored is not None and command_id in stored.state.applied_commands

    def _covered(self, work: CommandWork, command: ParsedCommand) -> bool:
        session_id = work.session_id
        if self._applied(session_id, command.command_id):
            return False  # a redelivery: the invoker recognises it and answers nothing
        targets = self._targets.get(session_id)
        if targets is not None and command.command_id in targets:
            return True
        stored = self._store.get(session_id)
        durable = stored.state.cancelled_before_ms if stored is not None else None
        covered = max(self._covers_until.get(session_id, -1), -1 if durable is None else durable)
        return work.record.timestamp_ms <= covered

    def _skip(self, work: CommandWork, command: ParsedCommand) -> None:
        """Answer a covered command ``cancelled`` without running it."""
        session_id = work.session_id
        opened = self._open.get(session_id)
        if opened is not None and not self._targeted(session_id, command.command_id):
            opened.skipped += 1
        self._forget_target(session_id, command.command_id)
        stored = self._store.get(session_id)
        state = (
            stored.state
            if stored is not None
            else SessionState(session_id=session_id, agent=command.agent or "")
        )
        inflight = state.inflight
        if inflight is not None and inflight.command_id == command.command_id:
            # It ran up to a boundary before a crash: close its turn as a cancel there would have.
            result, state = resolve_cancel(state, None, command_id=command.command_id)
            state.inflight_published_ms = None
        else:
            result = _plain_cancelled(state)
            state = state.copy()
            state.mark_applied(command.command_id)
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
        self._commit(work, stored, state, [record])

    def _answer(self, work: CommandWork, cancel: CancelCommand) -> None:
        """The cancel's own result, after everything before it in its session was dealt with."""
        session_id = work.session_id
        stored = self._store.get(session_id)
        state = stored.state if stored is not None else SessionState(session_id=session_id)
        signalled = cancel.command_id in self._signalled
        self._signalled.discard(cancel.command_id)
        skipped = self._close(session_id, cancel.command_id)
        if cancel.command_id in state.applied_commands:
            self._metrics.command("cancel", "duplicate")
            self._metrics.cancel("duplicate")
            self._submit(Outcome(finished=[work.record.origin]))
            return
        self._metrics.cancel(_cancel_outcome(cancel, state, signalled, skipped))
        records: list[OutRecord] = []
        target = cancel.target_command_id
        if target is None:
            result, state = self._resolve(state, work.record.timestamp_ms, cancel)
        else:
            self._forget_target(session_id, target)
            result = _plain_cancelled(state)
            state = state.copy()
            if target not in state.applied_commands:
                # Not seen yet: answer it now; when it arrives it is a known, answered command.
                records.append(
                    result_record(
                        self._topics.results, session_id, target, result, None, work.trace
                    )
                )
                self._metrics.result(result.stop_reason)
                state.mark_applied(target)
            state.mark_applied(cancel.command_id)
        logger.info(
            "session_id=<%s>, cancel_id=<%s>, target=<%s>, resolved=<%s> | cancel answered",
            session_id,
            cancel.command_id,
            target,
            result.message is not None,
        )
        records.append(
            result_record(
                self._topics.results, session_id, cancel.command_id, result, None, work.trace
            )
        )
        self._metrics.command("cancel", "ok")
        self._metrics.result(result.stop_reason)
        self._commit(work, stored, state, records)

    def _resolve(
        self, state: SessionState, timestamp_ms: int, cancel: CancelCommand
    ) -> tuple[AgentResult, SessionState]:
        """Resolve the session's pause and record durably up to when the cancel covers."""
        inflight = state.inflight
        published = state.inflight_published_ms
        if inflight is not None and published is not None and published > timestamp_ms:
            # The in-flight command was published after the cancel (it started before the
            # cancel was read, then its owner died): its redelivery continues it, uncancelled.
            result = _plain_cancelled(state)
            state = state.copy()
            state.mark_applied(cancel.command_id)
        else:
            result, state = resolve_cancel(state, cancel.message, command_id=cancel.command_id)
            state.inflight_published_ms = None
        previous = state.cancelled_before_ms
        if timestamp_ms >= 0:  # a record without a timestamp (-1) covers nothing by time
            state.cancelled_before_ms = max(timestamp_ms, -1 if previous is None else previous)
        return result, state

    def _commit(
        self,
        work: CommandWork,
        stored: StoredSession | None,
        state: SessionState,
        records: list[OutRecord],
    ) -> None:
        seq = stored.event_seq if stored is not None else 0
        self._store.put(state.session_id, StoredSession(state, seq))
        self._submit(
            Outcome(
                records=records,
                state=StateWrite(state.session_id, encode_state(state), seq),
                finished=[work.record.origin],
                results=len(records),
            )
        )

    def _close(self, session_id: str, cancel_id: str) -> int:
        """The cancel is answered: how many queued commands were skipped since it was read."""
        opened = self._open.get(session_id)
        if opened is None or cancel_id not in opened.cancel_ids:
            return 0  # targeted, or read again after a restart: it opened nothing
        skipped, opened.skipped = opened.skipped, 0
        opened.cancel_ids.discard(cancel_id)
        if not opened.cancel_ids:
            del self._open[session_id]
        return skipped

    def _targeted(self, session_id: str, command_id: str) -> bool:
        targets = self._targets.get(session_id)
        return targets is not None and command_id in targets

    def _forget_target(self, session_id: str, command_id: str) -> None:
        targets = self._targets.get(session_id)
        if targets is None:
            return
        targets.discard(command_id)
        if not targets:
            del self._targets[session_id]


def _command_id(work: CommandWork) -> str | None:
    command = work.command
    return command.command_id if isinstance(command, ParsedCommand) else None


def _plain_cancelled(state: SessionState) -> AgentResult:
    """A ``cancelled`` result that resolves nothing (the session's pause, if any, is kept)."""
    bare = state.snapshot()
    bare.pending = None
    bare.checkpoint = None
    bare.inflight = None
    result, _ = resolve_cancel(bare)
    return result


def _wire_id(error: Exception | None) -> str | None:
    return error.command_id if isinstance(error, WireError) else None


def _cancel_outcome(
    cancel: CancelCommand, state: SessionState, signalled: bool, skipped: int
) -> str:
    """What a cancel met first, in session order, for the cancels metric (see CANCEL_OUTCOMES)."""
    if cancel.target_command_id is not None:
        return "targeted"
    if signalled:
        return "deferred" if cancel.after_current_tools else "running"
    if state.pending is not None or state.checkpoint is not None:
        return "paused"
    if skipped:
        return "queued"
    return "idle"
