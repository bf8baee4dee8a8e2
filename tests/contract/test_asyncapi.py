"""The AsyncAPI document parses, is self-contained, and describes the six topics as designed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

CONTRACTS = Path(__file__).resolve().parents[2] / "contracts"
CHANNELS = {
    "commands": ("cairn.commands", "receive", {"invoke", "resume", "delete", "history", "fork"}),
    "control": ("cairn.control", "receive", {"cancel"}),
    "results": ("cairn.results", "send", {"agent_result"}),
    "events": ("cairn.events", "send", None),
    "sessions": ("cairn.sessions", "send", {"session_state"}),
    "dlq": ("cairn.dlq", "send", {"dlq_record"}),
}


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CONTRACTS / "asyncapi.yaml").read_text())
    return loaded


def _refs(node: Any, path: str = "#") -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                found.append((path, value))
            else:
                found.extend(_refs(value, f"{path}/{key}"))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found.extend(_refs(value, f"{path}/{index}"))
    return found


def _resolve(doc: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), f"external or malformed $ref {ref!r}"
    node: Any = doc
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        assert isinstance(node, dict) and part in node, f"$ref {ref!r} does not resolve at {part!r}"
        node = node[part]
    return node


def test_it_is_asyncapi_3(doc: dict[str, Any]) -> None:
    assert doc["asyncapi"] == "3.0.0"
    assert doc["info"]["title"] and doc["info"]["version"]
    assert doc["servers"]["local"]["protocol"] == "kafka"


def test_every_ref_resolves_inside_the_document(doc: dict[str, Any]) -> None:
    refs = _refs(doc)
    assert len(refs) > 50
    for _, ref in refs:
        _resolve(doc, ref)


def test_every_channel_is_a_topic_with_messages_and_kafka_bindings(doc: dict[str, Any]) -> None:
    assert set(doc["channels"]) == set(CHANNELS)
    partitions = set()
    for name, (address, _, messages) in CHANNELS.items():
        channel = doc["channels"][name]
        assert channel["address"] == address
        assert channel["messages"], f"channel {name} has no message"
        if messages is not None:
            assert set(channel["messages"]) == messages
        for ref in channel["messages"].values():
            message = _resolve(doc, ref["$ref"])
            assert "payload" in message
            key = message["bindings"]["kafka"]["key"]
            assert key["type"] == "string" and "session id" in key["description"]
        kafka = channel["bindings"]["kafka"]
        assert kafka["topic"] == address
        assert isinstance(kafka["partitions"], int) and kafka["partitions"] > 0
        policy = kafka["topicConfiguration"]["cleanup.policy"]
        assert policy == (["compact"] if name == "sessions" else ["delete"])
        if name in ("commands", "control", "sessions"):
            partitions.add(kafka["partitions"])
    assert len(partitions) == 1, "co-partitioned topics must have the same partition count"


def test_operations_say_who_sends_what(doc: dict[str, Any]) -> None:
    seen = {}
    for operation in doc["operations"].values():
        channel = _resolve(doc, operation["channel"]["$ref"])
        name = next(n for n, c in doc["channels"].items() if c is channel)
        seen[name] = operation["action"]
        for ref in operation["messages"]:
            assert ref["$ref"].startswith(f"#/channels/{name}/messages/")
            _resolve(doc, ref["$ref"])
    assert seen == {name: action for name, (_, action, _) in CHANNELS.items()}


def test_commands_results_and_events_correlate_by_command_id(doc: dict[str, Any]) -> None:
    for name, message in doc["components"]["messages"].items():
        if name in ("session_state", "dlq_record"):
            continue
        correlation = _resolve(doc, message["correlationId"]["$ref"])
        assert correlation["location"] == "$message.payload#/command_id"
        payload = _resolve(doc, message["payload"]["$ref"])
        assert "command_id" in payload["required"]


def test_dlq_headers_and_embedded_examples_validate(doc: dict[str, Any]) -> None:
    dlq = doc["components"]["messages"]["dlq_record"]
    headers = _resolve(doc, dlq["headers"]["$ref"])
    assert {"cairn.dlq.reason", "cairn.dlq.source.topic", "cairn.dlq.source.partition"} <= set(
        headers["required"]
    )
    checked = 0
    for message in doc["components"]["messages"].values():
        for example in message.get("examples", []):
            part = "headers" if message["name"] == "dlq_record" else "payload"
            schema = {"$ref": message[part]["$ref"], "components": doc["components"]}
            errors = list(Draft202012Validator(schema).iter_errors(example[part]))
            assert not errors, (message["name"], errors[0].message)
            checked += 1
    assert checked == len(doc["components"]["messages"])


def test_the_shapes_inside_open_fields_are_described_and_named_where_they_go(
    doc: dict[str, Any],
) -> None:
    schemas = doc["components"]["schemas"]
    assert {"tool_outcome_unknown_reason", "tool_outcome_answer"} <= set(schemas)
    messages = doc["components"]["messages"]
    named = {
        name: re.findall(r"`(#/components/schemas/[a-z_]+)`", message.get("description", ""))
        for name, message in messages.items()
    }
    assert named["resume"] == ["#/components/schemas/tool_outcome_answer"]
    for carrier in ("agent_result", "event.interrupt_raised", "session_state"):
        assert named[carrier] == ["#/components/schemas/tool_outcome_unknown_reason"], carrier
    for refs in named.values():
        for ref in refs:
            _resolve(doc, ref)
