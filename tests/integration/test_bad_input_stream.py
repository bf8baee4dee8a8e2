"""A generated stream of random and mutated records into the commands and control topics while
valid traffic flows: the service never restarts anything, every valid command is answered exactly
once, and every invalid record is accounted for exactly once (a dead letter or a result).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from service.wire.dlq import DLQ_SOURCE_OFFSET, DLQ_SOURCE_PARTITION, DLQ_SOURCE_TOPIC
from tests.support.runtime_harness import invoke, wait_for
from tests.support.stage import Stage, staged

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.timeout(180),
    pytest.mark.asyncio(loop_scope="module"),
]

GENERATED = 150
_RUN = uuid.uuid4().hex[:8]
_serials = itertools.count()
VALID_EVERY = 5

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


def _generate(count: int) -> list[tuple[str, bytes | None, bytes]]:
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

    collect()
    return drawn


@dataclass
class Sent:
    topic: str
    partition: int
    offset: int
    ids: tuple[str, str] | None
    """(session_id, command_id) when the value holds both as strings: it may earn a result."""


def _ids(value: bytes) -> tuple[str, str] | None:
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


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stage(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stage]:
    workdir = Path(tmp_path_factory.mktemp("stream"))
    async with staged(kafka_bootstrap, workdir) as ready:
        yield ready


async def test_random_and_mutated_records_amid_valid_traffic(stage: Stage) -> None:
    producer = stage.client._producer
    assert producer is not None
    topics = {"commands": stage.cluster.topics.commands, "control": stage.cluster.topics.control}
    sent: list[Sent] = []
    valid: list[str] = []
    for i, (name, key, value) in enumerate(_generate(GENERATED)):
        if i % VALID_EVERY == 0:
            command = invoke(f"ok-{uuid.uuid4()}", "hello", agent="simple")
            await stage.client.send(command)
            valid.append(command["command_id"])
        meta = await producer.send_and_wait(topics[name], key=key, value=value)
        sent.append(Sent(topics[name], meta.partition, meta.offset, _ids(value)))

    def letters(item: Sent) -> int:
        return sum(
            1
            for d in stage.client.dead_letters
            if d["headers"][DLQ_SOURCE_TOPIC] == item.topic.encode()
            and int(d["headers"][DLQ_SOURCE_PARTITION]) == item.partition
            and int(d["headers"][DLQ_SOURCE_OFFSET]) == item.offset
        )

    def answers(item: Sent) -> int:
        if item.ids is None:
            return 0
        session_id, command_id = item.ids
        return sum(
            1
            for r in stage.client.results
            if r["session_id"] == session_id and r["command_id"] == command_id
        )

    def unaccounted() -> list[Sent]:
        return [item for item in sent if letters(item) + answers(item) == 0]

    await wait_for(
        lambda: all(stage.client.results_for(c) for c in valid) and not unaccounted(),
        90,
        "every record accounted for",
        on_timeout=lambda: f"{unaccounted()[:5]}\n{stage.service.text()[-3000:]}",
        alive=stage.service,
    )
    await stage.client.caught_up()
    for command_id in valid:
        results = stage.client.results_for(command_id)
        assert [r["stop_reason"] for r in results] == ["end_turn"], results
    for item in sent:
        assert letters(item) + answers(item) == 1, item
    log = stage.service.text()
    assert "partition owner failed" not in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
