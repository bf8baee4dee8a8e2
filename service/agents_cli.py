"""The ``cairn agents list`` command: show and validate the agents a deployment hosts.

Guarantee: exit status 0 only when every agent loads (providers built, tools imported, options
valid); otherwise every problem of every agent is printed, one clear line each, and it exits 1.
API keys are never printed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from service.cli import Subparsers

_COLUMNS = (
    "name",
    "provider",
    "model",
    "tools",
    "executor",
    "checkpointing",
    "limits",
    "context",
)


def _tool(name: str, policy: Mapping[str, Any]) -> str:
    """``pay (once, timeout 30s)``; a tool run the default way is its name alone."""
    notes = []
    if policy["timeout_s"] is not None:
        notes.append(f"timeout {policy['timeout_s']:g}s")
    if policy["retries"]:
        notes.append(f"retries {policy['retries']}, backoff {policy['backoff_s']:g}s")
    if notes or policy["effect"] != "idempotent":
        return f"{name} ({', '.join([policy['effect'], *notes])})"
    return name


def _cell(key: str, row: Mapping[str, Any]) -> str:
    value = row[key]
    if key == "tools":
        return ", ".join(_tool(name, row["tool_policies"][name]) for name in value) or "-"
    if key == "limits":
        return ",".join(f"{k}={v}" for k, v in value.items() if v is not None) or "-"
    if key == "context":
        # ``summarize(40,keep=10,by=notes)``, ``sliding_window(40)``, ``none``
        notes = [str(value[k]) for k in ("max_messages",) if k in value]
        notes += [f"keep={value['keep_recent']}"] if "keep_recent" in value else []
        notes += [f"by={value['summarizer']}"] if value.get("summarizer") else []
        return f"{value['strategy']}({','.join(notes)})" if notes else str(value["strategy"])
    return "-" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def render_table(rows: list[dict[str, Any]]) -> str:
    table = [[c.upper() for c in _COLUMNS]]
    table += [[_cell(c, row) for c in _COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(_COLUMNS))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in table
    )


def list_agents(source: str, env: Mapping[str, str], *, as_json: bool) -> tuple[int, str]:
    """Exit status and output of ``agents list`` for ``source`` (file or import path)."""
    from service.agent_config import AgentConfigError, describe_agents, load_agents

    try:
        agents = load_agents(source, env)
    except AgentConfigError as exc:
        return 1, "\n".join(f"cairn agents list: {problem}" for problem in exc.problems)
    rows = describe_agents(agents)
    if as_json:
        return 0, orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode()
    return 0, render_table(rows)


def _list(args: argparse.Namespace) -> int:
    from service.serve_cli import START_FAILED, load_settings
    from service.settings import process_environment

    source = args.config
    if source is None:
        settings = load_settings("cairn agents list")
        if settings is None:
            return START_FAILED
        source = settings.agents
    status, output = list_agents(source, process_environment(), as_json=args.json)
    print(output, file=sys.stderr if status else sys.stdout)
    return status


def register_agent_commands(commands: Subparsers) -> None:
    agents = commands.add_parser("agents", help="inspect the agents this deployment hosts")
    agent_commands = agents.add_subparsers(dest="agents_command", metavar="COMMAND")
    listing = agent_commands.add_parser(
        "list", help="load every agent (validating it) and show what is hosted"
    )
    listing.add_argument(
        "--config",
        default=None,
        help="agents file (.toml/.yaml) or registry 'package.module:attribute'; "
        "default: the CAIRN_AGENTS setting",
    )
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(handler=_list)
    agents.set_defaults(handler=lambda _: _help(agents))


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2
