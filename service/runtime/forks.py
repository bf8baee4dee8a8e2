"""The ``history`` and ``fork`` commands: a session's versions listed, and a new session started
from one of them.

Guarantees: a ``history`` answer lists the versions the session's state keeps, newest first, as
committed no later than the answer itself (it is committed after every earlier write of the
session). A ``fork`` is addressed to the new session, so the owner of the new session's
partition is its one writer: it reads the source's committed records from the sessions topic
(whatever partition they are on; a version's records never change once committed), and
commits the new session's records, its result and the command's offset in one transaction. A
fork into a session that exists is refused ``session_exists``; one from a version not kept
(never reached, compacted away or deleted, or a source that does not exist) is refused
``version_unavailable``; a refusal records only its command id, never a conversation. The
source is never written. A ``history`` records its command id in a session that has state.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from service.agent.errors import EngineError, SessionExistsError, VersionUnavailableError
from service.agent.state import SessionState
from service.agent.types import AgentResult, Message
from service.observability.metrics import Metrics
from service.runtime.answers import Answers, state_before
from service.runtime.records import ParsedCommand, history_record, result_record
from service.runtime.work import CommandWork, Origin, Outcome, OutRecord, commands_position
from service.sessions import history
from service.sessions.delivery import Delivery
from service.sessions.store import SessionStore, StoredSession
from service.sessions.versions import HISTORY_PAGE_MAX, Step, page, state_at
from service.sessions.writer import SessionWriter
from service.settings import TopicSettings
from service.wire.errors import ErrorCode

logger = logging.getLogger(__name__)


SessionRecords = Callable[[str], Awaitable[dict[bytes, bytes]]]
"""Every committed record of a session on the sessions topic, by key."""


def exists(stored: StoredSession | None) -> bool:
    """The session has a conversation or a version (a state that only remembers command ids
    does not count: a fork may still create it)."""
    return stored is not None and stored.exists


def refuse_existing(stored: StoredSession | None, target: str) -> None:
    """Raise :class:`SessionExistsError` when the fork's target exists."""
    if exists(stored):
        raise SessionExistsError(f"session {target!r} already exists")


def source_state(
    records: dict[bytes, bytes], source: str, version: int, target: str
) -> tuple[SessionState, dict[str, Any]]:
    """The state of ``source`` at ``version`` as session ``target``, and that version's entry;
    raises :class:`VersionUnavailableError` when the version is not kept."""
    head = records.get(source.encode())
    if head is None:
        raise VersionUnavailableError(f"session {source!r} has no state")
    key = history.version_key(source, version)
    if key not in records or not _kept(head, version):
        raise VersionUnavailableError(
            f"version {version} of session {source!r} is not kept (never reached, compacted "
            "away or deleted)",
        )
    try:
        found, _ = history.load(key, records)
        body, _ = history.load(history.body_key(source, version), records)
        count = int(body["messages"])
        before_tail = [
            history.load(history.message_key(source, i), records)[0]
            for i in range(max(0, count - 1))
        ]
        state = state_at(body, before_tail, target)
    except (history.HistoryDecodeError, VersionUnavailableError, KeyError) as exc:
        raise VersionUnavailableError(f"version {version} of session {source!r}: {exc}") from exc
    return state, found


class SessionVersions:
    """Answers ``history`` and ``fork`` commands of one partition."""

    def __init__(
        self,
        *,
        store: SessionStore,
        writer: SessionWriter,
        answers: Answers,
        submit: Callable[[Outcome], None],
        topics: TopicSettings,
        session_records: SessionRecords,
        max_bytes: int,
        metrics: Metrics | None = None,
        settled: Callable[[Origin], Awaitable[None]] | None = None,
    ) -> None:
        self._settled = settled
        self._store = store
        self._writer = writer
        self._answers = answers
        self._submit = submit
        self._topics = topics
        self._session_records = session_records
        self._max_bytes = max_bytes
        self._metrics = metrics if metrics is not None else Metrics()

    async def answer(self, work: CommandWork, command: ParsedCommand) -> None:
        """Answer a ``history`` or a ``fork``."""
        if command.type == "history":
            await self.history(work, command)
        else:
            await self.fork(work, command)

    async def history(self, work: CommandWork, command: ParsedCommand) -> None:
        """Answer a page of the session's versions (none for a session without state), and
        record the command as applied in the session's state, so it is answered once even when
        it is published again, and a cancel naming it later finds it answered. A session
        without state is left without (a read makes none): nothing would recognise its record
        read again, so it is answered once every earlier record of its partition is finished,
        in a commit that moves the offsets past it (``settled``)."""
        stored = self._store.get(command.session_id)
        entries = stored.versions if stored is not None else []
        limit = min(int(command.options.get("limit") or HISTORY_PAGE_MAX), HISTORY_PAGE_MAX)
        listed, next_before = page(entries, limit, command.options.get("before"))
        record = history_record(
            self._topics.results,
            command.session_id,
            command.command_id,
            versions=listed,
            next_before=next_before,
            oldest_kept=int(entries[0]["version"]) if entries else None,
            version=stored.last_version if stored is not None else None,
            metadata=command.metadata,
            headers=work.trace,
            max_bytes=self._max_bytes,
        )
        self._metrics.command(command.type, "ok")
        if stored is None:
            # A read makes no session: answered once because its offset commits with it.
            if self._settled is not None:
                await self._settled(work.record.origin)
            self._submit(
                Outcome(
                    records=[record], finished=[work.record.origin], results=1, replay_unsafe=True
                )
            )
            return
        write = self._writer.write(
            state_before(stored, command.session_id),
            stored.event_seq,
            stored.delivery.applying(command.command_id).through(
                commands_position(work.record, self._topics.commands)
            ),
        )
        self._submit(
            Outcome(records=[record], state=write, finished=[work.record.origin], results=1)
        )

    async def fork(self, work: CommandWork, command: ParsedCommand) -> None:
        """Create ``command.session_id`` from the source's version, or refuse."""
        target = command.session_id
        source = str(command.options["source_session_id"])
        version = int(command.options["version"])
        stored = self._store.get(target)
        try:
            refuse_existing(stored, target)
            records = await self._session_records(source)
            state, found = source_state(records, source, version, target)
        except (SessionExistsError, VersionUnavailableError) as exc:
            logger.info(
                "session_id=<%s>, source=<%s>, version=<%d>, code=<%s> | fork refused",
                target,
                source,
                version,
                exc.code,
            )
            # Recorded as any refusal is (answered once even when published again); a state
            # that holds only command ids is no session, so a later fork may still create it.
            self._answers.error(work, _code(exc), exc.message, keeps=state_before(stored, target))
            return
        self._write_fork(work, command, stored, state, (source, version), found)

    def _result_record(
        self,
        work: CommandWork,
        command: ParsedCommand,
        result: AgentResult,
        origin: tuple[str, int],
    ) -> OutRecord:
        return result_record(
            self._topics.results,
            command.session_id,
            command.command_id,
            result,
            command.metadata,
            work.trace,
            max_bytes=self._max_bytes,
            version=1,
            forked_from=origin,
        )

    def _write_fork(
        self,
        work: CommandWork,
        command: ParsedCommand,
        stored: StoredSession | None,
        state: SessionState,
        origin: tuple[str, int],
        found: dict[str, Any],
    ) -> None:
        delivery = stored.delivery if stored is not None else Delivery()
        result = fork_result(state)
        step = Step(
            state.cycle_index,
            command.command_id,
            position=state.checkpoint.position if state.checkpoint is not None else None,
            stop_reason=result.stop_reason,
            forked_from=origin,
        )
        record = self._result_record(work, command, result, origin)
        if len(record.value or b"") > self._max_bytes and result.message is not None:
            # The message is the state's too, so nothing is lost: the fork is still answered.
            result.message = None
            record = self._result_record(work, command, result, origin)
        seq = stored.event_seq if stored is not None else 0
        # The target has no version (else it exists): this write is its version 1.
        delivery = delivery.finished(command.command_id).through(
            commands_position(work.record, self._topics.commands)
        )
        write = self._writer.write(state, seq, delivery, step=step)
        logger.info(
            "session_id=<%s>, source=<%s>, version=<%d>, at=<%s> | forked",
            command.session_id,
            origin[0],
            origin[1],
            found.get("position") or found.get("stop_reason"),
        )
        self._metrics.command(command.type, "ok")
        self._submit(
            Outcome(records=[record], state=write, finished=[work.record.origin], results=1)
        )


def fork_result(state: SessionState) -> AgentResult:
    """The engine-shaped result of a fork: the pause it is at (resume it as any pause), or
    ``end_turn`` when the version was at rest, with the message the source's result there
    carried (the tool calls the pause waits on, or the last answer)."""
    pending = state.pending
    message = _pause_message(state)
    if state.checkpoint is not None:
        return AgentResult(
            "checkpoint", message, checkpoint=state.checkpoint, state=state.agent_state
        )
    # Answered interrupts stay in the state until their batch completes; the source's result
    # listed only those still waiting, and so does the fork's (answer every id it lists).
    open_ = [i for i in pending.interrupts if i.response is None] if pending is not None else []
    if open_:
        return AgentResult("interrupt", message, interrupts=open_, state=state.agent_state)
    return AgentResult("end_turn", message, state=state.agent_state)


def _pause_message(state: SessionState) -> Message | None:
    """The assistant message whose tool calls a pause waits on, else the conversation's last
    assistant message (an after_tools pause's tool calls, or the turn's answer)."""
    if state.pending is not None:
        return state.pending.assistant_message
    for message in reversed(state.messages):
        if message.get("role") == "assistant":
            return message
    return None


def _kept(head: bytes, version: int) -> bool:
    """The head names ``version`` among those kept (a version record outside that range is a
    leftover, e.g. of a write by a release that kept no versions)."""
    try:
        index = history.unpack(head)[0].get("history") or {}
        first, last = index.get("versions") or (0, -1)
        return int(first) <= version <= int(last)
    except (ValueError, TypeError, AttributeError, zlib.error):
        return False


def _code(error: EngineError) -> ErrorCode:
    return "session_exists" if isinstance(error, SessionExistsError) else "version_unavailable"
