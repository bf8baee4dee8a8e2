"""The decoder accepts exactly what the published JSON Schemas accept.

A client that validates its commands against ``contracts/schemas`` must never meet a refusal the
schema did not predict, and a command the schema refuses must not run. Every example of every
command is mutated at every field (each value replaced by one of each JSON type, or left out),
and each mutation is put to both the schema (with the jsonschema package) and the codec.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator

from service.wire.codec import decode_command, decode_control
from service.wire.errors import WireError

CONTRACTS = Path(__file__).resolve().parents[2] / "contracts"
LEFT_OUT = object()
REPLACEMENTS: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    -1,
    1.5,
    2**63,
    "",
    "1",
    "x",
    [],
    [1],
    {},
    {"a": 1},
    LEFT_OUT,
]
COMMANDS: dict[str, Callable[[bytes], Any]] = {
    "invoke": decode_command,
    "resume": decode_command,
    "delete": decode_command,
    "history": decode_command,
    "fork": decode_command,
    "cancel": decode_control,
}


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if path:
        yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*path, index))


def _replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    value = copy.deepcopy(value)
    parent = value
    for step in path[:-1]:
        parent = parent[step]
    if new is LEFT_OUT:
        del parent[path[-1]]
    else:
        parent[path[-1]] = new
    return value


def _decodes(decode: Callable[[bytes], Any], value: Any) -> bool:
    try:
        decode(orjson.dumps(value))
    except WireError:
        return False
    return True


@pytest.mark.parametrize("kind", sorted(COMMANDS))
def test_the_decoder_and_the_schema_agree_on_every_mutated_example(kind: str) -> None:
    schema = orjson.loads((CONTRACTS / "schemas" / f"{kind}.json").read_bytes())
    validator = Draft202012Validator(schema)
    examples = sorted((CONTRACTS / "examples" / kind).glob("*.json"))
    assert examples
    disagreements = []
    tried = 0
    for example in examples:
        base = orjson.loads(example.read_bytes())
        for path in _paths(base):
            for new in REPLACEMENTS:
                value = _replaced(base, path, new)
                tried += 1
                by_schema, by_decoder = validator.is_valid(value), _decodes(COMMANDS[kind], value)
                if by_schema != by_decoder:
                    shown = "left out" if new is LEFT_OUT else repr(new)
                    disagreements.append(
                        f"{example.name} {'.'.join(map(str, path))} = {shown}: "
                        f"schema {'accepts' if by_schema else 'refuses'}, "
                        f"decoder {'accepts' if by_decoder else 'refuses'}"
                    )
    assert tried > 100
    assert not disagreements, "\n".join(disagreements)


# Prompts a client may build by hand, half message and half block: the keys of a message are
# never a content block's, so each is refused by both (naming the key it lacks), or accepted by
# both.
PROMPTS: list[tuple[Any, bool]] = [
    ([{"role": "user"}], False),
    ([{"content": [{"text": "hi"}]}], False),
    ([{"text": "hi"}, {"content": "hi"}], False),
    ([{"role": "user", "content": [{"role": "user"}]}], False),
    ([{"role": "user", "content": [{"content": [{"text": "hi"}]}]}], False),
    ([{"role": "user", "content": [{"text": "hi"}]}], True),
    ([{"text": "hi"}, {"image": {"format": "png", "source": {"bytes": "AA=="}}}], True),
]


@pytest.mark.parametrize(("prompt", "valid"), PROMPTS)
def test_the_decoder_and_the_schema_agree_on_prompts_mixing_messages_and_blocks(
    prompt: Any, valid: bool
) -> None:
    schema = orjson.loads((CONTRACTS / "schemas" / "invoke.json").read_bytes())
    command = {
        "type": "invoke",
        "schema_version": 1,
        "command_id": "c-1",
        "session_id": "s-1",
        "agent": "demo",
        "prompt": prompt,
    }
    assert Draft202012Validator(schema).is_valid(command) is valid
    assert _decodes(decode_command, command) is valid
