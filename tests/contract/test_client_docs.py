"""docs/clients.md shows only commands Cairn accepts and names only example files that exist."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

from service.wire.codec import decode_command, decode_control

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "clients.md").read_text()
BLOCKS = re.findall(r"```json\n(.*?)```", DOC, flags=re.S)
COMPLETE = [b for b in BLOCKS if "..." not in b]


def test_every_example_file_named_in_the_guide_exists() -> None:
    named = set(re.findall(r"`((?:[a-z_.]+)/[a-z0-9-]+\.json)`", DOC))
    assert len(named) >= 8
    for rel in named:
        assert (REPO / "contracts" / "examples" / rel).is_file(), rel


@pytest.mark.parametrize("block", [b for b in COMPLETE if '"type": "' in b])
def test_every_complete_command_in_the_guide_is_accepted(block: str) -> None:
    body = orjson.loads(block)
    value = orjson.dumps(body)
    command = decode_control(value) if body["type"] == "cancel" else decode_command(value)
    assert command.type == body["type"]


def test_the_guide_shows_the_same_commands_as_the_examples() -> None:
    for rel in (
        "invoke/text-prompt.json",
        "resume/checkpoint.json",
        "resume/interrupt-answers.json",
        "resume/tool-outcome-result.json",
        "delete/session.json",
        "history/newest.json",
        "fork/at-version.json",
    ):
        example = orjson.loads((REPO / "contracts" / "examples" / rel).read_bytes())
        shown = [
            orjson.loads(b) for b in COMPLETE if f'"command_id": "{example["command_id"]}"' in b
        ]
        assert shown, rel
        assert {k: v for k, v in example.items() if k != "metadata"} == {
            k: v for k, v in shown[0].items() if k != "metadata"
        }


def test_every_dead_letter_header_in_the_guide_is_in_the_published_schema() -> None:
    named = set(re.findall(r"`(cairn\.dlq\.[a-z_.]+)`", DOC))
    assert "cairn.dlq.truncated_from" in named
    schema = orjson.loads((REPO / "contracts" / "schemas" / "dlq_headers.json").read_bytes())
    assert named <= set(schema["properties"])


def test_the_guide_states_the_exact_integer_range_and_the_service_keeps_it() -> None:
    found = re.search(r"An integer from `(-?\d+)` to\s+`(\d+)`", DOC)
    assert found, "the guide states the range of exact integers"
    lowest, highest = (int(bound) for bound in found.groups())
    assert (lowest, highest) == (-(2**63), 2**64 - 1)
    body = {"type": "invoke", "command_id": "c", "session_id": "s", "agent": "a", "prompt": "hi"}
    edges = {"lowest": lowest, "highest": highest}
    beyond = b'{"below": %d, "above": %d}' % (lowest - 1, highest + 1)
    command = decode_command(orjson.dumps({**body, "metadata": edges}))
    assert command.metadata == edges
    assert all(type(value) is int for value in command.metadata.values())
    outside = decode_command(orjson.dumps(body)[:-1] + b', "metadata": ' + beyond + b"}")
    assert all(type(value) is float for value in outside.metadata.values())
