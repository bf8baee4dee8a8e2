"""The client's subcommands for the ``cairn`` command line: invoke, resume, cancel, watch, session.

:func:`register_client_commands` adds them to the CLI, each handled by :func:`run_client_command`.
Mistakes a person can fix end with a one-line message and exit status 2, never a traceback; an
``error`` result ends with status 1; Ctrl-C ends with one line and status 130, SIGTERM with one
line and status 143.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from service.client import actions, commands, render
from service.client.kafka_io import (
    NO_RESULT_STATUS,
    ClientError,
    MissingTopicsError,
    NoResultError,
)
from service.serve_cli import bootstrap_servers_argument, load_settings
from service.sessions.versions import HISTORY_PAGE_MAX
from service.settings import Settings
from service.wire.base import MAX_ID_LENGTH

Action = Callable[[argparse.Namespace, Settings], Coroutine[Any, Any, int]]
Subparsers = Any
"""``argparse._SubParsersAction``, which is private and so not named in a signature."""

CLIENT_COMMANDS = ("invoke", "resume", "cancel", "watch", "session")
INTERRUPTED = 128 + signal.SIGINT
"""Exit status of a client command stopped by Ctrl-C (SIGINT), as the shell reports it."""
TERMINATED = 128 + signal.SIGTERM
"""Exit status of a client command stopped by SIGTERM (a supervisor, ``kill``, a test's end)."""


class _Terminated(Exception):
    """A SIGTERM ended the command."""


def _terminate(signum: int, frame: object) -> None:
    raise _Terminated


async def _cancelled_by_sigterm(work: Coroutine[Any, Any, int]) -> int:
    """``work``, cancelled by a SIGTERM so that its clients close as after a Ctrl-C (an
    exception raised by a signal handler inside the event loop can leave it unable to finish
    its cleanup: a ``watch`` stopped so was seen to hang)."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    terminated = False

    def cancel() -> None:
        nonlocal terminated
        terminated = True
        task.cancel()

    loop.add_signal_handler(signal.SIGTERM, cancel)
    try:
        return await work
    except asyncio.CancelledError:
        if terminated:
            raise _Terminated from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, _terminate)


def _connection(args: argparse.Namespace) -> tuple[str, ...]:
    """The connection options as given, so the ``next:`` hints reach the same cluster."""
    servers = getattr(args, "bootstrap_servers", None)
    return ("--bootstrap-servers", servers) if servers else ()


def _wait_options(args: argparse.Namespace) -> actions.WaitOptions:
    return actions.WaitOptions(
        wait=args.wait,
        timeout_s=args.timeout,
        show_events=not args.no_events,
        connection=_connection(args),
    )


def _add_common(parser: argparse.ArgumentParser, *, waits: bool) -> None:
    parser.add_argument(
        "--bootstrap-servers",
        type=bootstrap_servers_argument,
        help="Kafka bootstrap servers, HOST:PORT[,HOST:PORT...] (default: from CAIRN_ settings)",
    )
    if waits:
        parser.add_argument(
            "--command-id", type=_wire_id, help="the command id (default: a new random one)"
        )
        parser.add_argument(
            "--wait", action="store_true", help="follow the session until this command's result"
        )
        parser.add_argument(
            "--timeout", type=_seconds, default=120.0, help="seconds to wait (default: 120)"
        )
        parser.add_argument("--no-events", action="store_true", help="show only the result")


async def _invoke(args: argparse.Namespace, settings: Settings) -> int:
    return await actions.invoke(
        settings,
        session_id=args.session,
        agent=args.agent,
        prompt=args.prompt,
        checkpointing=True if args.checkpointing else None,
        command_id=args.command_id,
        options=_wait_options(args),
    )


async def _resume(args: argparse.Namespace, settings: Settings) -> int:
    # Checked before the session is read: a malformed answer never costs a trip to Kafka.
    outcome = commands.outcome_answer(
        supply_result=args.supply_result, retry=args.retry, fail=args.fail
    )
    return await actions.resume(
        settings,
        session_id=args.session,
        checkpoint_json=args.checkpoint,
        answers=args.answer or [],
        command_id=args.command_id,
        options=_wait_options(args),
        outcome=outcome,
        interrupt_id=args.interrupt,
    )


async def _cancel(args: argparse.Namespace, settings: Settings) -> int:
    return await actions.cancel(
        settings,
        session_id=args.session,
        target_command_id=args.command,
        message=args.message,
        after_current_tools=args.after_current_tools,
        command_id=args.command_id,
        options=_wait_options(args),
    )


async def _watch(args: argparse.Namespace, settings: Settings) -> int:
    return await actions.watch(
        settings,
        session_id=args.session,
        from_beginning=args.from_beginning,
        show_events=not args.no_events,
        connection=_connection(args),
    )


async def _session_show(args: argparse.Namespace, settings: Settings) -> int:
    return await actions.show_session(
        settings, session_id=args.session, results=args.results, connection=_connection(args)
    )


async def _session_delete(args: argparse.Namespace, settings: Settings) -> int:
    return await actions.delete_session(
        settings, session_id=args.session, command_id=args.command_id, options=_quiet_wait(args)
    )


def _quiet_wait(args: argparse.Namespace) -> actions.WaitOptions:
    """Wait for the command's result only (it has no events of its own)."""
    return actions.WaitOptions(
        wait=not args.no_wait,
        timeout_s=args.timeout,
        show_events=False,
        connection=_connection(args),
    )


async def _session_history(args: argparse.Namespace, settings: Settings) -> int:
    return await actions.session_history(
        settings,
        session_id=args.session,
        limit=args.limit,
        before=args.before,
        options=_quiet_wait(args),
    )


async def _session_fork(args: argparse.Namespace, settings: Settings) -> int:
    return await actions.fork_session(
        settings,
        source_session_id=args.session,
        version=args.at,
        target_session_id=args.target,
        options=_quiet_wait(args),
    )


def _add_no_wait(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-wait", action="store_true", help="publish only; do not wait for the result"
    )
    parser.add_argument(
        "--timeout", type=_seconds, default=120.0, help="seconds to wait (default: 120)"
    )


def register_client_commands(subparsers: Subparsers) -> None:
    """Add the client's subcommands; each is handled by :func:`run_client_command`."""
    p = subparsers.add_parser("invoke", help="run an agent on a prompt in a session")
    p.add_argument("prompt", help="the user prompt")
    p.add_argument(
        "--session", type=_wire_id, required=True, help="session id (also the record key)"
    )
    p.add_argument("--agent", type=_wire_id, default="demo", help="agent name (default: demo)")
    p.add_argument(
        "--checkpointing", action="store_true", help="pause at every checkpoint of this turn"
    )
    _add_common(p, waits=True)
    p.set_defaults(handler=run_client_command, client_action=_invoke)

    p = subparsers.add_parser("resume", help="continue a paused session")
    p.add_argument("--session", type=_wire_id, required=True)
    how = p.add_mutually_exclusive_group()
    how.add_argument(
        "--checkpoint", help="checkpoint JSON (default: the one the session is paused at)"
    )
    how.add_argument(
        "--answer",
        action="append",
        metavar="ID=JSON",
        help="answer an interrupt (repeatable); a bare JSON answers the only pending one; "
        "plain words go as a string",
    )
    how.add_argument(
        "--supply-result",
        metavar="JSON",
        help="tool_outcome_unknown: the tool did run, with this result "
        '({"content": [...], "status": "success"|"error"}; status optional)',
    )
    how.add_argument(
        "--retry", action="store_true", help="tool_outcome_unknown: run the tool again"
    )
    how.add_argument(
        "--fail", metavar="MSG", help="tool_outcome_unknown: the model gets an error result MSG"
    )
    p.add_argument(
        "--interrupt",
        type=_wire_id,
        metavar="ID",
        help="the tool_outcome_unknown interrupt to answer (needed when several are pending)",
    )
    _add_common(p, waits=True)
    p.set_defaults(handler=run_client_command, client_action=_resume)

    p = subparsers.add_parser("cancel", help="cancel what a session is doing (or one command)")
    p.add_argument("--session", type=_wire_id, required=True)
    p.add_argument("--command", type=_wire_id, help="cancel exactly this command id")
    p.add_argument("--after-current-tools", action="store_true", help="let running tools finish")
    p.add_argument("--message", help="text of the assistant message the cancel leaves")
    _add_common(p, waits=True)
    p.set_defaults(handler=run_client_command, client_action=_cancel)

    p = subparsers.add_parser("watch", help="print results and events as they are committed")
    p.add_argument("--session", type=_wire_id, help="only this session (default: all)")
    p.add_argument("--from-beginning", action="store_true", help="replay what is already there")
    p.add_argument("--no-events", action="store_true", help="show only results")
    _add_common(p, waits=False)
    p.set_defaults(handler=run_client_command, client_action=_watch)

    p = subparsers.add_parser("session", help="inspect sessions")
    session_commands = p.add_subparsers(dest="session_command", required=True)
    show = session_commands.add_parser("show", help="state, pause point and last results")
    show.add_argument("session", type=_wire_id, help="session id")
    show.add_argument("--results", type=_positive, default=3, help="how many results (default: 3)")
    _add_common(show, waits=False)
    show.set_defaults(handler=run_client_command, client_action=_session_show)
    delete = session_commands.add_parser(
        "delete", help="delete a session: stop what it runs, skip what it queued, drop its state"
    )
    delete.add_argument(
        "--session", type=_wire_id, required=True, help="session id (also the record key)"
    )
    delete.add_argument(
        "--command-id", type=_wire_id, help="the command id (default: a new random one)"
    )
    delete.add_argument(
        "--no-wait", action="store_true", help="publish only; do not wait for the result"
    )
    delete.add_argument(
        "--timeout", type=_seconds, default=120.0, help="seconds to wait (default: 120)"
    )
    _add_common(delete, waits=False)
    delete.set_defaults(handler=run_client_command, client_action=_session_delete)
    listing = session_commands.add_parser(
        "history", help="the session's versions (one per committed step), newest first"
    )
    listing.add_argument("session", type=_wire_id, help="session id")
    listing.add_argument(
        "--limit",
        type=_page_size,
        default=20,
        help=f"versions per page, 1 to {HISTORY_PAGE_MAX} (default: 20)",
    )
    listing.add_argument(
        "--before", type=_positive, help="only versions older than this (the next page's cursor)"
    )
    _add_no_wait(listing)
    _add_common(listing, waits=False)
    listing.set_defaults(handler=run_client_command, client_action=_session_history)
    fork = session_commands.add_parser(
        "fork", help="create a new session from a version of this one (left unchanged)"
    )
    fork.add_argument("session", type=_wire_id, help="the session to fork from")
    fork.add_argument("--at", type=_positive, required=True, metavar="V", help="its version")
    fork.add_argument(
        "--as",
        dest="target",
        type=_wire_id,
        required=True,
        metavar="S2",
        help="the new session's id",
    )
    _add_no_wait(fork)
    _add_common(fork, waits=False)
    fork.set_defaults(handler=run_client_command, client_action=_session_fork)


def _wire_id(text: str) -> str:
    """A session, command, agent or interrupt id given on the command line, checked as the wire
    checks it (1 to ``MAX_ID_LENGTH`` characters, no NUL), so a refusal names the option and
    comes with the usage line, before anything is read or sent."""
    if not text:
        raise argparse.ArgumentTypeError("an id cannot be empty")
    if len(text) > MAX_ID_LENGTH:
        raise argparse.ArgumentTypeError(
            f"an id is at most {MAX_ID_LENGTH} characters, this one has {len(text)}"
        )
    if "\x00" in text:
        raise argparse.ArgumentTypeError("an id cannot hold a NUL character")
    return text


def _positive(text: str, most: int | None = None) -> int:
    """A count or a version given on the command line: a whole number from 1 below 2**63 (a
    larger one fits no field of the wire, and JSON readers take it for a float), or from 1 to
    ``most``; the refusal states the range that holds."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value < 2**63 or (most is not None and value > most):
        raise argparse.ArgumentTypeError(f"{text} is not from 1 to {most or '2**63-1'}")
    return value


def _page_size(text: str) -> int:
    """A ``history`` page's ``--limit``: the service lists at most ``HISTORY_PAGE_MAX``."""
    return _positive(text, HISTORY_PAGE_MAX)


def _seconds(text: str) -> float:
    """A wait in seconds: a positive number."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


def run_client_command(args: argparse.Namespace, settings: Settings | None = None) -> int:
    """Run the chosen client subcommand to completion; returns the exit status."""
    # Ctrl-C is the person's "stop waiting", not the start-up stop of ``service.early_stop``
    # (status 0, meant for ``serve``): a script must not take an interrupted wait for success.
    # With Python's own handler, ``asyncio.run`` cancels the command (its clients close) and
    # raises KeyboardInterrupt. SIGTERM likewise ends the command with its own status.
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return _run(args, settings)
    except KeyboardInterrupt:
        print("cairn: interrupted", file=sys.stderr)
        return INTERRUPTED
    except _Terminated:
        print("cairn: terminated", file=sys.stderr)
        return TERMINATED
    finally:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])


def _run(args: argparse.Namespace, settings: Settings | None) -> int:
    action: Action = args.client_action
    if settings is None:
        settings = load_settings("cairn")
        if settings is None:
            return 2
    # Connection failures become one clear message below; the client library's own log of them
    # would only repeat it with a traceback.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    if getattr(args, "bootstrap_servers", None):
        kafka = settings.kafka.model_copy(update={"bootstrap_servers": args.bootstrap_servers})
        settings = settings.model_copy(update={"kafka": kafka})
    try:
        return asyncio.run(_cancelled_by_sigterm(action(args, settings)))
    except NoResultError as exc:
        print(render.terminal_safe(f"error: {exc}"), file=sys.stderr)
        return NO_RESULT_STATUS
    except MissingTopicsError as exc:
        print(render.terminal_safe(f"error: {exc.hint(_connection(args))}"), file=sys.stderr)
        return 2
    except (ClientError, commands.CommandInputError) as exc:
        print(render.terminal_safe(f"error: {exc}"), file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (``cairn watch | head``): stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
