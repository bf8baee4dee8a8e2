"""What each client command does: publish, then optionally follow the session until it settles.

A follower is positioned before the command is published, so the answer can never slip past it;
a wait is bounded by a timeout and says clearly when nothing answered (no service running?).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from service.client import commands, render
from service.client.kafka_io import NoResultError, Reader, Seen, publish
from service.client.pause import Pause
from service.settings import Settings
from service.wire.commands import CancelCommand, ResumeCommand

Write = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class WaitOptions:
    wait: bool = False
    timeout_s: float = 120.0
    show_events: bool = True
    connection: tuple[str, ...] = ()
    """The connection options given on the command line, repeated in ``next:`` hints."""


def _is_result(seen: Seen) -> bool:
    return seen.body is not None and seen.body.get("type") == "agent_result"


def _exit_code(result: dict[str, Any]) -> int:
    return 1 if result.get("stop_reason") == "error" else 0


async def _send_and_follow(
    settings: Settings,
    command: commands.AnyCommand,
    options: WaitOptions,
    write: Write,
) -> int:
    """Publish ``command``; with a wait, print its progress until its result. A cancel's own
    result comes after those of the commands it covers: the session's events and results
    before it are printed as they come.
    """
    topics = settings.topics
    topic = topics.control if isinstance(command, CancelCommand) else topics.commands
    value = commands.encode(command)
    body = command.model_dump(mode="json", exclude_unset=True)
    if not options.wait:
        partition, offset = await publish(settings.kafka, topic, command.session_id, value)
        write(render.published_line(command.type, body, partition, offset))
        return 0
    outputs = [topics.events, topics.results] if options.show_events else [topics.results]
    async with Reader(settings.kafka, outputs, session_id=command.session_id) as follower:
        partition, offset = await publish(settings.kafka, topic, command.session_id, value)
        write(render.published_line(command.type, body, partition, offset))
        try:
            async with asyncio.timeout(options.timeout_s):
                return await _follow(
                    follower,
                    command.command_id,
                    write,
                    options.connection,
                    others=isinstance(command, CancelCommand),
                )
        except TimeoutError:
            raise NoResultError(
                f"no result for command {command.command_id} within {options.timeout_s:g}s "
                "(is `cairn serve` running? a command_id the session answered before gets no "
                "second result; `cairn watch` shows what arrives)"
            ) from None


async def _follow(
    follower: Reader,
    command_id: str,
    write: Write,
    connection: Sequence[str] = (),
    *,
    others: bool = False,
) -> int:
    """Print the command's events until its result, then the result; returns the status.
    With ``others``, the session's other events and results on the way are printed too.

    Events and their result are committed together but live on two topics, so once the result
    is seen the events partition is read up to its end before the result is printed.
    """

    def show_events(batch: list[Seen]) -> None:
        for seen in batch:
            body = seen.body
            if body is None or _is_result(seen):
                continue
            if others or body.get("command_id") == command_id:
                line = render.event_line(body)
                if line is not None:
                    write(line)

    while True:
        batch = await follower.poll()
        show_events(batch)
        for seen in batch:
            if seen.body is None or not _is_result(seen):
                continue
            if seen.body.get("command_id") == command_id:
                show_events(await follower.scan())
                for line in render.result_lines(seen.body, connection):
                    write(line)
                return _exit_code(seen.body)
            if others:
                for line in render.result_lines(seen.body, connection):
                    write(line)


async def invoke(
    settings: Settings,
    *,
    session_id: str,
    agent: str,
    prompt: str,
    checkpointing: bool | None,
    command_id: str | None,
    options: WaitOptions,
    write: Write = render.show,
) -> int:
    command = commands.invoke(
        session_id, agent, prompt, command_id=command_id, checkpointing=checkpointing
    )
    return await _send_and_follow(settings, command, options, write)


async def last_results(settings: Settings, session_id: str, limit: int) -> list[dict[str, Any]]:
    """The session's latest results, oldest first (a scan of its results partition)."""
    async with Reader(
        settings.kafka, [settings.topics.results], session_id=session_id, from_beginning=True
    ) as scan:
        found = [s.body for s in await scan.scan() if _is_result(s) and s.body is not None]
    return found[-limit:] if limit > 0 else []


async def resume(
    settings: Settings,
    *,
    session_id: str,
    checkpoint_json: str | None,
    answers: Sequence[str],
    command_id: str | None,
    options: WaitOptions,
    outcome: dict[str, Any] | None = None,
    interrupt_id: str | None = None,
    write: Write = render.show,
) -> int:
    """Resume from a checkpoint, answer interrupts, or answer one ``tool_outcome_unknown``
    interrupt with ``outcome`` (see :func:`commands.outcome_answer`)."""
    given = [
        flag
        for flag, on in (
            ("--checkpoint", checkpoint_json is not None),
            ("--answer", bool(answers)),
            ("--supply-result/--retry/--fail", outcome is not None),
        )
        if on
    ]
    if len(given) > 1:
        raise commands.CommandInputError(f"give only one of {', '.join(given)}")
    if interrupt_id is not None and outcome is None:
        raise commands.CommandInputError(
            "--interrupt picks the interrupt that --supply-result, --retry or --fail answers"
        )
    command: ResumeCommand
    if checkpoint_json is not None:
        checkpoint = commands.parse_json_arg(checkpoint_json, "--checkpoint")
        command = commands.resume_from_checkpoint(session_id, checkpoint, command_id=command_id)
    else:
        pause = Pause.of(session_id, await session_state(settings, session_id))
        if outcome is not None:
            command = pause.answer_outcome(outcome, interrupt_id, command_id)
        elif answers:
            command = pause.answer(answers, command_id)
        else:
            command = pause.resume(command_id)
    return await _send_and_follow(settings, command, options, write)


async def cancel(
    settings: Settings,
    *,
    session_id: str,
    target_command_id: str | None,
    message: str | None,
    after_current_tools: bool,
    command_id: str | None,
    options: WaitOptions,
    write: Write = render.show,
) -> int:
    command = commands.cancel(
        session_id,
        target_command_id=target_command_id,
        message=message,
        after_current_tools=after_current_tools,
        command_id=command_id,
    )
    return await _send_and_follow(settings, command, options, write)


async def delete_session(
    settings: Settings,
    *,
    session_id: str,
    command_id: str | None,
    options: WaitOptions,
    write: Write = render.show,
) -> int:
    """Publish a delete of the session; with a wait, print its result (what it removed)."""
    command = commands.delete(session_id, command_id=command_id)
    return await _send_and_follow(settings, command, options, write)


async def session_history(
    settings: Settings,
    *,
    session_id: str,
    limit: int,
    before: int | None,
    options: WaitOptions,
    write: Write = render.show,
) -> int:
    """Ask for a page of the session's versions and print it, newest first."""
    command = commands.history(session_id, limit=limit, before=before)
    return await _send_and_follow(settings, command, options, write)


async def fork_session(
    settings: Settings,
    *,
    source_session_id: str,
    version: int,
    target_session_id: str,
    options: WaitOptions,
    write: Write = render.show,
) -> int:
    """Fork ``source_session_id`` at ``version`` into ``target_session_id``; print its result."""
    command = commands.fork(source_session_id, version, target_session_id)
    return await _send_and_follow(settings, command, options, write)


async def watch(
    settings: Settings,
    *,
    session_id: str | None,
    from_beginning: bool,
    show_events: bool = True,
    connection: Sequence[str] = (),
    write: Write = render.show,
    stop: asyncio.Event | None = None,
) -> int:
    """Print results (and events) as they are committed, until ``stop`` is set or Ctrl-C."""
    topics = [settings.topics.results]
    if show_events:
        topics.insert(0, settings.topics.events)
    async with Reader(
        settings.kafka, topics, session_id=session_id, from_beginning=from_beginning
    ) as tail:
        scope = f"session {session_id}" if session_id else "all sessions"
        write(f"watching {scope} on {', '.join(topics)} (Ctrl-C to stop)")
        while stop is None or not stop.is_set():
            for seen in await tail.poll():
                write_seen(seen, write, prefix_session=session_id is None, connection=connection)
    return 0


def write_seen(
    seen: Seen, write: Write, *, prefix_session: bool, connection: Sequence[str] = ()
) -> None:
    prefix = f"[{seen.key}] " if prefix_session else ""
    if seen.body is None:
        write(f"{prefix}(undecodable record at {seen.topic}/{seen.partition}@{seen.offset})")
        return
    if _is_result(seen):
        for line in render.result_lines(seen.body, connection):
            write(prefix + line)
        return
    event = render.event_line(seen.body)
    if event is not None:
        write(f"{prefix}{event.lstrip()}  (command {seen.body.get('command_id')})")


async def session_state(settings: Settings, session_id: str) -> dict[str, Any] | None:
    """The session's latest committed state from the compacted sessions topic, as a dict (its
    head record joined with its history records)."""
    from service.sessions.codec import decode_session, record_dict
    from service.sessions.history import prefix

    async with Reader(
        settings.kafka,
        [settings.topics.sessions],
        session_id=session_id,
        from_beginning=True,
        key_prefix=prefix(session_id),
    ) as scan:
        records = await scan.scan()
    latest: dict[bytes, bytes | None] = {}
    for record in records:
        latest[record.raw_key or b""] = record.raw
    head = latest.pop(session_id.encode(), None)
    if head is None:
        return None
    history = {key: value for key, value in latest.items() if value is not None}
    loaded = decode_session(head, history)
    return record_dict(loaded.state, loaded.delivery)


async def show_session(
    settings: Settings,
    *,
    session_id: str,
    results: int,
    connection: Sequence[str] = (),
    write: Write = render.show,
) -> int:
    # Both read before anything is printed: a missing results topic is the one line it gets.
    state = await session_state(settings, session_id)
    found = await last_results(settings, session_id, results)
    for line in render.state_lines(state):
        write(line)
    write(f"last {len(found)} result(s):" if found else "no results yet")
    for index, result in enumerate(found, start=1):
        # What to do next is said for the newest result only: the session has moved on from
        # the others (a pause resumed, a session deleted since).
        newest = index == len(found)
        for line in render.result_lines(result, connection, next_steps=newest):
            write("  " + line)
    return 0
