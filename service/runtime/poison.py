"""The last line against poison records: an unexpected failure while handling one input record.

Guarantee: such a failure never stops the partition; the record is answered once (an ``error``
result with code ``internal`` naming its session, or, when even that cannot be built, a dead
letter with the reason), committed with its offset, and its traceback is logged once.
Failures of the commit itself (fencing, a failed transaction) are not the record's: they pass.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiokafka.errors import InvalidProducerEpoch, ProducerFenced

from service.observability.metrics import Metrics
from service.observability.tracing import from_headers, span
from service.runtime.faults import FaultPoints, InjectedCommitError
from service.runtime.records import dlq_record, failure_record, session_key
from service.runtime.txn_stream import CommitFailedError, GroupFencedError
from service.runtime.work import CommandWork, InputRecord, Outcome, OutRecord
from service.sessions.store import StoredSession
from service.sessions.writer import SessionWriter
from service.settings import TopicSettings
from service.wire.errors import WireError

logger = logging.getLogger(__name__)

Handler = Callable[[CommandWork], Awaitable[None]]

NOT_THE_RECORDS = (
    CommitFailedError,
    GroupFencedError,
    InjectedCommitError,
    ProducerFenced,
    InvalidProducerEpoch,
)
"""Failures of the partition's commits, which restart the owner instead of answering a record."""

_REASON_MAX = 500


class PoisonGuard:
    """Answers the record whose handling failed unexpectedly, so the next one can be handled."""

    def __init__(
        self,
        *,
        writer: SessionWriter,
        submit: Callable[[Outcome], None],
        topics: TopicSettings,
        faults: FaultPoints | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._writer = writer
        self._store = writer.store
        self._submit = submit
        self._topics = topics
        self._faults = faults
        self._metrics = metrics if metrics is not None else Metrics()

    def wrap(self, handler: Handler) -> Handler:
        """The session-queue handler, with any unexpected failure answered as ``internal``."""

        async def handle(work: CommandWork) -> None:
            answered_before = self._answered(work)
            try:
                if self._faults is not None:
                    self._faults.handling(_command_id(work))
                await handler(work)
            except NOT_THE_RECORDS:
                raise
            except Exception as exc:  # noqa: BLE001 - one record's failure must stay its own
                self.command_failed(work, exc, answered_before=answered_before)

        return handle

    def command_failed(
        self, work: CommandWork, exc: Exception, *, answered_before: bool = False
    ) -> None:
        """Answer ``work`` with an ``internal`` error (a dead letter if even that fails).

        ``answered_before`` says the command was applied before its handling began (a
        redelivery): then only its offset is left to finish.
        """
        command_id = _command_id(work)
        logger.error(
            "session_id=<%s>, command_id=<%s>, offset=<%d> | record failed unexpectedly",
            work.session_id,
            command_id,
            work.record.origin.offset,
            exc_info=exc,
        )
        if self._answered(work):
            if answered_before:
                self._submit(Outcome(finished=[work.record.origin]))
            # Otherwise its handling answered it, finishing its offset, before failing.
            return
        stored = self._store.get(work.session_id)
        reason = _reason(exc)
        try:
            outcome = self._error_result(work, command_id, stored, reason)
        except Exception:  # noqa: BLE001 - the dead letter below needs nothing of the command
            logger.warning(
                "session_id=<%s>, command_id=<%s> | error result unbuildable, record dead-lettered",
                work.session_id,
                command_id,
            )
            self.record_failed(work.record, exc, logged=True)
            return
        self._metrics.command(_command_type(work), "error")
        self._metrics.result("error", "internal")
        self._submit(outcome)

    def record_failed(self, record: InputRecord, exc: Exception, *, logged: bool = False) -> None:
        """Dead-letter a record whose routing failed before it reached a session queue."""
        if not logged:
            logger.error(
                "key=<%s>, topic=<%s>, offset=<%d> | record failed unexpectedly, sent to the dlq",
                session_key(record),
                record.origin.topic,
                record.origin.offset,
                exc_info=exc,
            )
        self._metrics.dlq("internal")
        self._submit(
            Outcome(
                records=[dlq_record(self._topics.dlq, record, _reason(exc), "internal")],
                finished=[record.origin],
                replay_unsafe=True,
            )
        )

    def _answered(self, work: CommandWork) -> bool:
        command_id = _command_id(work)
        stored = self._store.get(work.session_id)
        return (
            stored is not None and command_id is not None and stored.delivery.answered(command_id)
        )

    def _error_result(
        self, work: CommandWork, command_id: str | None, stored: StoredSession | None, reason: str
    ) -> Outcome:
        metadata = getattr(work.command, "metadata", None)
        record: OutRecord = failure_record(
            self._topics.results,
            work.session_id,
            command_id or "",
            "internal",
            reason,
            metadata if isinstance(metadata, dict) else None,
            _trace(work),
        )
        outcome = Outcome(
            records=[record], finished=[work.record.origin], results=1, replay_unsafe=True
        )
        if stored is not None and command_id:
            state = stored.state
            if state.inflight is not None and state.inflight.command_id == command_id:
                # Its turn ends here: a later command must not continue from its boundary.
                state = state.snapshot()
                state.inflight = None
            delivery = stored.delivery.finished(command_id)
            outcome.state = self._writer.write(state, stored.event_seq, delivery)
            outcome.replay_unsafe = False
        return outcome


def _command_id(work: CommandWork) -> str | None:
    command_id = getattr(work.command, "command_id", None)
    if isinstance(command_id, str):
        return command_id
    return work.error.command_id if isinstance(work.error, WireError) else None


def _trace(work: CommandWork) -> list[tuple[str, bytes]]:
    """The command's trace headers, from a span of its own if it failed before its span opened."""
    if work.trace is None:
        with span("cairn.command", from_headers(work.record.headers)) as trace:
            work.trace = trace.headers()
    return work.trace


def _command_type(work: CommandWork) -> str:
    kind = getattr(work.command, "type", None)
    return kind if isinstance(kind, str) else "other"


def _reason(exc: Exception) -> str:
    return f"unexpected failure: {type(exc).__name__}: {exc}"[:_REASON_MAX]
