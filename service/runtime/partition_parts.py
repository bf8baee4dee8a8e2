"""The parts that do one partition's work once its store is restored, wired to each other: the
session writer, the committer, the answers, the invoker, the cancel desk and the command path.

Guarantee: every part submits its outcomes to the one committer, writes session state through the
one writer over the one store, and waits for the same committer's progress, so the order of a
partition's commits is the order its parts submitted them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from service.runtime.answers import Answers
from service.runtime.cancels import CancelDesk
from service.runtime.command_path import CommandPath
from service.runtime.committer import Committer
from service.runtime.forks import SessionVersions
from service.runtime.invoker import Invoker
from service.runtime.offsets import OffsetTracker
from service.runtime.owner_context import OwnerContext
from service.runtime.partitioning import session_owner
from service.runtime.txn_stream import TransactionStream
from service.sessions.store import SessionStore
from service.sessions.writer import SessionWriter


@dataclass(slots=True, frozen=True)
class PartitionParts:
    store: SessionStore
    writer: SessionWriter
    committer: Committer
    cancels: CancelDesk
    path: CommandPath
    owns: Callable[[str], bool] | None
    """Whether a session belongs to this partition (``None``: not checked)."""


def assemble(
    partition: int,
    ctx: OwnerContext,
    stream: TransactionStream,
    store: SessionStore,
    trackers: dict[str, OffsetTracker],
    *,
    on_finished: Callable[[int], None],
    stopping: Callable[[], bool],
) -> PartitionParts:
    """Wire the parts of ``partition`` over its restored ``store``; its input offsets are tracked
    in ``trackers``, ``on_finished`` hears how many input records each commit finished and
    ``stopping`` says whether the owner is stopping."""
    settings = ctx.settings
    topics = settings.topics
    record_max_bytes = settings.runtime.state_record_max_bytes
    writer = SessionWriter(
        store, record_max_bytes=record_max_bytes, versions_kept=settings.sessions.versions_kept
    )
    committer = Committer(
        stream=stream,
        sessions_topic=topics.sessions,
        partition=partition,
        trackers=trackers,
        interval_s=settings.runtime.commit_interval_ms / 1000,
        offsets_every_s=settings.runtime.offsets_every_ms / 1000,
        observer=ctx.observer,
        on_finished=on_finished,
        on_durable=store.committed,
        metrics=ctx.metrics,
    )
    submit = committer.submit
    answers = Answers(
        writer=writer,
        submit=submit,
        topics=topics,
        metrics=ctx.metrics,
        max_bytes=record_max_bytes,
    )
    invoker = Invoker(
        writer=writer,
        submit=submit,
        durable=committer.flush,
        stopping=stopping,
        topics=topics,
        answers=answers,
        state_max_bytes=record_max_bytes,
        result_max_bytes=settings.sessions.result_max_bytes,
        metrics=ctx.metrics,
        text_every_s=settings.runtime.text_events_every_ms / 1000,
    )
    cancels = CancelDesk(
        writer=writer,
        submit=submit,
        topics=topics,
        metrics=ctx.metrics,
        durable=committer.flush,
        settled=committer.settled_before,
    )
    owns = session_owner(partition, ctx.partitions)
    path = CommandPath(
        store=store,
        cancels=cancels,
        invoker=invoker,
        answers=answers,
        submit=submit,
        agents=ctx.agents,
        topics=topics,
        versions=SessionVersions(
            store=store,
            writer=writer,
            answers=answers,
            submit=submit,
            topics=topics,
            session_records=ctx.sessions.session_records,
            max_bytes=record_max_bytes,
            metrics=ctx.metrics,
            settled=committer.settled_before,
        ),
        faults=ctx.faults,
        metrics=ctx.metrics,
        owns=owns,
        settled=committer.settled_before,
    )
    return PartitionParts(store, writer, committer, cancels, path, owns)
