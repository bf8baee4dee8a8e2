"""The path of one record of a partition, from what it decoded to (or why it did not) to its one
answer: dedupe, cancel coverage, the engine, the outcome for the committer.

Guarantees: a record is answered at most once, and every record the session queues hand over is
answered (or left to the next owner at a committed boundary); a command its session has applied
is never answered again, one a cancel covers never reaches the engine, and an unexpected failure
is answered ``internal`` (dead-lettered when even that cannot be built) without stopping the
partition; a failure of the partition's commits is no record's and passes. Which answer wins is
the order of :meth:`CommandPath.handle`, stated in its docstring.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import cast

from aiokafka.errors import InvalidProducerEpoch, ProducerFenced

from service.agent import tracing
from service.agent.definition import AgentDefinition
from service.agent.errors import EngineError
from service.agent.state import SessionState
from service.observability.logs import log_context
from service.observability.metrics import Metrics
from service.observability.tracing import current_span, from_headers, span
from service.runtime.answers import Answers, state_before, version_of
from service.runtime.bad_input import classify_refusal, foreign_agent_refusal, no_agent_refusal
from service.runtime.cancels import CancelDesk
from service.runtime.faults import FaultPoints, InjectedCommitError
from service.runtime.forks import SessionVersions
from service.runtime.invoker import AbandonedError, Invoker, ResultTooLargeError
from service.runtime.records import session_key
from service.runtime.txn_stream import CommitFailedError, GroupFencedError
from service.runtime.work import CommandWork, InputRecord, Origin, Outcome, commands_position
from service.sessions.store import SessionStore, StoredSession
from service.sessions.table import StoreBrokenError
from service.sessions.writer import StateTooLargeError
from service.settings import TopicSettings
from service.wire.commands import CancelCommand
from service.wire.errors import ERROR_CODES, ErrorCode, WireError

logger = logging.getLogger(__name__)

NOT_THE_RECORDS = (
    StoreBrokenError,
    CommitFailedError,
    GroupFencedError,
    InjectedCommitError,
    ProducerFenced,
    InvalidProducerEpoch,
)
"""Failures of the partition's commits and of its local store, which restart the owner instead
of answering a record."""

STATE_TOO_LARGE: ErrorCode = "limit_exceeded"
"""Error code of a command whose session state or result outgrew ``state_record_max_bytes``."""

_REASON_MAX = 500


class CommandPath:
    """Takes each record of one partition's session queues to its answer, one step at a time.

    The cancel desk keeps what cancels cover and answers them, the invoker runs the engine and
    commits what it makes, and :class:`Answers` builds the ``error`` results and dead letters;
    the order in which they are asked, and what a failure of each turns into, is here.
    """

    def __init__(
        self,
        *,
        store: SessionStore,
        cancels: CancelDesk,
        invoker: Invoker,
        answers: Answers,
        submit: Callable[[Outcome], None],
        agents: Mapping[str, AgentDefinition],
        topics: TopicSettings,
        versions: SessionVersions | None = None,
        faults: FaultPoints | None = None,
        metrics: Metrics | None = None,
        owns: Callable[[str], bool] | None = None,
        settled: Callable[[Origin], Awaitable[None]] | None = None,
    ) -> None:
        self._owns = owns
        """Whether a session id belongs to this partition (``None``: every one does)."""
        self._settled = settled
        """Waits until every record of a partition before the one given is finished."""
        self._versions = versions
        self._store = store
        self._cancels = cancels
        self._invoker = invoker
        self._answers = answers
        self._submit = submit
        self._agents = agents
        self._topics = topics
        self._faults = faults
        self._metrics = metrics if metrics is not None else Metrics()

    async def handle(self, work: CommandWork) -> None:
        """Handle one record of a session queue: the first of these that applies answers it.
        (A record of a session another partition owns is refused before them, with no state
        of it read or written here, once every earlier record of its partition is finished.)

        1. The partition's commit failed (fencing, a failed transaction): that is no record's
           failure. It passes, and the next owner reads the record again.
        2. A cancel: the cancel desk answers it once, saying what it covered (one read with the
           id of a command of its session answered, handled or queued is a repeat of it).
        3. A record that did not decode: an ``error`` result with the wire's code (the engine's,
           for a refused checkpoint resume), or nothing new when it was answered before. A record
           that names no session and id (one over the record limit is refused unread, so names
           none) never gets here: :meth:`undecodable` dead-letters it as it is read.
        4. A delete: the session's records are tombstoned and the delete answered (unless the
           session applied its id, or was handling or had queued a command with it when the
           delete was read: then as in 5).
        5. A command the session has applied (a redelivery): only its offset is finished.
           A ``history`` or ``fork`` is then answered by :class:`SessionVersions` (a fork is
           refused ``session_exists`` or ``version_unavailable``, or writes the new session).
        6. A command a cancel covers: answered ``cancelled``; the engine never sees it.
        7. The engine: its result; an ``error`` result with the engine's code when it refuses
           the command (an agent not hosted here is ``unknown_agent``); ``limit_exceeded`` when
           the state or result outgrows the record limit; ``internal`` when it fails. An owner
           stopping leaves the command at its last committed boundary, unanswered, for the next
           owner to continue.
        8. Any other failure on the way: ``internal``, unless the record was answered before
           its handling began (only its offset is finished) or by its handling (nothing more);
           a dead letter when even the ``error`` result cannot be built.

        Every answer goes to the committer with the record's offset; an ``error`` result leaves
        the session as it was before the command, with the command recorded as applied. The
        session stays decoded in memory meanwhile, however large (:meth:`SessionStore.in_use`).
        """
        if work.foreign:
            await self._refuse_foreign(work)
            return
        with self._store.in_use(work.session_id):
            # A large session is decoded off the event loop before its first read below.
            await self._store.prefetch(work.session_id)
            await self._handle(work)

    async def _refuse_foreign(self, work: CommandWork) -> None:
        """Refuse a record of a session another partition owns. No state here may record it,
        so only the committed offsets recognise it read again: it is answered once every
        earlier record of its partition is finished (``settled``), in a commit that moves the
        offsets past it."""
        origin = work.record.origin
        try:
            if self._settled is not None:
                await self._settled(origin)
            assert work.error is not None
            self._answers.error(work, work.error.code, work.error.reason, keeps=None)
        except NOT_THE_RECORDS:
            raise
        except Exception as exc:  # noqa: BLE001 - one record's failure must stay its own
            self.record_failed(work.record, exc)
        finally:
            if origin.topic == self._topics.control:
                self._cancels.ledger.answered(origin.offset)

    async def _handle(self, work: CommandWork) -> None:
        origin = work.record.origin
        command = work.command
        applied = self._applied(work)
        try:
            if self._faults is not None:
                self._faults.handling(work.command_id)
            with _scope(work):
                # 2. A cancel.
                if isinstance(command, CancelCommand):
                    await self._cancels.left_mid_turn(work, command)
                    self._cancels.answer(work, command)
                    return
                # 3. Decoded no further than its session and id.
                if command is None:
                    self._cancels.release(work.session_id)
                    try:
                        stored = self._store.get(work.session_id)
                        work.error = classify_refusal(work, stored, self._agents)
                        if applied:
                            self._duplicate(work)
                        else:
                            self._reject(work, stored, work.error)
                    finally:
                        if origin.topic == self._topics.control:
                            self._cancels.ledger.answered(origin.offset)
                    return
                # 4. A delete (one whose id the session applied, or had read and not answered
                # when the delete was read, is a repeat, as in 5).
                if command.type == "delete":
                    self._cancels.release(work.session_id)
                    if self._cancels.repeat(work) or applied:
                        self._duplicate(work)
                    else:
                        await self._cancels.delete(work, command)
                    return
                # 5. Dedupe. A repeat answers nothing, so the cancels' answers held so far keep
                # waiting for the covered commands queued behind it (a takeover reads again the
                # commands answered since the committed offsets, ahead of those it must cancel).
                if applied:
                    self._duplicate(work)
                    return
                if command.type in ("history", "fork"):
                    self._cancels.release(work.session_id)
                    await self._session_versions().answer(work, command)
                    return
                # 6. Cancel coverage.
                if self._cancels.covered(work, command):
                    self._cancels.skip(work, command)
                    return
                # 7. The engine, after the cancels' answers held so far went out. The invoker
                # hands every boundary and the result to the committer as it goes.
                self._cancels.release(work.session_id)
                stored = self._store.get(work.session_id)
                if (foreign := foreign_agent_refusal(command, stored)) is not None:
                    self._reject(work, stored, foreign)
                    return
                agent_name = command.agent or (stored.state.agent if stored is not None else None)
                agent = self._agents.get(agent_name) if agent_name else None
                if agent is None:
                    self._reject(work, stored, no_agent_refusal(command, agent_name))
                    return
                work.span.set(tracing.AGENT, agent.name)
                before = stored or StoredSession(
                    SessionState(session_id=command.session_id, agent=agent.name)
                )
                try:
                    with self._cancels.running(work):
                        await self._invoker.run(work, command, agent, before)
                except EngineError as exc:
                    self._reject(work, before, exc)
                except AbandonedError:
                    # Its offset stays unfinished: the next owner redelivers it and the engine
                    # goes on from the boundary just committed.
                    self._metrics.command(command.type, "abandoned")
                    logger.info(
                        "session_id=<%s>, command_id=<%s> | stopping: invocation left at its "
                        "boundary",
                        command.session_id,
                        command.command_id,
                    )
                except (StateTooLargeError, ResultTooLargeError) as exc:
                    logger.error(
                        "session_id=<%s>, command_id=<%s>, error=<%s> | command failed",
                        command.session_id,
                        command.command_id,
                        exc,
                    )
                    self._fail(work, before, STATE_TOO_LARGE, str(exc))
                except NOT_THE_RECORDS:
                    raise
                except Exception as exc:
                    logger.exception(
                        "session_id=<%s>, command_id=<%s> | command failed unexpectedly",
                        command.session_id,
                        command.command_id,
                    )
                    self._fail(work, before, "internal", f"{type(exc).__name__}: {exc}")
                except asyncio.CancelledError:
                    # Only a cancel of this task (the owner stopping) may leave the command
                    # unanswered; a CancelledError leaked by a library's inner timeout is a
                    # failure like any other.
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise
                    logger.exception(
                        "session_id=<%s>, command_id=<%s> | command failed with a stray cancel",
                        command.session_id,
                        command.command_id,
                    )
                    self._fail(
                        work, before, "internal", "CancelledError: not a cancel of the command"
                    )
        except NOT_THE_RECORDS:  # 1. the partition's, not the record's
            raise
        except Exception as exc:  # noqa: BLE001 - 8. one record's failure must stay its own
            self._failed(work, exc, applied_before=applied)

    def _session_versions(self) -> SessionVersions:
        if self._versions is None:
            raise RuntimeError("this path answers no history or fork commands")
        return self._versions

    def undecodable(self, record: InputRecord, error: WireError) -> CommandWork | None:
        """Take a record that did not decode as it is read: the work that answers it in its
        session's queue when it names its session and id (step 3 of :meth:`handle`; one of a
        session another partition owns is refused before the steps, without its state), else
        ``None``: dead-lettered with the wire's reason and code when it names none."""
        # The work keeps the error, not its tracebacks (its own, and the one of the error it
        # replaced): they hold the frames that read the record, whose locals hold the work, in
        # a cycle only the collector frees.
        error.__traceback__ = error.__context__ = error.__cause__ = None
        if error.answerable and error.session_id is not None:
            work = CommandWork(record, error.session_id, None, error)
            if self._owns is None or self._owns(error.session_id):
                return work
            # Another partition's session: no state of it is read or written here (its owner
            # holds it); the committed offset recognises a replay (see :meth:`handle`).
            logger.warning(
                "session_id=<%s>, command_id=<%s>, reason=<%s> | record of a session another "
                "partition owns, refused",
                error.session_id,
                error.command_id,
                error.reason,
            )
            work.foreign = True
            return work
        if record.origin.topic == self._topics.control:
            logger.warning(
                "key=<%s>, offset=<%d>, reason=<%s> | undecodable control record sent to the dlq",
                session_key(record),
                record.origin.offset,
                error.reason,
            )
            self._metrics.command("cancel", "dlq")
        else:
            logger.warning(
                "key=<%s>, offset=<%d>, reason=<%s> | undecodable command sent to the dlq",
                session_key(record),
                record.origin.offset,
                error.reason,
            )
            self._metrics.command("other", "dlq")
        self._answers.dead_letter(record, error.reason, error.code)
        return None

    def record_failed(self, record: InputRecord, exc: Exception) -> None:
        """Dead-letter a record whose routing failed before it reached a session queue; one
        that cannot even be dead-lettered is skipped (logged), never left to stop the
        partition."""
        where = (session_key(record), record.origin.topic, record.origin.offset)
        try:
            self._answers.dead_letter(record, _reason(exc), "internal")
        except Exception as failure:
            logger.error(
                "key=<%s>, topic=<%s>, offset=<%d>, failure=<%r> | record failed unexpectedly "
                "and its dead letter too: skipped",
                *where,
                failure,
                exc_info=exc,
            )
            self._submit(Outcome(finished=[record.origin], replay_unsafe=True))
            return
        logger.error(
            "key=<%s>, topic=<%s>, offset=<%d> | record failed unexpectedly, sent to the dlq",
            *where,
            exc_info=exc,
        )

    def _failed(self, work: CommandWork, exc: Exception, *, applied_before: bool) -> None:
        """Answer ``work`` after an unexpected failure (step 8 of :meth:`handle`)."""
        logger.error(
            "session_id=<%s>, command_id=<%s>, offset=<%d> | record failed unexpectedly",
            work.session_id,
            work.command_id,
            work.record.origin.offset,
            exc_info=exc,
        )
        if self._applied(work):
            if applied_before:
                self._submit(Outcome(finished=[work.record.origin]))
            # Otherwise its handling answered it, finishing its offset, before failing.
            return
        stored = self._store.get(work.session_id)
        reason = _reason(exc)
        try:
            keeps = None
            if stored is not None:
                keeps = stored.state
                if keeps.inflight is not None and keeps.inflight.command_id == work.command_id:
                    # Its turn ends here: a later command must not continue from its boundary.
                    keeps = keeps.snapshot()
                    keeps.inflight = None
            self._answers.error(work, "internal", reason, keeps=keeps)
        except Exception:  # noqa: BLE001 - the dead letter below needs nothing of the command
            logger.warning(
                "session_id=<%s>, command_id=<%s> | error result unbuildable, record dead-lettered",
                work.session_id,
                work.command_id,
            )
            self._answers.dead_letter(work.record, reason, "internal")

    def _reject(
        self, work: CommandWork, stored: StoredSession | None, error: Exception | None
    ) -> None:
        """Answer a command refused before or by the engine with the refusal's code."""
        code: ErrorCode = "internal"
        message = str(error)
        if isinstance(error, EngineError):
            code, message = _known_code(error.code), error.message
        elif isinstance(error, WireError):
            code, message = error.code, error.reason
        logger.info(
            "session_id=<%s>, code=<%s>, reason=<%s> | command rejected",
            work.session_id,
            code,
            message,
        )
        self._fail(work, stored, code, message)

    def _fail(
        self, work: CommandWork, stored: StoredSession | None, code: ErrorCode, message: str
    ) -> None:
        """Answer with an ``error`` result; the session keeps its state from before the command
        (``stored``), with no turn in flight."""
        seq = stored.event_seq if stored is not None else 0
        work.span.set(tracing.ERROR_CODE, code)
        work.span.failed(f"{code}: {message}")
        self._answers.error(
            work,
            code,
            message,
            keeps=state_before(stored, work.session_id),
            seq=seq,
            rollback_to=version_of(stored),
        )

    def _duplicate(self, work: CommandWork) -> None:
        # Refusals are remembered too, so a re-read or re-published refused command is not
        # answered a second time.
        logger.info(
            "session_id=<%s>, command_id=<%s> | duplicate command, already answered",
            work.session_id,
            work.command_id,
        )
        self._metrics.command(work.command_type, "duplicate")
        self._submit(Outcome(finished=[work.record.origin]))

    def _applied(self, work: CommandWork) -> bool:
        """The session's state lists the record's command as applied (answered), or the record
        stands before the newest of the session's commands answered."""
        command_id = work.command_id
        if not command_id:
            return False
        stored = self._store.get(work.session_id)
        if stored is None:
            return False
        position = commands_position(work.record, self._topics.commands)
        return stored.delivery.answered(command_id) or (
            position is not None and stored.delivery.read_before(*position)
        )


@contextmanager
def _scope(work: CommandWork) -> Iterator[None]:
    """The command's span (parented by its record's trace context) and log context, so its
    outputs carry the trace and its log lines its ids."""
    origin = work.record.origin
    attributes: dict[str, str | int] = {
        tracing.SESSION_ID: work.session_id,
        tracing.COMMAND_TYPE: work.command_type,
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.destination.name": origin.topic,
        "messaging.destination.partition.id": str(origin.partition),
        "messaging.kafka.offset": origin.offset,
    }
    if work.command_id:
        attributes[tracing.COMMAND_ID] = work.command_id
    with span("cairn.command", from_headers(work.record.headers), attributes=attributes) as trace:
        work.trace = trace.headers()
        work.span = current_span()
        try:
            with log_context(
                session_id=work.session_id, command_id=work.command_id, trace_id=trace.trace_id
            ):
                yield
        finally:
            work.span = tracing.NO_SPAN  # ended: nothing more may be added to it


def _known_code(code: str) -> ErrorCode:
    return cast("ErrorCode", code) if code in ERROR_CODES else "internal"


def _reason(exc: Exception) -> str:
    return f"unexpected failure: {type(exc).__name__}: {exc}"[:_REASON_MAX]
