"""Hostile records for the commands and control topics, and how each must be accounted for.

Generated from valid commands mutated (a field dropped, set to any JSON value or retyped, the
body wrapped in a list, bytes cut off or flipped) and from random bytes under random keys. The
contract (docs/clients.md, "Errors"): every such record gets exactly one answer, a result under
its own session and command ids when it names both, or else one dead letter naming its topic,
partition and offset, and its partition goes on.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from service.wire.dlq import DLQ_SOURCE_OFFSET, DLQ_SOURCE_PARTITION, DLQ_SOURCE_TOPIC

_RUN = uuid.uuid4().hex[:8]
_serials = itertools.count()

json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=6,
)


@st.composite
def _base(draw: st.DrawFn) -> dict[str, Any]:
    # Unique ids from outside the strategy (generated examples often repeat drawn values), of a
    # fixed length so the draws that follow never depend on them.
    serial = next(_serials)
    session_id, command_id = f"s-{_RUN}-{serial:08d}", f"c-{_RUN}-{serial:08d}"
    kind = draw(st.sampled_from(["invoke", "resume", "cancel"]))
    body: dict[str, Any] = {
        "type": kind,
        "schema_version": 1,
        "command_id": command_id,
        "session_id": session_id,
    }
    if kind == "invoke":
        body.update(agent=draw(st.sampled_from(["simple", "bench", "nobody"])), prompt="hi")
    elif kind == "resume":
        checkpoint = {"position": "after_model", "cycle_index": 0, "schema_version": "1.0"}
        body["resume"] = draw(
            st.sampled_from(
                [
                    {"checkpointResume": {"checkpoint": checkpoint}},
                    [{"checkpointResume": {"checkpoint": checkpoint}}],
                    [{"interruptResponse": {"interruptId": "i", "response": 1}}],
                ]
            )
        )
    else:
        body.update(message="stop", after_current_tools=draw(st.booleans()))
    return body


@st.composite
def _mutated(draw: st.DrawFn) -> tuple[bytes | None, bytes]:
    body = draw(_base())
    key = body["session_id"].encode()
    how = draw(st.sampled_from(["drop", "set", "type", "wrap", "extra", "truncate", "flip"]))
    if how == "drop":
        del body[draw(st.sampled_from(sorted(body)))]
    elif how == "set":
        body[draw(st.sampled_from(sorted(body)))] = draw(json_value)
    elif how == "type":
        body["type"] = draw(st.text(max_size=10))
    elif how == "extra":
        body[draw(st.text(min_size=1, max_size=8))] = draw(json_value)
    raw = orjson.dumps([body] if how == "wrap" else body)
    if how == "truncate":
        raw = raw[: draw(st.integers(0, len(raw) - 1))]
    elif how == "flip":
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1 :]
    return key, raw


records = st.tuples(
    st.sampled_from(["commands", "control"]),
    st.one_of(
        _mutated(),
        st.tuples(st.none() | st.binary(max_size=16), st.binary(max_size=64)),
    ),
)


def generate(count: int, seeded: int | None = None) -> list[tuple[str, bytes | None, bytes]]:
    """``count`` hostile records: (``commands`` or ``control``, key, value); the same ones again
    for the same ``seeded`` (but for the ids, unique to each process)."""
    drawn: list[tuple[str, bytes | None, bytes]] = []

    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(records)
    def collect(record: tuple[str, tuple[bytes | None, bytes]]) -> None:
        topic, (key, value) = record
        drawn.append((topic, key, value))

    (collect if seeded is None else seed(seeded)(collect))()
    return drawn


REFUSED: dict[str, dict[str, Any]] = {
    "unknown_agent": {"type": "invoke", "agent": "nobody", "prompt": "hi"},
    "checkpointing_disabled": {
        "type": "resume",
        "resume": {
            "checkpointResume": {
                "checkpoint": {"position": "after_model", "cycle_index": 0, "schema_version": "1.0"}
            }
        },
    },
    "no_pending_interrupt": {
        "type": "resume",
        "resume": [{"interruptResponse": {"interruptId": "i", "response": 1}}],
    },
    "invalid_command": {"type": "invoke", "prompt": "hi", "agent": 7},
}
"""Commands a running session without checkpointing or interrupts (the load's) must refuse,
by the code they must get, and what each holds besides its ids."""


def refused(session_id: str, code: str) -> tuple[bytes, bytes]:
    """A command of ``session_id`` it must refuse with ``code`` (a key and a value)."""
    serial = next(_serials)
    body = {
        "schema_version": 1,
        "command_id": f"r-{_RUN}-{serial:08d}",
        "session_id": session_id,
        **REFUSED[code],
    }
    return session_id.encode(), orjson.dumps(body)


@dataclass
class Sent:
    """A hostile record as the broker took it."""

    topic: str
    partition: int
    offset: int
    ids: tuple[str, str] | None
    """(session_id, command_id) when the value holds both as strings: it may earn a result."""
    code: str | None = None
    """The error code its result must carry, for a command that must be refused."""


def ids_of(value: bytes) -> tuple[str, str] | None:
    """The session and command ids a record's value names, if it is an object naming both."""
    try:
        raw = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(raw, dict):
        return None
    session_id, command_id = raw.get("session_id"), raw.get("command_id")
    if isinstance(session_id, str) and isinstance(command_id, str):
        return session_id, command_id
    return None


def source_of(dead_letter: dict[str, Any]) -> tuple[str, int, int]:
    """The topic, partition and offset a dead letter (as the harness client reads it) names."""
    headers = dead_letter["headers"]
    return (
        headers[DLQ_SOURCE_TOPIC].decode(),
        int(headers[DLQ_SOURCE_PARTITION]),
        int(headers[DLQ_SOURCE_OFFSET]),
    )


def answers_of(
    sent: Iterable[Sent], results: Iterable[dict[str, Any]], dead_letters: Iterable[dict[str, Any]]
) -> list[tuple[Sent, int]]:
    """Each hostile record with how many answers it got (results under its ids, dead letters
    naming it): the contract wants exactly one each."""
    letters: dict[tuple[str, int, int], int] = {}
    for letter in dead_letters:
        source = source_of(letter)
        letters[source] = letters.get(source, 0) + 1
    answered: dict[tuple[str, str], int] = {}
    for result in results:
        pair = (result["session_id"], result["command_id"])
        answered[pair] = answered.get(pair, 0) + 1
    return [
        (
            item,
            letters.get((item.topic, item.partition, item.offset), 0)
            + (answered.get(item.ids, 0) if item.ids is not None else 0),
        )
        for item in sent
    ]
