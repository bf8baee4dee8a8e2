"""The record limit on a real broker: no command and no output, however large, stops a partition.

A command value up to the limit is run and answered (echoed metadata is left out, and flagged,
when it would make the result too large); one over it is dead-lettered unread; one the broker
barely accepts is dead-lettered cut to fit. An output the broker refuses for good is replaced by
a dead letter of the command and a small error result, and the partition answers what follows.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from service.wire.dlq import DLQ_CODE, DLQ_REASON, DLQ_TRUNCATED_FROM
from tests.support.runtime_harness import (
    Client,
    Cluster,
    invoke,
    last_stored_session,
    metric_total,
    services,
    unique,
    wait_for,
)
from tests.support.stage import Stage, staged

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.timeout(180),
    pytest.mark.asyncio(loop_scope="module"),
]

LIMIT = 900_000
"""The default record limit (``runtime.state_record_max_bytes``)."""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stage(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stage]:
    async with staged(kafka_bootstrap, Path(tmp_path_factory.mktemp("limits"))) as ready:
        yield ready


def sized_invoke(session_id: str, size: int) -> tuple[dict[str, Any], bytes]:
    """An invoke of the ``simple`` agent whose encoded value is exactly ``size`` bytes."""
    body = invoke(session_id, "hello", agent="simple", metadata={"pad": ""})
    base = len(orjson.dumps(body))
    body["metadata"]["pad"] = "x" * (size - base)
    value = orjson.dumps(body)
    assert len(value) == size
    return body, value


async def _limit_topics(bootstrap: str, limits: dict[str, int]) -> None:
    """Set each topic's ``max.message.bytes``: a topic that takes less than Cairn's limit."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.alter_configs(
            [
                ConfigResource(
                    ConfigResourceType.TOPIC, topic, configs={"max.message.bytes": str(limit)}
                )
                for topic, limit in limits.items()
            ]
        )
    finally:
        await admin.close()


async def send_raw(bootstrap: str, topic: str, key: bytes, value: bytes) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=2 * 1024 * 1024)
    await producer.start()
    try:
        await producer.send_and_wait(topic, key=key, value=value)
    finally:
        await producer.stop()


async def test_commands_around_the_limit_never_stop_the_partition(stage: Stage) -> None:
    session = unique("s")
    topics = stage.cluster.topics
    at_limit, at_limit_value = sized_invoke(session, LIMIT - 1)
    over, over_value = sized_invoke(session, LIMIT + 1)
    huge, huge_value = sized_invoke(session, 1_048_000)
    after = invoke(session, "still there?", agent="simple")
    for value in (at_limit_value, over_value, huge_value):
        await send_raw(stage.cluster.bootstrap, topics.commands, session.encode(), value)
    await stage.client.send(after)

    answered = await stage.result(at_limit["command_id"], timeout=60)
    assert answered["stop_reason"] == "end_turn"
    assert answered["metadata"] == {}
    assert answered["metadata_truncated"] is True
    assert (await stage.result(after["command_id"], timeout=60))["stop_reason"] == "end_turn"

    await wait_for(
        lambda: len([d for d in stage.client.dead_letters if d["key"] == session.encode()]) == 2,
        30,
        "two dead letters",
        alive=stage.service,
    )
    await stage.client.caught_up()
    over_dlq, huge_dlq = [d for d in stage.client.dead_letters if d["key"] == session.encode()]
    assert over_dlq["value"] == over_value
    assert b"exceeds the limit of 900000" in over_dlq["headers"][DLQ_REASON]
    assert DLQ_TRUNCATED_FROM not in over_dlq["headers"]
    assert huge_dlq["headers"][DLQ_TRUNCATED_FROM] == b"1048000"
    assert huge_value.startswith(huge_dlq["value"])
    assert stage.client.results_for(over["command_id"]) == []
    assert stage.client.results_for(huge["command_id"]) == []
    await stage.exactly_once(at_limit["command_id"], after["command_id"])


async def test_a_cancel_over_the_limit_is_dead_lettered_unread(stage: Stage) -> None:
    session = unique("s")
    cancel = {
        "type": "cancel",
        "schema_version": 1,
        "command_id": unique("x"),
        "session_id": session,
        "message": "",
    }
    cancel["message"] = "x" * (LIMIT + 1 - len(orjson.dumps(cancel)))
    value = orjson.dumps(cancel)
    assert len(value) == LIMIT + 1
    await send_raw(stage.cluster.bootstrap, stage.cluster.topics.control, session.encode(), value)
    await wait_for(
        lambda: any(d["key"] == session.encode() for d in stage.client.dead_letters),
        30,
        "the cancel dead-lettered",
        alive=stage.service,
    )
    await stage.client.caught_up()
    [letter] = [d for d in stage.client.dead_letters if d["key"] == session.encode()]
    assert b"exceeds the limit of 900000" in letter["headers"][DLQ_REASON]
    assert stage.client.results_for(cancel["command_id"]) == []


async def test_an_output_the_broker_refuses_is_answered_small_and_the_partition_goes_on(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    cluster = Cluster(kafka_bootstrap, tmp_path, partitions=1)
    await cluster.create_topics()
    # A results topic that takes less than Cairn's record limit: a 150 kB result passes every
    # check of Cairn's and is refused by the broker.
    await _limit_topics(kafka_bootstrap, {cluster.topics.results: 100_000})
    session, other = unique("s"), unique("s")
    refused, _ = sized_invoke(session, 150_000)
    beside = invoke(other, "same batch", agent="simple")
    later = invoke(session, "and after", agent="simple")
    with services() as procs:
        proc = cluster.start(CAIRN_AGENTS="tests.support.cancel_agents:registry")
        procs.append(proc)
        await proc.wait_ready()
        async with Client(cluster) as client:
            await client.send(refused, beside)
            error = await client.result(refused["command_id"], 60, alive=proc, on_timeout=proc.text)
            assert error["stop_reason"] == "error"
            assert error["error"]["code"] == "internal"
            assert "refused by the broker" in error["error"]["message"]
            assert error["metadata"] == {}
            assert error["metadata_truncated"] is True
            ok = await client.result(beside["command_id"], 60, alive=proc)
            assert ok["stop_reason"] == "end_turn"

            await client.send(later)
            after = await client.result(later["command_id"], 60, alive=proc)
            assert after["stop_reason"] == "end_turn"
            # The refused command left only its mark in the session, so the next turn's history
            # holds that turn alone and a re-read of the refused command is not run again.
            stored = await last_stored_session(cluster, session)
            assert len(stored.state.messages) == 2
            assert stored.delivery.answered(refused["command_id"])

            await wait_for(lambda: bool(client.dead_letters), 30, "dead letter", alive=proc)
            await client.caught_up()
            [letter] = client.dead_letters
            assert orjson.loads(letter["value"])["command_id"] == refused["command_id"]
            assert letter["headers"][DLQ_CODE] == b"internal"
            for command in (refused, beside, later):
                assert len(client.results_for(command["command_id"])) == 1
            # The metrics count what was published: the error result and the dead letter that
            # replaced the refused output, not the end of turn the broker refused.
            counted = {
                (family, tuple(labels.items())): await metric_total(proc, family, labels)
                for family, labels in (
                    ("cairn_results", {"stop_reason": "end_turn"}),
                    ("cairn_results", {"stop_reason": "error"}),
                    ("cairn_result_errors", {"code": "internal"}),
                    ("cairn_dlq_records", {"reason": "internal"}),
                    ("cairn_commands", {"type": "invoke", "outcome": "ok"}),
                    ("cairn_commands", {"type": "invoke", "outcome": "error"}),
                )
            }
            assert list(counted.values()) == [2, 1, 1, 1, 2, 1], counted
        assert proc.alive, proc.text()[-3000:]


async def test_an_output_refused_with_its_dead_letter_is_still_answered(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The results topic refuses the result and the dead-letter topic the dead letter (both
    take less than the command's record): the command is answered with the small error result
    alone, and the session is left as it was before the command."""
    cluster = Cluster(kafka_bootstrap, tmp_path, partitions=1)
    await cluster.create_topics()
    await _limit_topics(
        kafka_bootstrap, {cluster.topics.results: 100_000, cluster.topics.dlq: 50_000}
    )
    session = unique("s")
    first = invoke(session, "before", agent="simple")
    refused, _ = sized_invoke(session, 150_000)
    later = invoke(session, "and after", agent="simple")
    with services() as procs:
        proc = cluster.start(CAIRN_AGENTS="tests.support.cancel_agents:registry")
        procs.append(proc)
        await proc.wait_ready()
        async with Client(cluster) as client:
            await client.send(first)
            assert (await client.result(first["command_id"], 60, alive=proc))["stop_reason"] == (
                "end_turn"
            )
            await client.send(refused)
            error = await client.result(refused["command_id"], 60, alive=proc, on_timeout=proc.text)
            assert error["stop_reason"] == "error"
            assert error["error"]["code"] == "internal"
            assert "refused by the broker" in error["error"]["message"]
            await client.send(later)
            after = await client.result(later["command_id"], 60, alive=proc)
            assert after["stop_reason"] == "end_turn"
            # The refused turn left nothing but its mark: the first turn and the last.
            stored = await last_stored_session(cluster, session)
            assert len(stored.state.messages) == 4
            assert stored.delivery.answered(refused["command_id"])
            await client.caught_up()
            assert client.dead_letters == []
            for command in (first, refused, later):
                assert len(client.results_for(command["command_id"])) == 1
            assert await metric_total(proc, "cairn_dlq_records") == 0
            assert (
                await metric_total(proc, "cairn_unwritable_outcomes", {"replacement": "fallback"})
                == 1
            )
        assert proc.alive, proc.text()[-3000:]
