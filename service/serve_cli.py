"""The ``cairn serve`` and ``cairn topics create`` commands: run the service, lay out its topics.

Guarantee: both read their configuration only from the settings (``CAIRN_`` environment); a
topic layout the service cannot run on, or a broker ``serve`` cannot connect to (unreachable, or
refusing its credentials), ends the command with a clear message and status 1.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from service.early_stop import exit_on_early_stop
from service.settings import Settings

if TYPE_CHECKING:
    from service.cli import Subparsers


def _serve(_: argparse.Namespace) -> int:
    exit_on_early_stop()
    from aiokafka.errors import KafkaConnectionError

    from service.agent_config import AgentConfigError
    from service.app import run_service
    from service.runtime.topics import TopicLayoutError

    settings = Settings()
    try:
        run_service(settings)
    except (TopicLayoutError, AgentConfigError) as exc:
        print(f"cairn serve: {exc}", file=sys.stderr)
        return 1
    except KafkaConnectionError as exc:
        # aiokafka has logged why each connection failed (refused, or SaslAuthenticationFailed).
        bootstrap = settings.kafka.bootstrap_servers
        print(f"cairn serve: cannot connect to the broker at {bootstrap}: {exc}", file=sys.stderr)
        return 1
    return 0


def _topics_create(args: argparse.Namespace) -> int:
    from service.app import run_topics_create
    from service.runtime.topics import TopicLayoutError

    settings = Settings()
    if args.partitions is not None:
        settings.topics.partitions = args.partitions
    try:
        created = run_topics_create(settings)
    except TopicLayoutError as exc:
        print(f"cairn topics create: {exc}", file=sys.stderr)
        return 1
    topics = settings.topics
    names = [topics.commands, topics.control, topics.sessions, topics.results, topics.events]
    for name in [*names, topics.dlq]:
        print(f"{name}: {'created' if name in created else 'exists'}")
    return 0


def register_runtime_commands(commands: Subparsers) -> None:
    serve = commands.add_parser("serve", help="run the service until SIGTERM")
    serve.set_defaults(handler=_serve)
    topics = commands.add_parser("topics", help="manage the service's topics")
    topic_commands = topics.add_subparsers(dest="topics_command", metavar="COMMAND")
    create = topic_commands.add_parser(
        "create", help="create the six topics (sessions compacted, co-partitioned counts)"
    )
    create.add_argument(
        "--partitions", type=int, default=None, help="partitions of the co-partitioned topics"
    )
    create.set_defaults(handler=_topics_create)
    topics.set_defaults(handler=lambda _: _usage(topics))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2
