"""Runs one command of one session through the engine and hands what it produced to the committer.

Guarantees: every boundary the engine passes is committed, with its in-flight marker, before the
invocation goes past it, so a crash continues from there; a run ends in its result, committed
with the command's offset and the session's new state, or raises for its caller to answer (see
:mod:`service.runtime.command_path`); every output carries what replaces it should the broker
refuse it. Nothing here opens a transaction.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from pydantic import ValidationError

from service.agent import tracing
from service.agent.definition import AgentDefinition
from service.agent.events import (
    Boundary,
    CheckpointReached,
    Event,
    InterruptRaised,
    ModelMessage,
    ModelTextDelta,
    Stopped,
    ToolFinished,
    ToolLedger,
    ToolStarted,
)
from service.agent.invocation import Invocation
from service.agent.loop import run_invocation
from service.agent.outcomes import OUTCOME_UNKNOWN
from service.agent.state import SessionState
from service.agent.types import AgentResult
from service.observability.metrics import Metrics
from service.observability.tracing import engine_tracer
from service.runtime.answers import Answers
from service.runtime.records import ParsedCommand, event_record, result_record
from service.runtime.work import CommandWork, Origin, Outcome, OutRecord, commands_position
from service.sessions.delivery import Delivery
from service.sessions.store import StoredSession
from service.sessions.versions import Step
from service.sessions.writer import SessionWriter
from service.settings import TopicSettings

logger = logging.getLogger(__name__)

INSTANCE = f"{socket.gethostname()}:{os.getpid()}"
"""This process, as the ledger of ``once`` tools records who started them."""


class AbandonedError(Exception):
    """The owner is stopping and the invocation is at a committed boundary: leave it there."""


class ResultTooLargeError(Exception):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"result of {size} bytes exceeds the record limit of {limit} bytes")


@dataclass(slots=True)
class _Run:
    """What one command has produced so far and not yet submitted."""

    work: CommandWork
    command: ParsedCommand
    stored: StoredSession
    """The session as last written."""
    events: list[OutRecord]
    text: list[str]
    before: StoredSession
    """The session before the command (what a command that fails leaves)."""
    text_since: float = 0.0
    """When the oldest text in ``text`` came (``time.monotonic``)."""


class Invoker:
    def __init__(
        self,
        *,
        writer: SessionWriter,
        submit: Callable[[Outcome], None],
        durable: Callable[[], Awaitable[None]],
        stopping: Callable[[], bool],
        topics: TopicSettings,
        answers: Answers,
        state_max_bytes: int,
        result_max_bytes: int | None = None,
        metrics: Metrics | None = None,
        text_every_s: float = 0.0,
    ) -> None:
        self._metrics = metrics if metrics is not None else Metrics()
        self._text_every_s = text_every_s
        self._tracer = engine_tracer()
        self._writer = writer
        self._store = writer.store
        self._result_max_bytes = result_max_bytes
        self._submit = submit
        self._durable = durable
        self._stopping = stopping
        self._topics = topics
        self._answers = answers
        self._state_max_bytes = state_max_bytes

    async def run(
        self,
        work: CommandWork,
        command: ParsedCommand,
        agent: AgentDefinition,
        stored: StoredSession,
    ) -> None:
        """Run ``command`` on ``agent`` from the session as ``stored`` until the engine stops.

        Raises the engine's :class:`~service.agent.errors.EngineError` when it refuses the
        command, :class:`~service.sessions.writer.StateTooLargeError` or
        :class:`ResultTooLargeError` when what it made exceeds the record limit, and
        :class:`AbandonedError` when the owner is stopping and the run was left at a committed
        boundary; any other failure passes on as it is.
        """
        with self._metrics.inflight():
            await self._run(work, command, agent, stored)

    async def _run(
        self,
        work: CommandWork,
        command: ParsedCommand,
        agent: AgentDefinition,
        stored: StoredSession,
    ) -> None:
        invocation = Invocation(
            command_id=command.command_id,
            input=command.input,
            checkpointing=command.checkpointing,
            limits=command.limits,
            invocation_state=command.invocation_state,
            result_max_bytes=self._result_max_bytes,
            instance=INSTANCE,
        )
        run = _Run(work=work, command=command, stored=stored, events=[], text=[], before=stored)
        seq = stored.event_seq
        observe_step = self._metrics.observe_step
        step_started = time.perf_counter()
        text_every_s = self._text_every_s
        events = cast(
            "AsyncGenerator[Event, None]",
            run_invocation(
                agent, stored.state, invocation, cancel=work.cancel, tracer=self._tracer
            ),
        )
        try:
            async for event in events:
                if isinstance(event, ModelTextDelta):
                    if text_every_s:
                        now_s = time.monotonic()
                        if not run.text:
                            run.text_since = now_s
                        elif now_s - run.text_since >= text_every_s:
                            # A live display follows a long stream, not only its end.
                            run.text.append(event.text)
                            seq = self._flush_text(run, command, seq)
                            self._publish_progress(run, seq)
                            continue
                    run.text.append(event.text)
                    continue
                seq = self._flush_text(run, command, seq)
                if isinstance(event, Boundary):
                    data = {
                        "position": event.position,
                        "cycle_index": event.cycle_index,
                        "paused": False,
                    }
                    seq = self._event(run, command, seq, "checkpoint_reached", data)
                    step = Step(event.cycle_index, command.command_id, position=event.position)
                    outcome = self._commit_inflight(run, event.state, seq, step)
                    now = time.perf_counter()
                    observe_step(now - step_started)
                    step_started = now
                    # Nothing past a boundary (a tool's side effect above all) may happen before
                    # the boundary is committed, or a crash would replay a different future.
                    await self._durable()
                    if outcome.unwritten is not None:
                        # The broker refused the boundary; its fallback answered the command.
                        return
                    if self._stopping():
                        raise AbandonedError
                elif isinstance(event, ToolLedger):
                    # A once tool starts only once its start is committed; its result is
                    # committed as soon as it is in, not with the rest of the batch.
                    outcome = self._commit_inflight(run, event.state, seq)
                    if event.durable:
                        await self._durable()
                        if outcome.unwritten is not None:
                            return
                elif isinstance(event, Stopped):
                    tracing.stopped(work.span, event.result)
                    delivery = self._delivery(command.session_id)
                    self._commit_state(
                        run,
                        event.state,
                        delivery.finished(command.command_id).through(
                            commands_position(work.record, self._topics.commands)
                        ),
                        seq,
                        finished=work.record.origin,
                        result=event.result,
                    )
                    observe_step(time.perf_counter() - step_started)
                    return
                else:
                    seq = self._event(run, command, seq, *describe_event(event))
                    if isinstance(event, ToolStarted):
                        self._publish_progress(run, seq)
                    elif isinstance(event, InterruptRaised):
                        unknown = sum(i.name == OUTCOME_UNKNOWN for i in event.interrupts)
                        if unknown:
                            self._metrics.tool_outcome_unknown(unknown)
        finally:
            await events.aclose()

    def _commit_inflight(
        self, run: _Run, state: SessionState, seq: int, step: Step | None = None
    ) -> Outcome:
        """Commit a state whose in-flight marker names the running command; a cancel read
        later, by another owner, must know whether it covers that command. A boundary is a
        ``step`` (a new version); a ledger change of ``once`` tools is not."""
        delivery = self._delivery(run.work.session_id)
        published = delivery.started(run.work.record.timestamp_ms)
        return self._commit_state(run, state, published, seq, finished=None, result=None, step=step)

    def _commit_state(
        self,
        run: _Run,
        state: SessionState,
        delivery: Delivery,
        seq: int,
        *,
        finished: Origin | None,
        result: AgentResult | None,
        step: Step | None = None,
    ) -> Outcome:
        outcome = Outcome(
            fallback=self._answers.instead_of_refused(run.work, run.stored, run.before)
        )
        if result is not None and finished is not None:
            command = run.command
            checkpoint = result.checkpoint
            step = Step(
                state.cycle_index,
                command.command_id,
                position=checkpoint.position if checkpoint is not None else None,
                stop_reason=result.stop_reason,
            )
            record = result_record(
                self._topics.results,
                command.session_id,
                command.command_id,
                result,
                command.metadata,
                run.work.trace,
                max_bytes=self._state_max_bytes,
                version=_next_version(run.stored),
            )
            if record.value is not None and len(record.value) > self._state_max_bytes:
                raise ResultTooLargeError(len(record.value), self._state_max_bytes)
            outcome.records.append(record)
            outcome.finished.append(finished)
            outcome.results = 1
        # Checked before the state is written: a write the committer never gets would leave
        # the store ahead of the changelog.
        outcome.state = self._writer.write(state, seq, delivery, step=step)
        if result is not None:
            outcome.counted = functools.partial(self._count_result, run.command.type, result)
        outcome.records[:0] = run.events
        run.events = []
        stored = self._store.get(state.session_id)
        assert stored is not None
        run.stored = stored
        self._submit(outcome)
        return outcome

    def _delivery(self, session_id: str) -> Delivery:
        """The session's delivery records as last written (a cancel may have added to them
        since the invocation started)."""
        latest = self._store.get(session_id)
        return latest.delivery if latest is not None else Delivery()

    def _publish_progress(self, run: _Run, seq: int) -> None:
        """Commit the events so far now, not at the next boundary: a tool that runs for minutes
        shows as started while it runs.

        The session's last committed state is written again with them, unchanged but for its
        event sequence number, so a new owner never reuses a ``seq`` these events took.
        """
        if not run.events:
            return
        records, run.events = run.events, []
        write = self._writer.write(run.stored.state, seq)
        stored = self._store.get(run.stored.state.session_id)
        assert stored is not None
        run.stored = stored
        self._submit(Outcome(records=records, state=write))

    def _flush_text(self, run: _Run, command: ParsedCommand, seq: int) -> int:
        if not run.text:
            return seq
        text = "".join(run.text)
        run.text.clear()
        return self._event(run, command, seq, "text_delta", {"text": text})

    def _event(
        self, run: _Run, command: ParsedCommand, seq: int, kind: str, data: dict[str, Any]
    ) -> int:
        try:
            record = event_record(
                self._topics.events,
                command.session_id,
                command.command_id,
                seq + 1,
                kind,
                data,
                run.work.trace,
                version=_next_version(run.stored),
            )
        except ValidationError as exc:
            # Progress events are optional to consumers; one the contract cannot carry must not
            # cost the command its result.
            logger.warning(
                "session_id=<%s>, kind=<%s>, error=<%s> | progress event dropped",
                command.session_id,
                kind,
                exc.errors()[0]["msg"],
            )
            return seq
        if record.value is not None and len(record.value) > self._state_max_bytes:
            logger.warning(
                "session_id=<%s>, kind=<%s>, bytes=<%d> | progress event too large, dropped",
                command.session_id,
                kind,
                len(record.value),
            )
            return seq
        run.events.append(record)
        return seq + 1

    def _count_result(self, command_type: str, result: AgentResult) -> None:
        stop_reason = result.stop_reason
        error = result.error
        self._metrics.result(stop_reason, error.code if error is not None else None)
        outcome = _OUTCOMES.get(stop_reason, "ok")
        self._metrics.command(command_type, outcome)


def _next_version(stored: StoredSession) -> int:
    """The version the session's next step commits (what its events and result carry)."""
    return (stored.last_version or 0) + 1


_OUTCOMES: dict[str, str] = {"cancelled": "cancelled", "error": "error"}
"""Command outcome by the stop reason of its result; every other stop reason is ``ok``."""


def describe_event(event: object) -> tuple[str, dict[str, Any]]:
    """The kind and fields of the progress event that reports ``event`` on the events topic."""
    if isinstance(event, ModelMessage):
        return "model_message", {"message": event.message}
    if isinstance(event, ToolStarted):
        return "tool_started", {"tool_use_id": event.tool_use_id, "name": event.name}
    if isinstance(event, ToolFinished):
        return "tool_finished", {
            "tool_use_id": event.tool_use_id,
            "name": event.name,
            "status": event.status,
        }
    if isinstance(event, CheckpointReached):
        checkpoint = event.checkpoint
        return "checkpoint_reached", {
            "position": checkpoint.position,
            "cycle_index": checkpoint.cycle_index,
            "paused": True,
        }
    if isinstance(event, InterruptRaised):
        return "interrupt_raised", {"interrupts": [i.to_dict() for i in event.interrupts]}
    return type(event).__name__.lower(), {}
