"""The ``cairn serve`` and ``cairn topics create`` commands: run the service, lay out its topics.

Guarantee: both read their configuration only from the settings (``CAIRN_`` environment); what
stops them from starting (an invalid setting, agents that do not load, a health port that cannot
be bound, a topic layout the service cannot run on, for ``topics create`` an unreachable broker)
ends the command with one line on stderr, never a traceback, and status 1. An unreachable broker
or missing topics do not stop ``serve``: it waits for them, not ready (docs/runtime.md).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from pydantic import ValidationError
from pydantic_settings import SettingsError

from service.early_stop import exit_on_early_stop
from service.settings import (
    Settings,
    bootstrap_problem,
    process_environment,
    tls_files_problem,
    unknown_settings,
)

if TYPE_CHECKING:
    from service.cli import Subparsers

START_FAILED = 1
"""Exit status of a command that could not start as configured."""


def _serve(_: argparse.Namespace) -> int:
    exit_on_early_stop()
    settings = load_settings("cairn serve")
    if settings is None:
        return START_FAILED
    from aiokafka.errors import KafkaError

    from service.agent_config import AgentConfigError
    from service.app import StartError, run_service
    from service.runtime.topics import TopicLayoutError

    try:
        run_service(settings)
    except (TopicLayoutError, AgentConfigError, StartError) as exc:
        print(f"cairn serve: {exc}", file=sys.stderr)
        return START_FAILED
    except KafkaError as exc:
        # The broker went away between the wait for it and joining the group.
        print(f"cairn serve: broker lost while joining: {exc}", file=sys.stderr)
        return START_FAILED
    return 0


def _topics_create(args: argparse.Namespace) -> int:
    settings = load_settings("cairn topics create")
    if settings is None:
        return START_FAILED
    from service.app import StartError, run_topics_create
    from service.runtime.topics import TopicLayoutError

    if args.partitions is not None:
        settings.topics.partitions = args.partitions
    if args.bootstrap_servers is not None:
        settings.kafka.bootstrap_servers = args.bootstrap_servers
    try:
        reports = run_topics_create(settings)
    except (TopicLayoutError, StartError) as exc:
        print(f"cairn topics create: {exc}", file=sys.stderr)
        return START_FAILED
    for name, report in reports.items():
        print(f"{name}: {report}")
    return 0


def load_settings(command: str) -> Settings | None:
    """The settings, or None after one line naming what is wrong with them; a ``CAIRN_``
    variable that names no setting is one warning line each (``serve`` logs them instead)."""
    try:
        settings = Settings()
    except ValidationError as exc:
        print(f"{command}: {describe_invalid_settings(exc)}", file=sys.stderr)
    except SettingsError as exc:
        print(f"{command}: invalid settings: {exc}", file=sys.stderr)
    else:
        problem = tls_files_problem(settings.kafka)
        if problem is not None:
            print(f"{command}: invalid setting: {problem}", file=sys.stderr)
            return None
        if command != "cairn serve":
            for name, meant in unknown_settings(process_environment()):
                hint = f" (did you mean {meant}?)" if meant else ""
                print(f"{command}: warning: {name} is no setting, ignored{hint}", file=sys.stderr)
        return settings
    return None


def describe_invalid_settings(exc: ValidationError) -> str:
    """One line naming each invalid setting by its variable; never the value (it may be a
    secret)."""
    problems = []
    for error in exc.errors():
        message = str(error["msg"]).removeprefix("Value error, ")
        loc = [str(part) for part in error["loc"]]
        name = "CAIRN_" + "__".join(loc).upper() if loc else None
        # A rule across settings names its variables itself.
        named = name is None or message.startswith("CAIRN_")
        problems.append(message if named else f"{name}: {message}")
    noun = "setting" if len(problems) == 1 else "settings"
    return f"invalid {noun}: " + "; ".join(problems)


def register_runtime_commands(commands: Subparsers) -> None:
    serve = commands.add_parser(
        "serve",
        help="run the service until SIGTERM",
        description="Run the service until SIGTERM. It takes no options: every setting is a "
        "CAIRN_* environment variable, each listed with its default in docs/runtime.md "
        '("Settings that matter"); the agents come from CAIRN_AGENTS.',
    )
    serve.set_defaults(handler=_serve)
    topics = commands.add_parser("topics", help="manage the service's topics")
    topic_commands = topics.add_subparsers(dest="topics_command", metavar="COMMAND")
    create = topic_commands.add_parser(
        "create", help="create the six topics (sessions compacted, co-partitioned counts)"
    )
    create.add_argument(
        "--partitions",
        type=partitions_argument,
        default=None,
        help="partitions of the co-partitioned topics",
    )
    create.add_argument(
        "--bootstrap-servers",
        type=bootstrap_servers_argument,
        help="Kafka bootstrap servers, HOST:PORT[,HOST:PORT...] (default: from CAIRN_ settings)",
    )
    create.set_defaults(handler=_topics_create)
    topics.set_defaults(handler=lambda _: _usage(topics))


def partitions_argument(text: str) -> int:
    """``--partitions``: a partition count Kafka takes (from 1 to 2**31-1), checked here since
    the option replaces ``topics.partitions`` unvalidated."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value < 2**31:
        raise argparse.ArgumentTypeError(f"{text} is not from 1 to 2**31-1")
    return value


def bootstrap_servers_argument(text: str) -> str:
    """``--bootstrap-servers``, checked as the setting is (the option replaces
    ``kafka.bootstrap_servers`` unvalidated)."""
    problem = bootstrap_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2
