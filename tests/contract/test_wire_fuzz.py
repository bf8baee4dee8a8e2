"""Random and mutated bytes never make the decoders raise anything but WireError."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.wire.codec import decode_command, decode_control, decode_event, decode_result
from service.wire.errors import WireError

EXAMPLES = Path(__file__).resolve().parents[2] / "contracts" / "examples"
SEEDS = [p.read_bytes() for p in sorted(EXAMPLES.glob("*/*.json"))]
DECODERS: list[Callable[[bytes], Any]] = [
    decode_command,
    decode_control,
    decode_result,
    decode_event,
]
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
KEYS = [
    "type",
    "schema_version",
    "command_id",
    "session_id",
    "agent",
    "prompt",
    "resume",
    "limits",
    "checkpointResume",
    "checkpoint",
    "interruptResponse",
    "interruptId",
    "stop_reason",
    "seq",
]


def _dumps(value: Any) -> bytes:
    # The stdlib encoder also writes integers beyond 64 bits, which the decoder must survive.
    return json.dumps(value).encode()


def only_wire_errors(value: bytes) -> None:
    for decode in DECODERS:
        try:
            decode(value)
        except WireError as error:
            assert error.reason
            assert error.code in ("invalid_command", "checkpoint_incompatible")


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes(value: bytes) -> None:
    only_wire_errors(value)


@FUZZ
@given(st.sampled_from(SEEDS), st.data())
def test_mutated_examples(seed: bytes, data: st.DataObject) -> None:
    value = bytearray(seed)
    for _ in range(data.draw(st.integers(1, 6))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = data.draw(st.integers(0, max(len(value) - 1, 0)))
        if op == "flip" and value:
            value[at] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del value[at : at + data.draw(st.integers(1, 20))]
        else:
            value[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    only_wire_errors(bytes(value))


def _replace_somewhere(node: Any, path: list[int], new: Any) -> Any:
    if not path or not isinstance(node, dict | list) or not node:
        return new
    if isinstance(node, dict):
        key = list(node)[path[0] % len(node)]
        return {**node, key: _replace_somewhere(node[key], path[1:], new)}
    index = path[0] % len(node)
    return [*node[:index], _replace_somewhere(node[index], path[1:], new), *node[index + 1 :]]


@FUZZ
@given(
    st.sampled_from(SEEDS),
    st.lists(st.integers(0, 50), max_size=6),
    json_values,
    st.sampled_from(KEYS),
)
def test_structurally_mutated_examples(seed: bytes, path: list[int], new: Any, key: str) -> None:
    body = orjson.loads(seed)
    mutated = _replace_somewhere(body, path, new)
    only_wire_errors(_dumps(mutated))
    if isinstance(body, dict):
        only_wire_errors(_dumps({**body, key: new}))
        only_wire_errors(_dumps({k: v for k, v in body.items() if k != key}))
