"""Readable text for results, progress events and session state, for a person at a terminal.

Pure functions from the wire JSON to lines; unknown shapes are shown as compact JSON rather than
dropped, so nothing the service wrote is hidden.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import orjson

from service.agent.outcomes import is_outcome_interrupt
from service.providers.content import cited_text
from service.wire.commands import HistoryCommand

_TEXT_WIDTH = 400
_IDS_SHOWN = 10


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
"""Characters a terminal acts on (escape sequences, carriage returns, ...) but tab and newline,
and the bidirectional controls (U+202E and its kin), which reorder what follows them on the
line, so that an id shows one thing and is another."""


def terminal_safe(line: str) -> str:
    """``line`` with its control characters written as escapes (``\\x1b``, ``\\u202e``), as a
    Python ``repr`` writes them in the error messages, so text from the wire (a session id, a
    model's answer) can never move the cursor, recolour the terminal or reorder the line."""
    return _CONTROL.sub(lambda found: found.group().encode("unicode_escape").decode(), line)


def shell_word(text: str) -> str:
    """``text`` as one word a POSIX shell reads back unchanged, for a command to paste.

    ``shlex.quote`` keeps control characters raw, and printed they become the escapes of
    :func:`terminal_safe`, which a shell takes literally: the pasted command would name another
    id. Text with a character that is not printable (controls, bidirectional controls, unusual
    spaces) is written in ANSI-C quoting instead, each byte of such a character as a three-digit
    octal escape (``$'e\\033[31m'``), which bash, zsh, ksh and shells of POSIX.1-2024 read alike
    (an older dash does not: such an id is rare, and no quoting a shell reads without ``$'``
    keeps every character, a trailing newline included).
    """
    if text.isprintable():
        return shlex.quote(text)
    return "$'" + "".join(_ansi_c(char) for char in text) + "'"


def _ansi_c(char: str) -> str:
    if char in "\\'":
        return "\\" + char
    if char.isprintable():
        return char
    return "".join(f"\\{byte:03o}" for byte in char.encode("utf-8", "surrogatepass"))


def show(line: str) -> None:
    """Print one line for a person at a terminal."""
    print(terminal_safe(line))


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _clip(text: str, width: int = _TEXT_WIDTH) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def block_lines(block: dict[str, Any]) -> list[str]:
    if "text" in block:
        return [_clip(str(block["text"]))]
    if "citationsContent" in block:
        return [_cited(block["citationsContent"])]
    if "toolUse" in block:
        use = block["toolUse"]
        return [f"tool call {use.get('name')} {_json(use.get('input'))}  [{use.get('toolUseId')}]"]
    if "toolResult" in block:
        result = block["toolResult"]
        parts = [
            str(c["text"]) if "text" in c else _json(c.get("json", c))
            for c in result.get("content") or []
        ]
        status = result.get("status")
        return [f"tool result [{result.get('toolUseId')}] {status}: {_clip(' '.join(parts))}"]
    return [_clip(_json(block))]


def _cited(cited: Any) -> str:
    """A model's text that cites its sources: the text, then the titles of the sources (or how
    many citations there are, when none has a title)."""
    citations = cited.get("citations") if isinstance(cited, dict) else None
    citations = citations if isinstance(citations, list) else []
    titles = [str(c["title"]) for c in citations if isinstance(c, dict) and c.get("title")]
    if titles:
        sources = ", ".join(dict.fromkeys(titles))
    else:
        sources = f"{len(citations)} citation{'s' if len(citations) != 1 else ''}"
    return f"{_clip(cited_text(cited))}  [cited: {_clip(sources, 60)}]"


def message_lines(message: dict[str, Any] | None, indent: str = "  ") -> list[str]:
    if not message:
        return []
    role = message.get("role", "?")
    return [
        f"{indent}{role}: {line}"
        for block in message.get("content") or []
        for line in block_lines(block if isinstance(block, dict) else {"value": block})
    ]


def message_summary(message: dict[str, Any] | None) -> str:
    """One line: the message's text, then the tools it calls."""
    blocks = (message or {}).get("content") or []
    texts = [
        str(b["text"]) if "text" in b else cited_text(b["citationsContent"])
        for b in blocks
        if isinstance(b, dict) and ("text" in b or "citationsContent" in b)
    ]
    calls = [
        f"{b['toolUse'].get('name')}({_json(b['toolUse'].get('input'))})"
        for b in blocks
        if isinstance(b, dict) and "toolUse" in b
    ]
    summary = _clip(" ".join(texts), 120) if texts else ""
    if calls:
        summary += (" " if summary else "") + "-> " + ", ".join(calls)
    return summary or "(empty)"


def _when(epoch_s: Any) -> str:
    if not isinstance(epoch_s, int | float) or isinstance(epoch_s, bool):
        return "at an unknown time"
    try:
        moment = datetime.fromtimestamp(epoch_s, UTC)
    except (OverflowError, OSError, ValueError):
        return "at an unknown time"
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def outcome_line(interrupt: dict[str, Any]) -> str | None:
    """What a ``tool_outcome_unknown`` interrupt asks, in words; None for any other interrupt."""
    if not is_outcome_interrupt(str(interrupt.get("id"))):
        return None
    reason = interrupt.get("reason")
    reason = reason if isinstance(reason, dict) else {}
    return (
        f"outcome unknown: tool {reason.get('tool_name')} (toolUseId {reason.get('tool_use_id')}, "
        f"idempotency key {reason.get('idempotency_key')}) started "
        f"{_when(reason.get('started_at'))} on {reason.get('instance') or 'an unknown instance'}"
        " — it may or may not have run; answer with --supply-result JSON, --retry or --fail MSG"
    )


def _interrupt_hints(start: str, interrupts: Sequence[dict[str, Any]]) -> list[str]:
    ids = [str(i.get("id")) for i in interrupts]
    outcomes = [i for i in ids if is_outcome_interrupt(i)]
    others = [i for i in ids if not is_outcome_interrupt(i)]
    lines = []
    if others == ids and len(ids) == 1:
        lines.append(f"  next: {start} --answer true --wait")
    elif others:
        answers = " ".join(f"--answer {shell_word(i + '=true')}" for i in others)
        lines.append(f"  next: {start} {answers} --wait")
    for interrupt_id in outcomes:
        pick = f" --interrupt {shell_word(interrupt_id)}" if len(outcomes) > 1 else ""
        lines.append(f"  next: {start}{pick} (--supply-result JSON | --retry | --fail MSG) --wait")
    return lines


def next_step_lines(result: dict[str, Any], connection: Sequence[str] = ()) -> list[str]:
    """The command that continues a paused session, with the connection options given to this one.

    ``connection`` is what the person passed on the command line (``--bootstrap-servers H``), so
    the hint, copied as it is, reaches the same cluster.
    """
    session = shell_word(str(result.get("session_id")))
    start = " ".join(["cairn resume --session", session, *map(shell_word, connection)])
    reason = result.get("stop_reason")
    if reason == "checkpoint":
        return [f"  next: {start} --wait"]
    if reason == "interrupt":
        return _interrupt_hints(start, result.get("interrupts") or [])
    return []


def _ids(ids: Sequence[Any]) -> str:
    shown = ", ".join(str(i) for i in ids[:_IDS_SHOWN])
    more = len(ids) - _IDS_SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


def deleted_line(result: dict[str, Any]) -> str:
    """What a delete removed, from the ``deleted`` report of its result."""
    report = result.get("deleted") or {}
    session = result.get("session_id")
    records = report.get("records") or 0
    stopped = report.get("stopped")
    skipped = report.get("skipped") or []
    if not report.get("existed") and not records and not stopped and not skipped:
        return f"nothing to delete: session {session} has no state"
    line = f"deleted session {session}: {records} state record{'' if records == 1 else 's'}"
    if stopped:
        line += f"; stopped {stopped}"
    if skipped:
        line += f"; skipped {_ids(skipped)}"
    return line


def cancel_line(result: dict[str, Any]) -> str:
    """What a cancel covered, from the ``cancel`` report of its own result."""
    report = result.get("cancel") or {}
    stopped, skipped = report.get("stopped"), report.get("skipped") or []
    resolved = report.get("resolved")
    if not stopped and not skipped and not resolved:
        return (
            "cancelled nothing now: the session was idle, or running what it does not cover "
            "(a target that has not arrived is answered cancelled when it does)"
        )
    parts = []
    if stopped:
        parts.append(f"stopped {stopped}")
    if skipped:
        parts.append(f"skipped {_ids(skipped)}")
    if resolved:
        parts.append(f"resolved the {resolved} pause")
    return "cancel: " + "; ".join(parts)


def version_line(entry: dict[str, Any]) -> str:
    """One version of a ``history`` page."""
    where = entry.get("stop_reason") or "running on"
    if entry.get("position"):
        where = (
            f"{entry['position']} (paused)"
            if entry.get("stop_reason") == "checkpoint"
            else f"{entry['position']} ({where})"
        )
    line = (
        f"  v{entry.get('version')}  {_when(entry.get('at'))}  {where}, cycle "
        f"{entry.get('cycle_index')}, {entry.get('messages')} messages  "
        f"[{entry.get('command_id')}]"
    )
    forked = entry.get("forked_from")
    if isinstance(forked, dict):
        line += f"  forked from {forked.get('session_id')} v{forked.get('version')}"
    return line


def history_lines(result: dict[str, Any], connection: Sequence[str] = ()) -> list[str]:
    """A ``history`` page, newest first, and how to ask for the next one: on the same cluster
    (``connection``, as in ``next:`` hints) and, when it is not the default, in pages of the
    same size. A page followed by another is full, so its length is the ``--limit`` asked for.
    """
    page = result.get("history") or {}
    versions = page.get("versions") or []
    if not versions:
        return [f"  no versions: session {result.get('session_id')} has none kept"]
    lines = [version_line(entry) for entry in versions]
    if page.get("next_before") is not None:
        words = ["cairn session history", shell_word(str(result.get("session_id")))]
        words += [*map(shell_word, connection), f"--before {page['next_before']}"]
        if len(versions) != HistoryCommand.model_fields["limit"].default:
            words.append(f"--limit {len(versions)}")
        lines.append(f"  older: {' '.join(words)}")
    return lines


def result_lines(
    result: dict[str, Any], connection: Sequence[str] = (), *, next_steps: bool = True
) -> list[str]:
    """A result: its stop reason, the pause or error it carries, the message, what to do next
    (unless ``next_steps`` is false: a result the session has moved on from)."""
    head = (
        f"result   session={result.get('session_id')} command={result.get('command_id')} "
        f"stop_reason={result.get('stop_reason')}"
    )
    lines = [head]
    checkpoint = result.get("checkpoint")
    if checkpoint:
        lines.append(
            f"  checkpoint: {checkpoint.get('position')} (cycle {checkpoint.get('cycle_index')})"
        )
    for interrupt in result.get("interrupts") or []:
        outcome = outcome_line(interrupt)
        lines.append(
            f"  {outcome}"
            if outcome
            else f"  interrupt: {interrupt.get('name')} reason={_json(interrupt.get('reason'))}"
        )
        lines.append(f"    id: {interrupt.get('id')}")
    error = result.get("error")
    if error:
        lines.append(f"  error: {error.get('code')}: {error.get('message')}")
    if isinstance(result.get("deleted"), dict):
        lines.append("  " + deleted_line(result))
    if isinstance(result.get("cancel"), dict):
        lines.append("  " + cancel_line(result))
    forked = result.get("forked_from")
    if isinstance(forked, dict):
        lines.append(
            f"  forked from session {forked.get('session_id')} at version "
            f"{forked.get('version')} (this is version {result.get('version')})"
        )
    if isinstance(result.get("history"), dict):
        lines.extend(history_lines(result, connection))
    lines.extend(message_lines(result.get("message")))
    if next_steps:
        lines.extend(next_step_lines(result, connection))
    return lines


def event_line(event: dict[str, Any]) -> str | None:
    """One line for an event, or None for an event that adds nothing (a text-only message)."""
    kind = event.get("type")
    prefix = f"  · #{event.get('seq')} "
    if kind == "text_delta":
        return prefix + f"text: {_clip(str(event.get('text', '')))}"
    if kind == "model_message":
        message = event.get("message") or {}
        if not any("toolUse" in b for b in message.get("content") or [] if isinstance(b, dict)):
            return None
        return prefix + "model: " + message_summary(message)
    if kind == "tool_started":
        return prefix + f"tool started: {event.get('name')} [{event.get('tool_use_id')}]"
    if kind == "tool_finished":
        return (
            prefix + f"tool finished: {event.get('name')} [{event.get('tool_use_id')}] "
            f"{event.get('status')}"
        )
    if kind == "checkpoint_reached":
        paused = "paused" if event.get("paused") else "durable, running on"
        return (
            prefix
            + f"checkpoint: {event.get('position')} (cycle {event.get('cycle_index')}, {paused})"
        )
    if kind == "interrupt_raised":
        names = ", ".join(str(i.get("name")) for i in event.get("interrupts") or [])
        return prefix + f"interrupt raised: {names}"
    return prefix + _clip(_json(event))


def published_line(kind: str, command: dict[str, Any], partition: int, offset: int) -> str:
    extra = ""
    if command.get("agent"):
        extra += f" agent={command['agent']}"
    if command.get("checkpointing"):
        extra += " checkpointing=on"
    if command.get("target_command_id"):
        extra += f" target={command['target_command_id']}"
    if command.get("after_current_tools"):
        extra += " after_current_tools"
    return (
        f"sent     {kind} session={command.get('session_id')} "
        f"command={command.get('command_id')}{extra} (partition {partition}, offset {offset})"
    )


def state_lines(state: dict[str, Any] | None) -> list[str]:
    """A session's persisted state: agent, pause point, pending interrupts, conversation size."""
    if state is None:
        return ["state: none (the session has no committed state)"]
    messages = state.get("messages") or []
    lines = [
        f"session  {state.get('session_id')}  agent={state.get('agent')}",
        f"  messages: {len(messages)}  turn cycle: {state.get('cycle_index')}",
    ]
    pending = state.get("pending") or {}
    # Answered interrupts stay in the state until their batch completes: not pending any more.
    listed = pending.get("interrupts") or []
    interrupts = [i for i in listed if i.get("response") is None]
    checkpoint = state.get("checkpoint")
    if interrupts:
        lines.append("  paused at: interrupt (answer to continue)")
        if len(listed) > len(interrupts):
            answered = len(listed) - len(interrupts)
            plural = "interrupt" if answered == 1 else "interrupts"
            lines.append(f"    ({answered} {plural} of this batch already answered)")
        for interrupt in interrupts:
            outcome = outcome_line(interrupt)
            if outcome:
                lines.extend([f"    {outcome}", f"      id: {interrupt.get('id')}"])
            else:
                lines.append(
                    f"    {interrupt.get('name')} id={interrupt.get('id')} "
                    f"reason={_json(interrupt.get('reason'))}"
                )
    elif checkpoint:
        lines.append(
            f"  paused at: checkpoint {checkpoint.get('position')} "
            f"(cycle {checkpoint.get('cycle_index')})"
        )
    else:
        lines.append("  paused at: nothing (idle or finished)")
    inflight = state.get("inflight")
    if inflight:
        lines.append(
            f"  running: command {inflight.get('command_id')} past {inflight.get('position')} "
            f"(cycle {inflight.get('cycle_index')})"
        )
    applied = state.get("applied_commands") or []
    if applied:
        lines.append(f"  last applied commands: {', '.join(applied[-5:])}")
    if messages:
        lines.append("  last message:")
        lines.extend(message_lines(messages[-1], indent="    "))
    return lines
