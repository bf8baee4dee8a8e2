"""A poison record, one whose handling fails unexpectedly, against a real broker: it is answered
``internal`` once, committed with its offset, and its partition goes on with the next record."""

from __future__ import annotations

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from tests.support.runtime_harness import Client, Cluster, invoke, services, unique

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]

OWNER_FAILED = "partition owner failed"
POISONED = "record failed unexpectedly"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


async def _send_traced(cluster: Cluster, command: dict[str, object]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(
            cluster.topics.commands,
            key=str(command["session_id"]).encode(),
            value=orjson.dumps(command),
            headers=[("traceparent", TRACEPARENT.encode())],
        )
    finally:
        await producer.stop()


def _text(result: dict[str, object]) -> str:
    message = result.get("message")
    assert isinstance(message, dict), result
    return "".join(block.get("text", "") for block in message["content"])


async def test_a_poison_command_is_answered_and_the_next_one_runs(cluster: Cluster) -> None:
    s = unique("s")
    poison = invoke(s, "boom", agent="simple")
    after = invoke(s, "after", agent="simple")
    cancel = {"type": "cancel", "schema_version": 1, "command_id": unique("x"), "session_id": s}
    env = {"CAIRN_FAULTS__FAIL_COMMAND": poison["command_id"]}
    with services() as procs:
        first = cluster.start("first", **env)
        procs.append(first)
        await first.wait_ready()
        async with Client(cluster) as client:
            await _send_traced(cluster, poison)
            await client.send(after)
            failed = await client.result(poison["command_id"], 30, alive=first)
            assert failed["stop_reason"] == "error", failed
            assert failed["error"]["code"] == "internal", failed
            assert "injected failure" in failed["error"]["message"], failed
            # Its answer stays in the trace of the command, like any other result.
            headers = failed["_headers"]
            _version, trace_id, span_id, _flags = headers["traceparent"].decode().split("-")
            assert trace_id == TRACE_ID and span_id != "00f067aa0ba902b7", headers
            ran = await client.result(after["command_id"], 30, alive=first)
            # The poison never reached the model: this is the session's first turn.
            assert ran["stop_reason"] == "end_turn" and _text(ran) == "done turn 1", ran
            await client.send(cancel, topic=cluster.topics.control)
            own = await client.result(str(cancel["command_id"]), 30, alive=first)
            assert own["stop_reason"] == "cancelled", own
            assert first.log_count(POISONED) == 1
            assert first.log_count("Traceback") == 1
            assert first.log_count(OWNER_FAILED) == 0
            # The next owner, under the same fault, never sees the poison again: its answer
            # was committed with its offset.
            assert await first.terminate() == 0
            second = cluster.start("second", **env)
            procs.append(second)
            again = invoke(s, "again", agent="simple")
            await client.send(again)
            done = await client.result(again["command_id"], 60, alive=second)
            assert done["stop_reason"] == "end_turn" and _text(done) == "done turn 2", done
            await client.caught_up()
    for command_id in (poison["command_id"], after["command_id"], again["command_id"]):
        assert len(client.results_for(command_id)) == 1, command_id
    assert second.log_count(POISONED) == 0
    assert second.log_count(OWNER_FAILED) == 0
