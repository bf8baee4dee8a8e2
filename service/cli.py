"""The ``cairn`` command line: one parser, one registration function per command group.

Guarantee: every subcommand runs through its own handler and `main` returns that handler's exit
status; a call without a subcommand prints the help and returns 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import TypeAlias

from service.agents_cli import register_agent_commands
from service.client.arguments import register_client_commands
from service.serve_cli import register_runtime_commands


class CommandParser(argparse.ArgumentParser):
    """A command's parser (and, through ``add_subparsers``, its subcommands'): an argument it
    does not know is refused after its own usage. argparse leaves such arguments to the
    top-level parser, whose usage names none of the command's options."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extra = super().parse_known_args(args, namespace)
        if extra:
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed, extra


Subparsers: TypeAlias = "argparse._SubParsersAction[CommandParser]"
Handler = Callable[[argparse.Namespace], int]
"""What a subcommand runs: it receives the parsed arguments and returns the exit status."""


def _installed_version() -> str:
    try:
        return version("cairn")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _show_version(_: argparse.Namespace) -> int:
    print(f"cairn {_installed_version()}")
    return 0


def register_version(commands: Subparsers) -> None:
    parser = commands.add_parser("version", help="print the installed version")
    parser.set_defaults(handler=_show_version)


# A new command group is one function that adds its subparsers (each with
# `set_defaults(handler=...)`), appended here.
COMMAND_GROUPS: tuple[Callable[[Subparsers], None], ...] = (
    register_version,
    register_client_commands,
    register_runtime_commands,
    register_agent_commands,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cairn", description="Durable AI agent execution over Kafka."
    )
    parser.add_argument("--version", action="version", version=f"cairn {_installed_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    for register in COMMAND_GROUPS:
        register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    return handler(args)
