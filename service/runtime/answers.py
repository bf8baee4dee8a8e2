"""The answers a record gets when it is not the engine's own result: an ``error`` result, a dead
letter, or both in place of an output the broker refused.

Guarantees: an ``error`` result is committed with its command's input offset and, when the
command has an id and the session a state to keep, with that state recording the command as
applied, so a re-read or re-published command is answered never again, and it echoes the
command's metadata, that of a record refused before it decoded included; a dead letter keeps the
original record (cut to fit one producer request) and is committed with its input offset. These
are the only places either is built.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from service.agent.state import SessionState
from service.observability.metrics import Metrics
from service.observability.tracing import from_headers, span
from service.runtime.records import RECORD_MAX_BYTES, ParsedCommand, dlq_record, failure_record
from service.runtime.work import CommandWork, InputRecord, Outcome, OutRecord, commands_position
from service.sessions.delivery import Delivery
from service.sessions.store import StoredSession
from service.sessions.writer import SessionWriter
from service.settings import TopicSettings
from service.wire.codec import refused_metadata
from service.wire.dlq import DLQ_HEADERS_DROPPED
from service.wire.errors import ErrorCode

logger = logging.getLogger(__name__)

FALLBACK_RESULT_MAX_BYTES = 16_384
"""Bound of the error result that replaces an output the broker refused: echoed metadata above
it is left out, so the replacement fits any topic a deployment could configure."""


class Answers:
    """Builds the ``error`` results and dead letters of one partition and hands them on."""

    def __init__(
        self,
        *,
        writer: SessionWriter,
        submit: Callable[[Outcome], None],
        topics: TopicSettings,
        metrics: Metrics | None = None,
        max_bytes: int = RECORD_MAX_BYTES,
    ) -> None:
        self._writer = writer
        self._store = writer.store
        self._submit = submit
        self._topics = topics
        self._metrics = metrics if metrics is not None else Metrics()
        self._max_bytes = max_bytes

    def error(
        self,
        work: CommandWork,
        code: ErrorCode,
        message: str,
        *,
        keeps: SessionState | None,
        seq: int = 0,
        max_bytes: int | None = None,
        rollback_to: int | None = None,
    ) -> None:
        """Answer ``work`` with an ``error`` result, committed with its input offset.

        ``keeps`` is the session state the answer leaves (``None``: the session keeps none and
        the answer is recognised by its committed offset only); it is written with the command
        marked applied and an event sequence number of at least ``seq``. When it is the state
        from before the command, ``rollback_to`` is that state's version: the versions the
        command's boundaries committed since are removed with it (their messages are no longer
        the session's). Nothing is counted or handed on when the answer cannot be built.
        """
        outcome = self._error(
            work, code, message, keeps=keeps, seq=seq, max_bytes=max_bytes, rollback_to=rollback_to
        )
        self._submit(outcome)

    def dead_letter(self, record: InputRecord, reason: str, code: ErrorCode) -> None:
        """Dead-letter ``record``, committed with its input offset."""
        self._submit(
            Outcome(
                records=[self._dead_letter(record, reason, code)],
                finished=[record.origin],
                replay_unsafe=True,
                counted=functools.partial(self._metrics.dlq, code),
            )
        )

    def instead_of_refused(
        self, work: CommandWork, before: StoredSession, before_command: StoredSession
    ) -> Callable[[BaseException], Outcome]:
        """What the committer writes when the broker refuses ``work``'s output for good: the
        command dead-lettered, a small ``internal`` error result, and the session back as
        ``before_command`` (its state before the command, the versions of the command's
        boundaries committed since taken back), written over ``before`` (its state when the
        refused output was made, the last on the changelog)."""

        def build(error: BaseException) -> Outcome:
            reason = f"the command's output was refused by the broker: {error}"
            # What the refused outcome wrote is not on the changelog: the next write is a
            # change of the state before it.
            self._store.put(work.session_id, before)
            outcome = self._error(
                work,
                "internal",
                reason,
                keeps=state_before(before_command, work.session_id),
                rollback_to=version_of(before_command),
                seq=before.event_seq,
                max_bytes=FALLBACK_RESULT_MAX_BYTES,
            )
            counted = outcome.counted
            assert counted is not None
            # The error result alone, when the broker refuses the dead letter too (a dlq topic
            # that takes less than the command's own record).
            alone = replace(outcome, records=list(outcome.records))
            outcome.records.insert(0, self._dead_letter(work.record, reason, "internal"))

            def counted_with_dead_letter() -> None:
                counted()
                self._metrics.dlq("internal")

            outcome.counted = counted_with_dead_letter
            outcome.fallback = lambda _: alone
            return outcome

        return build

    def _error(
        self,
        work: CommandWork,
        code: ErrorCode,
        message: str,
        *,
        keeps: SessionState | None,
        seq: int,
        max_bytes: int | None,
        rollback_to: int | None = None,
    ) -> Outcome:
        command_id = work.command_id
        outcome = Outcome(
            finished=[work.record.origin],
            results=1,
            replay_unsafe=True,
            counted=functools.partial(self._count_error, work.command_type, code),
        )
        outcome.records.append(
            failure_record(
                self._topics.results,
                work.session_id,
                command_id or "",
                code,
                message,
                self._metadata(work),
                _trace(work),
                max_bytes=max_bytes if max_bytes is not None else self._max_bytes,
            )
        )
        if command_id and keeps is not None:
            latest = self._store.get(work.session_id)
            delivery = latest.delivery if latest is not None else Delivery()
            event_seq = max(seq, latest.event_seq if latest is not None else 0)
            delivery = delivery.finished(command_id).through(
                commands_position(work.record, self._topics.commands)
            )
            outcome.state = self._writer.write(keeps, event_seq, delivery, rollback_to=rollback_to)
            outcome.replay_unsafe = False
        return outcome

    def _count_error(self, command_type: str, code: ErrorCode) -> None:
        self._metrics.command(command_type, "error")
        self._metrics.result("error", code)

    def _metadata(self, work: CommandWork) -> dict[str, Any] | None:
        """The metadata an error result echoes: the command's, also when it did not decode."""
        command = work.command
        if isinstance(command, ParsedCommand):
            return command.metadata
        if command is None and work.record.origin.topic == self._topics.commands:
            return refused_metadata(work.record.value)
        return None

    def _dead_letter(self, record: InputRecord, reason: str, code: ErrorCode) -> OutRecord:
        try:
            return dlq_record(self._topics.dlq, record, reason, code)
        except Exception as exc:  # noqa: BLE001 - a record must never defeat its own dead letter
            # Its key and value are bytes and go as they came; what else it holds is left out,
            # and the dead letter says how many of its headers.
            logger.warning(
                "topic=<%s>, offset=<%d>, error=<%s> | dead letter unbuildable with the record's "
                "headers: sent without them",
                record.origin.topic,
                record.origin.offset,
                exc,
            )
            bare = dlq_record(self._topics.dlq, replace(record, headers=[]), reason, code)
            dropped = (DLQ_HEADERS_DROPPED, str(len(record.headers)).encode())
            return replace(bare, headers=[*bare.headers, dropped])


def state_before(stored: StoredSession | None, session_id: str) -> SessionState:
    """The state a refused or failed command leaves: the session's from before the command,
    with no turn in flight (a session with none gets one that holds nothing but its id)."""
    state = (stored.state if stored is not None else SessionState(session_id=session_id)).snapshot()
    state.inflight = None
    return state


def version_of(stored: StoredSession | None) -> int:
    """The version ``stored`` is at (0 before the session's first)."""
    last = stored.last_version if stored is not None else None
    return last if last is not None else 0


def _trace(work: CommandWork) -> list[tuple[str, bytes]]:
    """The command's trace headers, from a span of its own if it failed before its span opened."""
    if work.trace is None:
        with span("cairn.command", from_headers(work.record.headers)) as trace:
            work.trace = trace.headers()
    return work.trace
