"""History edits that keep the conversation valid: roles alternate, every toolUse gets a result.

Messages already in history are never mutated in place (snapshots share them); a message that
must grow is replaced by a new dict. What a model call is sent differs from the history only in
the assistant's messages, as the reference normalizes them (strands
``event_loop.streaming._normalize_messages``): a tool name no tool can have is replaced by
:data:`INVALID_TOOL_NAME`, and blank text (an empty cancel ``message`` leaves some) is dropped
beside a toolUse, else sent as :data:`BLANK_TEXT`.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from service.agent.results import CANCELLED_TEXT, error_result, tool_name_error
from service.agent.types import ContentBlock, Message

INVALID_TOOL_NAME = "INVALID_TOOL_NAME"
"""The reference's placeholder (strands ``event_loop.streaming._normalize_messages``) for a tool
name that fails the name check, in the assistant's messages of every model call: an API may
refuse a history holding such a name (Bedrock does), and its error result still names it."""


BLANK_TEXT = "[blank text]"
"""The reference's stand-in for blank assistant text in what a model call is sent: providers
refuse an empty text block (Bedrock does), and the history keeps the text as it was."""

_VALID_NAMES: set[str] = set()
"""Tool names found valid, so each model call checks the history's names by a lookup (it sends
the whole view every time); bounded by :data:`_VALID_NAMES_KEPT`."""
_VALID_NAMES_KEPT = 4_096


def for_model(
    messages: list[Message], misnamed: Mapping[int, Message] | None = None
) -> list[Message]:
    """``messages`` as a model call sends them: a toolUse of the assistant's whose name no tool
    can have carries :data:`INVALID_TOOL_NAME` instead, and the assistant's blank text is left
    out beside a toolUse, else sent as :data:`BLANK_TEXT` (an assistant message without content
    gets one). The history keeps what it holds; the list and the messages are copied only where
    one is sent otherwise.

    ``misnamed`` is what a :class:`NameCheck` found in the history the view comes from (only
    those messages are replaced); without it every message is checked.
    """
    if misnamed is not None and not misnamed:
        return messages
    out = messages
    for index, message in enumerate(messages):
        if misnamed is not None:
            if misnamed.get(id(message)) is not message:
                continue
        elif not _sent_otherwise(message):
            continue
        if out is messages:
            out = list(messages)
        out[index] = _as_sent(message)
    return out


class NameCheck:
    """The messages of a session's history that a model call is sent otherwise than stored (a
    toolUse whose name no tool can have, blank text: see :func:`for_model`), found once per
    message instead of at every model call (checking the whole view cost 7 % of a step's CPU at
    90 messages, measured).

    It relies on the history's rule (this module's docstring): messages are appended, only the
    last one is ever replaced, none changes in place. A history that does not go on from the
    one checked (another first message, a last checked message replaced or gone) is checked
    again from its start. Snapshots of a session share it; a deep copy starts afresh.
    """

    __slots__ = ("_checked", "_first", "_last", "_misnamed")

    def __init__(self) -> None:
        self._checked = 0
        self._first: Message | None = None
        self._last: Message | None = None
        self._misnamed: dict[int, Message] = {}

    def __deepcopy__(self, memo: dict[int, Any]) -> NameCheck:
        return NameCheck()  # the copy's messages are other objects

    def misnamed(self, history: list[Message]) -> Mapping[int, Message]:
        """The messages of ``history`` sent otherwise than stored (a misnamed toolUse, blank
        text), by their ``id``."""
        start = self._checked
        if start and (
            start > len(history)
            or history[0] is not self._first
            or history[start - 1] is not self._last
        ):
            start, self._misnamed = 0, {}
        for message in itertools.islice(history, start, None):
            if _sent_otherwise(message):
                self._misnamed[id(message)] = message
        self._checked = len(history)
        self._first, self._last = (history[0], history[-1]) if history else (None, None)
        return self._misnamed


def _sent_otherwise(message: Message) -> bool:
    """A message of the assistant's that a model call is sent otherwise than it is stored."""
    if message.get("role") != "assistant":
        return False
    content = message.get("content", ())
    return not content or any(_misnamed(block) or _blank(block) for block in content)


def _as_sent(message: Message) -> Message:
    content = message.get("content", ())
    if not content:
        return {**message, "content": [{"text": BLANK_TEXT}]}
    if any("toolUse" in block for block in content):
        sent = [
            {"toolUse": {**block["toolUse"], "name": INVALID_TOOL_NAME}}
            if _misnamed(block)
            else block
            for block in content
            if not _blank(block)
        ]
    else:
        sent = [{**block, "text": BLANK_TEXT} if _blank(block) else block for block in content]
    return {**message, "content": sent}


def _blank(block: ContentBlock) -> bool:
    if "text" not in block:
        return False
    text = block["text"]
    return text is None or (isinstance(text, str) and not text.strip())


def model_tool_name(use: dict[str, Any]) -> str:
    """The name a model is sent for a toolUse: its own, or :data:`INVALID_TOOL_NAME`."""
    return INVALID_TOOL_NAME if tool_name_error(use) is not None else str(use["name"])


def _misnamed(block: ContentBlock) -> bool:
    use = block.get("toolUse")
    if not isinstance(use, dict):
        return False
    name = use.get("name")
    if type(name) is str and name in _VALID_NAMES:
        return False
    if tool_name_error(use) is not None:
        return True
    if isinstance(name, str) and len(_VALID_NAMES) < _VALID_NAMES_KEPT:
        _VALID_NAMES.add(name)
    return False


def tool_uses(message: Message) -> list[dict[str, Any]]:
    return [block["toolUse"] for block in message.get("content", ()) if "toolUse" in block]


def unidentified_tool_use(message: Message) -> str | None:
    """Why a model's reply cannot be taken (a toolUse without a string ``toolUseId``: its
    result could not be matched to it), else None."""
    for use in tool_uses(message):
        if not isinstance(use, dict) or not isinstance(use.get("toolUseId"), str):
            return "the model's reply holds a toolUse without a toolUseId"
    return None


def with_inputs(message: Message) -> Message:
    """A model's reply with ``"input": {}`` in each toolUse that has none; ``message`` itself
    when all have one. The reference's stream processor gives every toolUse of a reply an
    input, so such a call runs with no arguments; a toolUse without one that reaches a batch
    otherwise (a prompt of messages) is answered with the reference's error for it
    (:func:`~service.agent.results.missing_input`)."""
    content = message.get("content", ())
    if all("input" in block["toolUse"] for block in content if "toolUse" in block):
        return message
    filled = [
        {"toolUse": {**block["toolUse"], "input": {}}}
        if "toolUse" in block and "input" not in block["toolUse"]
        else block
        for block in content
    ]
    return {**message, "content": filled}


def asked_tools(messages: list[Message]) -> Message | None:
    """The last message when it is the assistant's with tool calls that have no results yet (a
    prompt of messages can end so): they are run as if the model had just asked for them."""
    if messages and messages[-1].get("role") == "assistant" and tool_uses(messages[-1]):
        return messages[-1]
    return None


def without_tool_uses(message: Message) -> Message:
    """``message`` with each tool call replaced by a line saying it was cut off (a reply that
    reached the model's token limit mid-call cannot be run)."""
    content: list[ContentBlock] = []
    for block in message.get("content", ()):
        if "toolUse" in block:
            name = block["toolUse"].get("name") or "<unknown>"
            text = (
                f"The selected tool {name}'s tool use was incomplete due to maximum token "
                "limits being reached."
            )
            content.append({"text": text})
        else:
            content.append(block)
    return {**message, "content": content}


def append_message(messages: list[Message], message: Message) -> Message:
    """Append ``message``, joining it to the last one when both have the same role.

    Returns the message as it now stands in history.
    """
    if messages and messages[-1].get("role") == message.get("role"):
        last = messages[-1]
        joined = {**last, "content": [*last.get("content", ()), *message.get("content", ())]}
        messages[-1] = joined
        return joined
    messages.append(message)
    return message


def _name_checked(use: dict[str, Any], block: ContentBlock | None) -> bool:
    if block is None or tool_name_error(use) is None:
        return False
    # Once its batch starts, the name check's result (or the error replacing one too large) is
    # the only result a toolUse with an invalid name gets; a batch stopped before it started
    # gives it the cancel result instead.
    return bool(block["toolResult"].get("content") != [{"text": CANCELLED_TEXT}])


def result_keys(uses: list[dict[str, Any]]) -> list[str]:
    """Where each toolUse's result is kept in its batch's results: under its toolUseId, and for
    an id the model gave more than once in one reply, under that id, a NUL and the repeat's
    number for each repeat (every call has a result of its own)."""
    seen: dict[str, int] = {}
    keys = []
    for use in uses:
        tool_use_id = use["toolUseId"]
        repeat = seen.get(tool_use_id, 0)
        seen[tool_use_id] = repeat + 1
        keys.append(f"{tool_use_id}\x00{repeat}" if repeat else tool_use_id)
    return keys


def answered_ids(results: dict[str, ContentBlock]) -> frozenset[str]:
    """The toolUseIds with a result in ``results`` (a batch's, kept by :func:`result_keys`)."""
    return frozenset(key.partition("\x00")[0] for key in results)


def resume_skipped(
    use: dict[str, Any], key: str, results: dict[str, ContentBlock], answered: frozenset[str]
) -> bool:
    """Whether ``use`` (kept under ``key``) is neither run nor answered by a batch resumed from
    an interrupt, whose results at the pause answered the toolUseIds ``answered``: it has no
    result, and another call of its toolUseId has one. The reference keeps its resume state by
    toolUseId and runs again only the calls whose id has no result yet, so such an id ends
    with the results it had at the pause (one call of it may be left without a result)."""
    return key not in results and use["toolUseId"] in answered


def name_shadowed(use: dict[str, Any], checked_ids: set[str]) -> bool:
    """Whether ``use`` gets no result and never runs: its name is valid, but a toolUse of its
    reply with the same toolUseId and an invalid name was answered by the name check (whose
    ids are ``checked_ids``). As in the reference, whose validator drops every call of such an
    id from the run, so the id has the name error as its only result."""
    return use["toolUseId"] in checked_ids and tool_name_error(use) is None


def result_order(
    uses: list[dict[str, Any]],
    results: dict[str, ContentBlock],
    answered: frozenset[str] = frozenset(),
) -> list[tuple[dict[str, Any], str]]:
    """The toolUses that get a result, each with its result's key (:func:`result_keys`), in
    the order their results go into the results message.

    First those the name check answered (:func:`~service.agent.results.tool_name_error`), then
    the others, each group in toolUse order. A toolUse with an invalid name and no result yet,
    or with the cancel result of a batch stopped before it started, is among the others. A
    toolUse :func:`name_shadowed` by one the name check answered is left out, and so is one
    :func:`resume_skipped` in a batch resumed from an interrupt (``answered``: the toolUseIds
    with a result at its pause; empty for a batch that was not resumed so).
    """
    keyed = list(zip(uses, result_keys(uses), strict=True))
    if answered:
        keyed = [k for k in keyed if not resume_skipped(k[0], k[1], results, answered)]
    first = [_name_checked(use, results.get(key)) for use, key in keyed]
    if not any(first):
        return keyed
    checked_ids = {use["toolUseId"] for (use, _), f in zip(keyed, first, strict=True) if f}
    return [k for k, f in zip(keyed, first, strict=True) if f] + [
        k
        for k, f in zip(keyed, first, strict=True)
        if not f and not name_shadowed(k[0], checked_ids)
    ]


def results_message(
    uses: list[dict[str, Any]],
    results: dict[str, ContentBlock],
    missing_text: str,
    answered: frozenset[str] = frozenset(),
) -> Message:
    """One user message with a result for every toolUse that gets one, in
    :func:`result_order` (``answered`` as there); a toolUse without one in ``results`` gets an
    error result of ``missing_text``."""
    content: list[ContentBlock] = []
    for use, key in result_order(uses, results, answered):
        block = results.get(key)
        content.append(block if block is not None else error_result(use["toolUseId"], missing_text))
    return {"role": "user", "content": content}


def prompt_messages(prompt: Any) -> list[Message]:
    """The user messages of a prompt (text, content blocks or messages); shape already checked."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": [{"text": prompt}]}]
    if prompt and all("role" in item for item in prompt):
        return [{"role": m["role"], "content": list(m.get("content") or [])} for m in prompt]
    return [{"role": "user", "content": list(prompt)}]
