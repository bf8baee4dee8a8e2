"""Bad input on the commands and control topics against a real broker and a real service process.

A record that cannot be tied to a session goes to the dead-letter topic unchanged (key, value and
headers kept; reason and source in headers); one that names its session and command id gets one
``error`` result with the documented code. Valid traffic goes on all the while.
"""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError

from service.runtime.bad_input import DEAD_LETTER_BUDGET
from service.runtime.partitioning import keyed_partition
from service.wire.dlq import (
    DLQ_CODE,
    DLQ_HEADERS_DROPPED,
    DLQ_REASON,
    DLQ_SOURCE_OFFSET,
    DLQ_SOURCE_PARTITION,
    DLQ_SOURCE_TOPIC,
    DLQ_TRUNCATED_FROM,
)
from tests.support.runtime_harness import (
    cancel,
    checkpoint_resume,
    committed_records,
    delete,
    invoke,
    resume,
    unique,
    wait_for,
)
from tests.support.stage import Stage, staged

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.timeout(120),
    pytest.mark.asyncio(loop_scope="module"),
]

STATE_LIMIT = 20_000


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stage(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stage]:
    workdir = Path(tmp_path_factory.mktemp("bad"))
    async with staged(
        kafka_bootstrap, workdir, CAIRN_RUNTIME__STATE_RECORD_MAX_BYTES=str(STATE_LIMIT)
    ) as ready:
        yield ready


async def _send(
    stage: Stage,
    key: bytes | None,
    value: bytes | None,
    topic: str,
    partition: int | None = None,
    headers: list[tuple[str, bytes | None]] | None = None,
) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=stage.cluster.bootstrap, max_request_size=2 * 1024 * 1024
    )
    await producer.start()
    try:
        await producer.send_and_wait(
            topic,
            key=key,
            value=value,
            headers=[("origin", b"test"), *(headers or [])],
            partition=partition,
        )
    finally:
        await producer.stop()


async def _dead_letter(stage: Stage, value: bytes | None, topic: str) -> dict[str, Any]:
    """Send ``value`` under a fresh key; return its one dead-letter record."""
    key = unique("k").encode()
    await _send(stage, key, value, topic)
    await wait_for(
        lambda: any(d["key"] == key for d in stage.client.dead_letters),
        30,
        f"dead letter {key!r}",
        alive=stage.service,
    )
    await stage.client.caught_up()
    letters = [d for d in stage.client.dead_letters if d["key"] == key]
    assert len(letters) == 1, letters
    letter = letters[0]
    assert letter["value"] == value
    headers = letter["headers"]
    assert headers["origin"] == b"test"
    assert headers[DLQ_SOURCE_TOPIC] == topic.encode()
    assert int(headers[DLQ_SOURCE_PARTITION]) in range(stage.cluster.partitions)
    assert int(headers[DLQ_SOURCE_OFFSET]) >= 0
    assert headers[DLQ_REASON]
    return letter


async def _dead_letter_of(stage: Stage, key: bytes, what: str) -> dict[str, Any]:
    """The first dead letter of ``key``, once it is there."""
    await wait_for(
        lambda: any(d["key"] == key for d in stage.client.dead_letters),
        30,
        what,
        alive=stage.service,
    )
    return next(d for d in stage.client.dead_letters if d["key"] == key)


async def _error(stage: Stage, body: dict[str, Any], topic: str | None = None) -> str:
    """Send ``body``; return the code of its one ``error`` result."""
    await stage.client.send(body, topic=topic)
    result = await stage.result(body["command_id"])
    assert result["stop_reason"] == "error", result
    await stage.exactly_once(body["command_id"])
    return str(result["error"]["code"])


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (b"\xff\xfe not json", "invalid_command"),
        (b"[1, 2, 3]", "invalid_command"),
        (b'"just a string"', "invalid_command"),
        (b'{"type": "invoke", "command_id": "c1", "agent": "simple", "prompt": "x"}', None),
        (b'{"type": "invoke", "session_id": "s1", "agent": "simple", "prompt": "x"}', None),
        (None, None),
        (
            b'{"type": "invoke", "command_id": "c1", "agent": "simple", "prompt": "x", '
            b'"session_id": "' + b"s" * 257 + b'"}',
            "invalid_command",
        ),
        (
            b'{"type": "invoke", "session_id": "s1", "agent": "simple", "prompt": "x", '
            b'"command_id": "' + b"c" * 100_000 + b'"}',
            "invalid_command",
        ),
    ],
    ids=[
        "not-json",
        "array",
        "string",
        "no-session",
        "no-command-id",
        "tombstone",
        "session-id-too-long",
        "command-id-too-long",
    ],
)
async def test_unaddressable_command_goes_to_the_dlq(
    stage: Stage, value: bytes | None, code: str | None
) -> None:
    letter = await _dead_letter(stage, value, stage.cluster.topics.commands)
    if code is not None:
        assert letter["headers"][DLQ_CODE] == code.encode()


@pytest.mark.parametrize(
    "value",
    [
        b"{not json",
        b'{"type": "cancel", "command_id": "x1"}',
        b'{"type": "cancel", "session_id": "s1"}',
        None,
        b'{"type": "cancel", "command_id": "x1", "session_id": "' + b"s" * 300 + b'"}',
    ],
    ids=["not-json", "no-session", "no-command-id", "tombstone", "session-id-too-long"],
)
async def test_unaddressable_control_record_goes_to_the_dlq(
    stage: Stage, value: bytes | None
) -> None:
    await _dead_letter(stage, value, stage.cluster.topics.control)


async def test_a_record_off_its_keys_partition_is_refused_and_writes_no_state(
    stage: Stage,
) -> None:
    partitions = stage.cluster.partitions
    session = unique("s")
    home = keyed_partition(session.encode(), partitions)
    elsewhere = (home + 1) % partitions
    first = invoke(session, "hello", agent="simple")
    await stage.client.send(first)
    assert (await stage.result(first["command_id"]))["stop_reason"] == "end_turn"
    misplaced = invoke(session, "again", agent="simple")
    topics = stage.cluster.topics
    for topic, body in ((topics.commands, misplaced), (topics.control, cancel(session))):
        await _send(stage, session.encode(), orjson.dumps(body), topic, partition=elsewhere)
        result = await stage.result(body["command_id"])
        assert result["stop_reason"] == "error", result
        assert result["error"]["code"] == "invalid_command"
        assert f"belongs on partition {home}" in result["error"]["message"]
        await stage.exactly_once(body["command_id"])
    # The session lives on its own partition only, and goes on from its first turn.
    records = await committed_records(stage.cluster.bootstrap, topics.sessions, partitions)
    assert {r.partition for r in records if r.key.startswith(session.encode())} == {home}
    follow = invoke(session, "and on", agent="simple")
    await stage.client.send(follow)
    assert (await stage.result(follow["command_id"]))["stop_reason"] == "end_turn"


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"type": "invoke", "agent": "simple"}, "invalid_command"),  # no prompt
        ({"type": "explode", "agent": "simple", "prompt": "x"}, "invalid_command"),
        ({"type": "invoke", "agent": "simple", "prompt": 42}, "invalid_command"),
        ({"type": "invoke", "agent": "nobody", "prompt": "x"}, "unknown_agent"),
        ({"type": "cancel"}, "invalid_command"),  # a cancel on the commands topic
        (
            {
                "type": "resume",
                "resume": [{"interruptResponse": {"interruptId": "i", "response": 1}}],
            },
            "no_pending_interrupt",
        ),
    ],
    ids=["no-prompt", "unknown-type", "prompt-shape", "unknown-agent", "misplaced", "no-pending"],
)
async def test_invalid_command_with_ids_gets_an_error_result(
    stage: Stage, fields: dict[str, Any], code: str
) -> None:
    s = unique("s")
    body = {"schema_version": 1, "command_id": unique("c"), "session_id": s, **fields}
    if fields.get("type") == "resume":
        # A session that exists but has nothing pending.
        first = invoke(s, "hello", agent="simple")
        await stage.client.send(first)
        await stage.result(first["command_id"])
    assert await _error(stage, body) == code


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (
            {
                "checkpointResume": {
                    "checkpoint": {
                        "position": "after_model",
                        "cycle_index": 0,
                        "schema_version": "1.0",
                    }
                }
            },
            "checkpoint_stale",
        ),
        ([{"interruptResponse": {"interruptId": "i", "response": 1}}], "no_pending_interrupt"),
    ],
    ids=["checkpoint", "answers"],
)
async def test_a_resume_naming_no_agent_of_a_session_without_state_has_nothing_to_resume(
    stage: Stage, payload: Any, code: str
) -> None:
    # Never invoked, then deleted: both have no state, and the resume names no agent to ask.
    never = resume(unique("s"), payload)
    assert await _error(stage, never) == code
    s = unique("s")
    first = invoke(s, "hello", agent="simple")
    await stage.client.send(first)
    await stage.result(first["command_id"])
    gone = delete(s)
    await stage.client.send(gone)
    assert (await stage.result(gone["command_id"]))["deleted"]["existed"] is True
    after = resume(s, payload)
    await stage.client.send(after)
    result = await stage.result(after["command_id"])
    assert result["error"]["code"] == code, result
    assert "has no state" in result["error"]["message"]


async def test_key_other_than_the_session_is_refused(stage: Stage) -> None:
    body = invoke(unique("s"), "hello", agent="simple")
    await stage.client.send_raw(unique("k").encode(), orjson.dumps(body))
    result = await stage.result(body["command_id"])
    assert result["error"]["code"] == "invalid_command", result


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"type": "cancel", "after_current_tools": "yes"}, "invalid_command"),
        ({"type": "invoke", "agent": "simple", "prompt": "x"}, "invalid_command"),
    ],
    ids=["field-type", "invoke-on-control"],
)
async def test_invalid_cancel_with_ids_gets_an_error_result(
    stage: Stage, fields: dict[str, Any], code: str
) -> None:
    body = {"schema_version": 1, "command_id": unique("x"), "session_id": unique("s"), **fields}
    assert await _error(stage, body, stage.cluster.topics.control) == code


async def test_a_cancel_targeting_itself_is_refused_with_one_result(stage: Stage) -> None:
    # Answered as its own target it would get two results under one command id.
    own = unique("x")
    body = cancel(unique("s"), command_id=own, target_command_id=own)
    assert await _error(stage, body, stage.cluster.topics.control) == "invalid_command"


async def _checkpoint_pause(stage: Stage) -> tuple[str, dict[str, Any]]:
    s = unique("s")
    first = invoke(s, "go", agent="bench")
    await stage.client.send(first)
    paused = await stage.result(first["command_id"])
    assert paused["stop_reason"] == "checkpoint", paused
    return s, paused["checkpoint"]


async def test_checkpoint_resume_errors_in_the_documented_order(stage: Stage) -> None:
    s, checkpoint = await _checkpoint_pause(stage)
    wrapped = resume(s, [{"checkpointResume": {"checkpoint": checkpoint}}])
    assert await _error(stage, wrapped) == "checkpoint_incompatible"
    malformed = resume(s, {"checkpointResume": {"point": checkpoint}})
    assert await _error(stage, malformed) == "checkpoint_incompatible"
    newer = checkpoint_resume(s, {**checkpoint, "schema_version": "2.0"})
    assert await _error(stage, newer) == "checkpoint_incompatible"
    stale = checkpoint_resume(s, {**checkpoint, "cycle_index": checkpoint["cycle_index"] + 5})
    assert await _error(stage, stale) == "checkpoint_stale"
    # None of it changed the session: the real checkpoint still resumes.
    good = checkpoint_resume(s, checkpoint)
    await stage.client.send(good)
    assert (await stage.result(good["command_id"]))["stop_reason"] == "checkpoint"

    # Checkpointing off comes before a malformed payload.
    plain = unique("s")
    first = invoke(plain, "hello", agent="simple")
    await stage.client.send(first)
    await stage.result(first["command_id"])
    wrapped = resume(plain, [{"checkpointResume": {"checkpoint": checkpoint}}])
    assert await _error(stage, wrapped) == "checkpointing_disabled"
    malformed = resume(plain, {"checkpointResume": "nope"})
    assert await _error(stage, malformed) == "checkpointing_disabled"

    # A pending interrupt comes first of all.
    asked = unique("s")
    first = invoke(asked, "go", agent="approval", checkpointing=True)
    await stage.client.send(first)
    paused = await stage.result(first["command_id"])
    assert paused["stop_reason"] == "checkpoint", paused
    go_on = checkpoint_resume(asked, paused["checkpoint"])
    await stage.client.send(go_on)
    assert (await stage.result(go_on["command_id"]))["stop_reason"] == "interrupt"
    # Checkpointing is on for this turn, so only the pending interrupt can explain these.
    wrapped = resume(asked, [{"checkpointResume": {"checkpoint": checkpoint}}])
    assert await _error(stage, wrapped) == "interrupt_pending"
    malformed = resume(asked, {"checkpointResume": {}})
    assert await _error(stage, malformed) == "interrupt_pending"


async def test_a_session_grows_past_the_record_limit(stage: Stage) -> None:
    """History is stored a message per record: a conversation larger than any one record
    takes command after command."""
    s = unique("s")
    first = invoke(s, "hello", agent="simple")
    await stage.client.send(first)
    await stage.result(first["command_id"])
    # Incompressible (history is stored compressed), each prompt under the record limit, which
    # a command must fit too; together three times over it.
    half = STATE_LIMIT * 6 // 10
    for _ in range(5):
        grown = invoke(s, base64.b64encode(os.urandom(half)).decode(), agent="simple")
        await stage.client.send(grown)
        result = await stage.result(grown["command_id"])
        assert result["stop_reason"] == "end_turn", result
    after = invoke(s, "again", agent="simple")
    await stage.client.send(after)
    result = await stage.result(after["command_id"])
    assert result["stop_reason"] == "end_turn", result
    assert result["message"]["content"][0]["text"] == "done turn 7"


async def test_valid_traffic_still_flows(stage: Stage) -> None:
    commands = [invoke(unique("s"), "hello", agent="simple") for _ in range(4)]
    await stage.client.send(*commands)
    for command in commands:
        assert (await stage.result(command["command_id"]))["stop_reason"] == "end_turn"
    assert stage.service.log_count("Traceback") == 0, stage.service.text()[-3000:]


async def test_the_largest_record_the_broker_takes_is_dead_lettered(stage: Stage) -> None:
    """Its dead letter, with Cairn's headers added, is larger than the record itself."""
    key = unique("k").encode()
    size = 1_048_576
    while True:  # find the broker's limit for this record (a few tries, 16 bytes apart)
        try:
            await _send(stage, key, b"\x00" * size, stage.cluster.topics.commands)
            break
        except MessageSizeTooLargeError:
            size -= 16
    letter = await _dead_letter_of(stage, key, "dead letter of the largest record")
    # Too large to keep whole: a prefix, the original length in a header, the rest intact.
    assert letter["headers"][DLQ_TRUNCATED_FROM] == str(size).encode()
    assert 0 < len(letter["value"]) <= DEAD_LETTER_BUDGET
    assert letter["value"] == b"\x00" * len(letter["value"])
    assert letter["headers"]["origin"] == b"test"
    assert letter["headers"][DLQ_SOURCE_TOPIC] == stage.cluster.topics.commands.encode()
    assert stage.service.log_count("partition owner failed") == 0
    # The partition is not blocked: a command behind it (same key, same partition) is answered.
    after = invoke(key.decode(), "hello", agent="simple")
    await stage.client.send(after)
    assert (await stage.result(after["command_id"]))["stop_reason"] == "end_turn"


async def test_a_small_record_with_a_megabyte_of_headers_keeps_its_value_and_first_headers(
    stage: Stage,
) -> None:
    """Headers too large to keep all: the value stays whole and is not called cut."""
    key = unique("k").encode()
    big = [(f"h{i}", b"y" * 100_000) for i in range(10)]
    await _send(stage, key, b"not json at all", stage.cluster.topics.commands, headers=big)
    letter = await _dead_letter_of(stage, key, "dead letter with huge headers")
    assert letter["value"] == b"not json at all"
    headers = letter["headers"]
    assert DLQ_TRUNCATED_FROM not in headers
    assert headers[DLQ_HEADERS_DROPPED] == b"1"
    assert headers["origin"] == b"test"
    assert [headers[f"h{i}"] for i in range(9)] == [b"y" * 100_000] * 9
    assert "h9" not in headers
    assert headers[DLQ_SOURCE_TOPIC] == stage.cluster.topics.commands.encode()


@pytest.mark.parametrize(
    ("topic", "value"),
    [("commands", b"not json"), ("control", b'{"type": "cancel", "session_id": "s1"}')],
)
async def test_a_header_without_a_value_is_dead_lettered_with_the_record(
    stage: Stage, topic: str, value: bytes
) -> None:
    """Kafka allows a header whose value is null: the dead letter keeps it as it came, and the
    partition goes on (a command behind it, on the same partition, is answered)."""
    key = unique("k").encode()
    source = getattr(stage.cluster.topics, topic)
    await _send(stage, key, value, source, headers=[("empty", None), ("after", b"1")])
    letter = await _dead_letter_of(stage, key, "dead letter with a null header")
    assert letter["value"] == value
    headers = letter["headers"]
    assert "empty" in headers and headers["empty"] is None
    assert headers["after"] == b"1" and headers[DLQ_SOURCE_TOPIC] == source.encode()
    after = invoke(key.decode(), "hello", agent="simple")
    await _send(
        stage, key, orjson.dumps(after), stage.cluster.topics.commands, headers=[("h", None)]
    )
    assert (await stage.result(after["command_id"]))["stop_reason"] == "end_turn"
    assert stage.service.log_count("partition owner failed") == 0
