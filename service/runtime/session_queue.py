"""Per-session serial queues: one worker per busy session, different sessions concurrently.

Guarantee: the commands of one session are handled one at a time, in the order they were put;
after :meth:`SessionQueues.close`, or once the task group ends, no queued command starts
(running ones may finish) and what is put is left for the next owner; a command
whose handler ends in a ``CancelledError`` that is not a cancel of the worker does not stop the
commands queued behind it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from service.runtime.work import CommandWork

logger = logging.getLogger(__name__)

Handler = Callable[[CommandWork], Awaitable[None]]


class SessionQueues:
    def __init__(
        self, task_group: asyncio.TaskGroup, handler: Handler, *, track_reads: bool = False
    ) -> None:
        self._task_group = task_group
        self._handler = handler
        self._queues: dict[str, deque[CommandWork]] = {}
        self._handling: dict[str, CommandWork] = {}
        """By session, the command its handler is on."""
        self._reads: dict[str, dict[str, int]] | None = {} if track_reads else None
        """With ``track_reads``: by session, the newest offset of each input topic put here."""
        self._running = 0
        self._closed = False
        self._idle = asyncio.Event()
        self._idle.set()

    def put(self, work: CommandWork) -> None:
        if self._closed:
            return
        if self._reads is not None:
            # Kept in the order of each session's newest read (see forget_passed).
            origin = work.record.origin
            reads = self._reads.pop(work.session_id, None) or {}
            reads[origin.topic] = origin.offset
            self._reads[work.session_id] = reads
        queue = self._queues.get(work.session_id)
        if queue is not None:
            queue.append(work)
            return
        self._queues[work.session_id] = deque((work,))
        self._running += 1
        self._idle.clear()
        drain = self._drain(work.session_id)
        try:
            self._task_group.create_task(drain)
        except RuntimeError:
            # The owner's task group is ending (fenced, failed): nothing starts any more, and
            # the record, never finished, is read again by the next owner.
            drain.close()
            del self._queues[work.session_id]
            self._running -= 1
            if not self._running:
                self._idle.set()
            self._closed = True

    def close(self) -> None:
        """Start nothing new; the running handlers finish on their own."""
        self._closed = True

    async def wait_idle(self) -> None:
        await self._idle.wait()

    @property
    def sessions(self) -> int:
        return len(self._queues)

    def busy(self, session_id: str) -> bool:
        """The session has work running or queued."""
        return session_id in self._queues

    def holds(self, session_id: str, command_id: str) -> bool:
        """A command of the session with this id was put here and is not done: handled now,
        or queued."""
        handling = self._handling.get(session_id)
        if handling is not None and handling.command_id == command_id:
            return True
        queue = self._queues.get(session_id, ())
        return any(work.command_id == command_id for work in queue)

    def reads(self, session_id: str) -> dict[str, int]:
        """The newest offset of each input topic among the session's records put here (with
        ``track_reads``)."""
        return dict(self._reads.get(session_id, {})) if self._reads is not None else {}

    def forget(self, session_id: str) -> None:
        """The session is gone: its reads are no longer needed."""
        if self._reads is not None:
            self._reads.pop(session_id, None)

    def forget_passed(self, passed: Callable[[str, int], bool]) -> None:
        """Forget the reads the input offsets passed (``passed``, by topic and offset, which
        only moves on): they would hold nothing back any more. So what is kept is the reads of
        the sessions read since the offsets last moved, not of every session ever read (a
        deleted one, or one with no state to expire).

        Sessions are looked at oldest newest-read first, and the look ends at the first one
        not passed and not busy (the sessions read after it are, but for a few on the other
        input topic, not passed either): a call costs what it forgets, not what is kept.
        """
        if self._reads is None:
            return
        done = []
        for session_id, reads in self._reads.items():
            if session_id in self._queues:
                continue  # running or queued: its newest read is not finished yet
            if not all(passed(topic, offset) for topic, offset in reads.items()):
                break
            done.append(session_id)
        for session_id in done:
            del self._reads[session_id]

    async def _drain(self, session_id: str) -> None:
        queue = self._queues[session_id]
        try:
            while queue and not self._closed:
                work = self._handling[session_id] = queue.popleft()
                try:
                    await self._handler(work)
                except asyncio.CancelledError:
                    # A library's leaked CancelledError must not end this worker and with it
                    # the session's queue; only a cancel of the worker itself does.
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise
                    logger.exception(
                        "session_id=<%s>, offset=<%d> | handler ended in a stray cancel",
                        session_id,
                        work.record.origin.offset,
                    )
        finally:
            del self._queues[session_id]
            self._handling.pop(session_id, None)
            self._running -= 1
            if self._running == 0:
                self._idle.set()
