"""Building the commands the client publishes, from what a person types.

Every command is validated by the wire models before it leaves, so a typo fails here with the
model's message instead of becoming an ``error`` result later.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any, TypeVar

import orjson
from pydantic import ValidationError

from service.agent.outcomes import OUTCOME_UNKNOWN, answer_problem
from service.wire.commands import (
    CancelCommand,
    DeleteCommand,
    ForkCommand,
    HistoryCommand,
    InvokeCommand,
    ResumeCommand,
)
from service.wire.refusal_text import issues, reason

AnyCommand = (
    InvokeCommand | ResumeCommand | CancelCommand | DeleteCommand | HistoryCommand | ForkCommand
)
C = TypeVar(
    "C", InvokeCommand, ResumeCommand, CancelCommand, DeleteCommand, HistoryCommand, ForkCommand
)


class CommandInputError(ValueError):
    """What the person typed cannot become a valid command; the message says why."""


def new_command_id() -> str:
    return f"cli-{uuid.uuid4().hex[:12]}"


def _command_id(given: str | None) -> str:
    """The id given, or a new one when none was: an empty id given is kept, so the wire model
    refuses it as it refuses an empty ``--command`` (a random id sent instead would be one the
    person cannot know)."""
    return new_command_id() if given is None else given


def _validated(model: type[C], body: dict[str, Any]) -> C:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        # Said as the service would refuse the same command (JSON's words, no union tags).
        found, _ = issues(exc, json.dumps(body).encode())
        raise CommandInputError(f"invalid {body.get('type', 'command')}: {reason(found)}") from None


def invoke(
    session_id: str,
    agent: str,
    prompt: str,
    *,
    command_id: str | None = None,
    checkpointing: bool | None = None,
) -> InvokeCommand:
    body: dict[str, Any] = {
        "type": "invoke",
        "command_id": _command_id(command_id),
        "session_id": session_id,
        "agent": agent,
        "prompt": prompt,
    }
    if checkpointing is not None:
        body["checkpointing"] = checkpointing
    return _validated(InvokeCommand, body)


def resume_from_checkpoint(
    session_id: str, checkpoint: dict[str, Any], *, command_id: str | None = None
) -> ResumeCommand:
    body = {
        "type": "resume",
        "command_id": _command_id(command_id),
        "session_id": session_id,
        "resume": {"checkpointResume": {"checkpoint": checkpoint}},
    }
    return _validated(ResumeCommand, body)


def resume_with_answers(
    session_id: str, answers: dict[str, Any], *, command_id: str | None = None
) -> ResumeCommand:
    body = {
        "type": "resume",
        "command_id": _command_id(command_id),
        "session_id": session_id,
        "resume": [
            {"interruptResponse": {"interruptId": interrupt_id, "response": response}}
            for interrupt_id, response in answers.items()
        ],
    }
    return _validated(ResumeCommand, body)


def cancel(
    session_id: str,
    *,
    target_command_id: str | None = None,
    message: str | None = None,
    after_current_tools: bool = False,
    command_id: str | None = None,
) -> CancelCommand:
    body: dict[str, Any] = {
        "type": "cancel",
        "command_id": _command_id(command_id),
        "session_id": session_id,
    }
    if target_command_id is not None:
        body["target_command_id"] = target_command_id
    if message is not None:
        body["message"] = message
    if after_current_tools:
        body["after_current_tools"] = True
    return _validated(CancelCommand, body)


def delete(session_id: str, *, command_id: str | None = None) -> DeleteCommand:
    body = {
        "type": "delete",
        "command_id": _command_id(command_id),
        "session_id": session_id,
    }
    return _validated(DeleteCommand, body)


def history(
    session_id: str, *, limit: int, before: int | None = None, command_id: str | None = None
) -> HistoryCommand:
    body: dict[str, Any] = {
        "type": "history",
        "command_id": _command_id(command_id),
        "session_id": session_id,
        "limit": limit,
    }
    if before is not None:
        body["before"] = before
    return _validated(HistoryCommand, body)


def fork(
    source_session_id: str, version: int, target_session_id: str, *, command_id: str | None = None
) -> ForkCommand:
    """A fork, addressed (and keyed) to the new session."""
    body = {
        "type": "fork",
        "command_id": _command_id(command_id),
        "session_id": target_session_id,
        "source_session_id": source_session_id,
        "version": version,
    }
    return _validated(ForkCommand, body)


def encode(command: AnyCommand) -> bytes:
    """The record value: only the fields that were given (plus ``type`` and the version)."""
    return orjson.dumps(command.model_dump(mode="json", exclude_unset=True))


def parse_json_arg(raw: str, what: str) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise CommandInputError(f"{what} is not valid JSON: {exc}") from None


def outcome_answer(
    *, supply_result: str | None = None, retry: bool = False, fail: str | None = None
) -> dict[str, Any] | None:
    """The answer to a ``tool_outcome_unknown`` interrupt that the flags give, checked as the
    engine checks it; None when none of them is given.

    ``supply_result`` is the JSON of the ``result`` object (``content`` and an optional
    ``status``), ``fail`` the error text the model sees.
    """
    flags = (
        ("--supply-result", supply_result is not None),
        ("--retry", retry),
        ("--fail", fail is not None),
    )
    given = [flag for flag, on in flags if on]
    if not given:
        return None
    if len(given) > 1:
        raise CommandInputError(f"give only one of {', '.join(given)}")
    answer: dict[str, Any]
    if supply_result is not None:
        answer = {"result": parse_json_arg(supply_result, "--supply-result")}
    elif retry:
        answer = {"retry": True}
    else:
        answer = {"fail": fail}
    problem = answer_problem(answer)
    if problem is not None:
        raise CommandInputError(f"{given[0]} is not an answer to {OUTCOME_UNKNOWN}: {problem}")
    return answer


def parse_answers(raw_answers: Sequence[str], pending_ids: Sequence[str]) -> dict[str, Any]:
    """``ID=JSON`` pairs naming pending interrupts; a bare ``JSON`` answers the only pending one.

    The id before ``=`` must be a pending one: a mistyped or stale id is refused here rather
    than sent, ``=`` and all, as the text of the only pending interrupt's answer. An argument
    that is JSON as a whole is a bare answer even when it holds ``=`` (``'"a=b"'``). A value that
    is not JSON is taken as a string when it reads as plain text, so ``ID=yes`` and ``yes`` work
    without quoting; one that looks like JSON gone wrong (empty, starting like an object, list,
    string or number, or ``True``/``tru``/``nul``...) is refused rather than sent as text.
    """
    if not pending_ids:
        raise CommandInputError("no interrupt is pending: there is nothing to answer")
    answers: dict[str, Any] = {}
    for raw in raw_answers:
        interrupt_id, value = _split_answer(raw, pending_ids)
        try:
            answers[interrupt_id] = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            if _broken_json(value):
                raise CommandInputError(
                    f"answer {value!r} is not valid JSON ({exc}); quote a text answer as a JSON "
                    "string, e.g. '\"yes\"'"
                ) from None
            answers[interrupt_id] = value
    if not answers:
        raise CommandInputError("no answer given")
    return answers


def _split_answer(raw: str, pending_ids: Sequence[str]) -> tuple[str, str]:
    """The interrupt id an answer is for, and its value text."""
    # Longest first, so an id that is a prefix of another (or holds "=") cannot steal its answer.
    for interrupt_id in sorted(pending_ids, key=len, reverse=True):
        if raw.startswith(interrupt_id + "="):
            return interrupt_id, raw[len(interrupt_id) + 1 :]
    pending = list(pending_ids)
    if "=" in raw and not _is_json(raw):
        named = raw.partition("=")[0]
        raise CommandInputError(
            f"answer {raw!r} names interrupt {named!r}, which is not pending; pending: {pending} "
            "(give an answer text holding '=' as a JSON string, e.g. '\"a=b\"')"
        )
    if len(pending) != 1:
        raise CommandInputError(f"answer {raw!r} names no interrupt id; pending: {pending}")
    return pending[0], raw


def _broken_json(text: str) -> bool:
    """``text`` (not JSON) was meant as JSON: empty, starting like a JSON value other than a
    word, or a miscased or cut-short ``true``, ``false`` or ``null``."""
    stripped = text.strip()
    if not stripped or stripped[0] in '{["-0123456789':
        return True
    lowered = stripped.lower()
    return any(word.startswith(lowered) for word in ("true", "false", "null")) and len(lowered) > 1


def _is_json(text: str) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True
