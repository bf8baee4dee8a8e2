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
