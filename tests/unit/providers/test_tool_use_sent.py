"""A toolUse of the history reaches every provider's request whatever it holds: a custom
provider or a prompt of messages may give one without a name or an input, or with an input
that is not an object; only one without a toolUseId is refused, with a clear error."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from service.agent.errors import ModelError
from service.providers.anthropic_mapping import to_anthropic_messages
from service.providers.bedrock_mapping import to_bedrock_messages
from service.providers.openai_mapping import to_chat_messages

Sent = tuple[str, str, Any]
"""(id, name, input) of one tool call as a request carries it."""


def openai_calls(messages: list[dict[str, Any]]) -> list[Sent]:
    [_, assistant, *_] = to_chat_messages(messages, None)
    return [
        (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in assistant["tool_calls"]
    ]


def anthropic_calls(messages: list[dict[str, Any]]) -> list[Sent]:
    [_, assistant, *_] = to_anthropic_messages(messages)
    return [(b["id"], b["name"], b["input"]) for b in assistant["content"]]


def bedrock_calls(messages: list[dict[str, Any]]) -> list[Sent]:
    [_, assistant, *_] = to_bedrock_messages(messages)
    return [
        (b["toolUse"]["toolUseId"], b["toolUse"]["name"], b["toolUse"]["input"])
        for b in assistant["content"]
    ]


MAPPINGS: list[Callable[[list[dict[str, Any]]], list[Sent]]] = [
    openai_calls,
    anthropic_calls,
    bedrock_calls,
]


def history(*uses: dict[str, Any]) -> list[dict[str, Any]]:
    results = [
        {"toolResult": {"toolUseId": u["toolUseId"], "status": "error", "content": [{"text": "x"}]}}
        for u in uses
        if "toolUseId" in u
    ]
    return [
        {"role": "user", "content": [{"text": "hi"}]},
        {"role": "assistant", "content": [{"toolUse": u} for u in uses]},
        {"role": "user", "content": results},
    ]


@pytest.mark.parametrize("mapped", MAPPINGS)
def test_a_tool_use_without_name_or_input_is_sent_as_the_reference_sends_it(
    mapped: Callable[[list[dict[str, Any]]], list[Sent]],
) -> None:
    messages = history(
        {"toolUseId": "t1", "name": "lookup"},
        {"toolUseId": "t2", "input": {"q": 1}},
        {"toolUseId": "t3", "name": "lookup", "input": ["not", "an", "object"]},
        {"toolUseId": "t4", "name": "bad name!", "input": {"q": 2}},
        {"toolUseId": "t5", "name": "lookup", "input": {"q": 3}},
    )
    assert mapped(messages) == [
        ("t1", "lookup", {}),
        ("t2", "INVALID_TOOL_NAME", {"q": 1}),
        ("t3", "lookup", {}),
        ("t4", "INVALID_TOOL_NAME", {"q": 2}),
        ("t5", "lookup", {"q": 3}),
    ]


@pytest.mark.parametrize("mapped", MAPPINGS)
def test_a_tool_use_without_an_id_is_refused_with_a_clear_error(
    mapped: Callable[[list[dict[str, Any]]], list[Sent]],
) -> None:
    with pytest.raises(ModelError, match="toolUse block without a toolUseId"):
        mapped(history({"name": "lookup", "input": {}}))
