"""Cancel on the control topic against a real broker and one real service process.

Every case checks exactly-once answering: the cancel gets one result of its own, and each
command it stopped or skipped gets one ``cancelled`` result; commands it does not cover run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.support.runtime_harness import (
    checkpoint_resume,
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


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stage(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stage]:
    workdir = Path(tmp_path_factory.mktemp("cancel"))
    async with staged(
        kafka_bootstrap, workdir, CAIRN_TEST_TOOL_SLEEP="3", CAIRN_TEST_CHUNK_S="0.05"
    ) as ready:
        yield ready


def _text(result: dict[str, Any]) -> str:
    message = result.get("message") or {}
    return "".join(block.get("text", "") for block in message.get("content") or [])


async def test_cancel_closes_a_running_model_stream(stage: Stage) -> None:
    s = unique("s")
    command = invoke(s, "talk", agent="drawl")
    await stage.client.send(command)
    await wait_for(lambda: bool(stage.model_calls(s)), 30, "model call", alive=stage.service)
    cancel_id = await stage.cancel(s, message="Halted by the operator")
    result = await stage.result(command["command_id"])
    assert result["stop_reason"] == "cancelled", result
    assert _text(result) == "Halted by the operator"
    own = await stage.result(cancel_id)
    assert own["stop_reason"] == "cancelled" and own["message"] is None, own
    # The stream of 400 chunks never finished: the cancel closed it.
    assert not any(m.get("complete") and m["session_id"] == s for m in stage.cluster.model_calls())
    await stage.exactly_once(command["command_id"], cancel_id)


async def test_cancel_reaches_a_running_tool(stage: Stage) -> None:
    s = unique("s")
    command = invoke(s, "go", agent="patient")
    await stage.client.send(command)
    await stage.tool_running(s)
    cancel_id = await stage.cancel(s)
    result = await stage.result(command["command_id"])
    assert result["stop_reason"] == "cancelled", result
    # The tool waits its full time ("waited") unless it sees the signal.
    assert stage.tool_outcomes(s) == ["cancelled"]
    assert len(stage.model_calls(s)) == 1
    await stage.exactly_once(command["command_id"], cancel_id)


async def test_cancel_by_target_stops_that_running_command(stage: Stage) -> None:
    s = unique("s")
    command = invoke(s, "go", agent="patient")
    await stage.client.send(command)
    await stage.tool_running(s)
    cancel_id = await stage.cancel(s, target_command_id=command["command_id"])
    result = await stage.result(command["command_id"])
    assert result["stop_reason"] == "cancelled", result
    assert stage.tool_outcomes(s) == ["cancelled"]
    await stage.exactly_once(command["command_id"], cancel_id)


async def test_deferred_cancel_lets_the_running_tools_finish(stage: Stage) -> None:
    s = unique("s")
    command = invoke(s, "go", agent="patient")
    await stage.client.send(command)
    await stage.tool_running(s)
    cancel_id = await stage.cancel(s, after_current_tools=True, message="Enough for today")
    result = await stage.result(command["command_id"])
    assert result["stop_reason"] == "cancelled", result
    assert _text(result) == "Enough for today"
    await stage.exactly_once(command["command_id"], cancel_id)
    # The tool was not woken: it waited its full time, and its real result was kept.
    assert stage.tool_outcomes(s) == ["waited"]
    finished = stage.events(s, "tool_finished")
    assert [e["status"] for e in finished] == ["success"], finished
    # The batch ran to its end; the next model call never happened.
    assert len(stage.model_calls(s)) == 1


async def test_an_immediate_cancel_upgrades_a_deferred_one(stage: Stage) -> None:
    s = unique("s")
    command = invoke(s, "go", agent="patient")
    await stage.client.send(command)
    await stage.tool_running(s)
    deferred_id = await stage.cancel(s, after_current_tools=True)
    upgrade_id = await stage.cancel(s)
    result = await stage.result(command["command_id"])
    assert result["stop_reason"] == "cancelled", result
    assert stage.tool_outcomes(s) == ["cancelled"]
    await stage.exactly_once(command["command_id"], deferred_id, upgrade_id)


async def test_cancel_resolves_a_checkpoint_pause_and_makes_it_stale(stage: Stage) -> None:
    s = unique("s")
    command = invoke(s, "go", agent="bench")
    await stage.client.send(command)
    paused = await stage.result(command["command_id"])
    assert paused["stop_reason"] == "checkpoint", paused
    cancel_id = await stage.cancel(s)
    own = await stage.result(cancel_id)
    assert own["stop_reason"] == "cancelled", own
    late = checkpoint_resume(s, paused["checkpoint"])
    await stage.client.send(late)
    refused = await stage.result(late["command_id"])
    assert refused["error"]["code"] == "checkpoint_stale", refused
    after = invoke(s, "again", agent="bench")
    await stage.client.send(after)
    assert (await stage.result(after["command_id"]))["stop_reason"] == "checkpoint"
    await stage.exactly_once(command["command_id"], cancel_id, late["command_id"])


async def test_cancel_resolves_a_pending_interrupt(stage: Stage) -> None:
    s = unique("s")
    command = invoke(s, "go", agent="approval")
    await stage.client.send(command)
    paused = await stage.result(command["command_id"])
    assert paused["stop_reason"] == "interrupt", paused
    cancel_id = await stage.cancel(s, message="Not approved")
    own = await stage.result(cancel_id)
    assert own["stop_reason"] == "cancelled" and _text(own) == "Not approved", own
    answer = resume(
        s,
        [
            {
                "interruptResponse": {
                    "interruptId": paused["interrupts"][0]["id"],
                    "response": "yes",
                }
            }
        ],
    )
    await stage.client.send(answer)
    refused = await stage.result(answer["command_id"])
    assert refused["error"]["code"] == "no_pending_interrupt", refused
    await stage.exactly_once(command["command_id"], cancel_id, answer["command_id"])
    # The interrupting tool's start is matched by a finish saying why it has no result.
    started = stage.events(s, "tool_started")
    finished = stage.events(s, "tool_finished")
    assert [e["status"] for e in finished] == ["interrupted"], finished
    assert [e["tool_use_id"] for e in finished] == [e["tool_use_id"] for e in started]


async def test_queued_commands_published_before_are_skipped_later_ones_run(stage: Stage) -> None:
    s = unique("s")
    running = invoke(s, "go", agent="patient")
    queued = [invoke(s, f"then {i}", agent="simple") for i in range(2)]
    await stage.client.send(running, *queued)
    await stage.tool_running(s)
    cancel_id = await stage.cancel(s)
    for command in (running, *queued):
        result = await stage.result(command["command_id"])
        assert result["stop_reason"] == "cancelled", result
    await stage.result(cancel_id)
    later = invoke(s, "fresh start", agent="simple")
    await stage.client.send(later)
    assert (await stage.result(later["command_id"]))["stop_reason"] == "end_turn"
    # The skipped commands never reached the model: one call for `running`, one for `later`.
    assert len(stage.model_calls(s)) == 2
    await stage.exactly_once(
        running["command_id"], cancel_id, later["command_id"], *(q["command_id"] for q in queued)
    )


async def test_a_history_queued_before_a_cancel_is_answered_not_skipped(stage: Stage) -> None:
    s = unique("s")
    running = invoke(s, "go", agent="patient")
    history = {"type": "history", "schema_version": 1, "command_id": unique("h"), "session_id": s}
    await stage.client.send(running, history)
    await stage.tool_running(s)
    cancel_id = await stage.cancel(s)
    assert (await stage.result(running["command_id"]))["stop_reason"] == "cancelled"
    page = await stage.result(history["command_id"])
    assert page["stop_reason"] == "end_turn", page
    # Answered after the cancelled run, so its page lists that run's last version.
    assert page["history"]["versions"][0]["command_id"] == running["command_id"]
    answer = await stage.result(cancel_id)
    assert answer["cancel"]["stopped"] == running["command_id"]
    assert answer["cancel"]["skipped"] == []
    await stage.exactly_once(running["command_id"], history["command_id"], cancel_id)


async def test_target_cancel_skips_exactly_that_queued_command(stage: Stage) -> None:
    s = unique("s")
    running = invoke(s, "go", agent="patient")
    target, other = invoke(s, "one", agent="simple"), invoke(s, "two", agent="simple")
    await stage.client.send(running, target, other)
    await stage.tool_running(s)
    cancel_id = await stage.cancel(s, target_command_id=target["command_id"])
    assert (await stage.result(running["command_id"]))["stop_reason"] == "end_turn"
    assert (await stage.result(target["command_id"]))["stop_reason"] == "cancelled"
    assert (await stage.result(other["command_id"]))["stop_reason"] == "end_turn"
    await stage.exactly_once(
        running["command_id"], target["command_id"], other["command_id"], cancel_id
    )


async def test_target_cancel_arriving_before_its_command(stage: Stage) -> None:
    s = unique("s")
    target = invoke(s, "later", agent="simple")
    cancel_id = await stage.cancel(s, target_command_id=target["command_id"])
    answer = await stage.result(cancel_id)
    assert answer["stop_reason"] == "cancelled"
    # Not read yet, it could be another session's command: the cancel does not answer it.
    assert answer["cancel"]["skipped"] == []
    follow = invoke(s, "after", agent="simple")
    await stage.client.send(target, follow)
    late = await stage.result(target["command_id"])
    assert late["stop_reason"] == "cancelled", late
    assert (await stage.result(follow["command_id"]))["stop_reason"] == "end_turn"
    # The target arrived after the cancel's answer: it never ran and is answered once.
    assert len(stage.model_calls(s)) == 1
    await stage.exactly_once(target["command_id"], cancel_id, follow["command_id"])


async def test_cancel_racing_its_own_invoke(stage: Stage) -> None:
    plain, targeted = [], []
    for _ in range(3):
        s = unique("s")
        command = invoke(s, "talk", agent="drawl")
        await stage.client.send(command)
        plain.append((command["command_id"], await stage.cancel(s)))
        s = unique("s")
        command = invoke(s, "talk", agent="drawl")
        await stage.client.send(command)
        targeted.append(
            (command["command_id"], await stage.cancel(s, target_command_id=command["command_id"]))
        )
    for command_id, cancel_id in plain + targeted:
        result = await stage.result(command_id)
        assert result["stop_reason"] == "cancelled", result
        assert (await stage.result(cancel_id))["stop_reason"] == "cancelled"
    await stage.exactly_once(*(i for pair in plain + targeted for i in pair))


async def test_cancel_of_an_idle_or_unknown_session_changes_nothing(stage: Stage) -> None:
    unknown = unique("s")
    cancel_id = await stage.cancel(unknown, message="nothing here")
    own = await stage.result(cancel_id)
    assert own["stop_reason"] == "cancelled" and own["message"] is None, own
    s = unique("s")
    first = invoke(s, "hello", agent="simple")
    await stage.client.send(first)
    done = await stage.result(first["command_id"])
    idle_cancel = await stage.cancel(s)
    own = await stage.result(idle_cancel)
    assert own["stop_reason"] == "cancelled" and own["message"] is None, own
    # The conversation goes on as if nothing happened (second turn of the model).
    second = invoke(s, "again", agent="simple")
    await stage.client.send(second)
    assert _text(await stage.result(second["command_id"])) == "done turn 2"
    assert _text(done) == "done turn 1"
    await stage.exactly_once(cancel_id, idle_cancel, first["command_id"], second["command_id"])


async def test_a_repeated_cancel_is_answered_once(stage: Stage) -> None:
    s = unique("s")
    body = {"type": "cancel", "schema_version": 1, "command_id": unique("x"), "session_id": s}
    await stage.client.send(body, body, topic=stage.cluster.topics.control)
    follow = await stage.cancel(s)
    await stage.result(follow)
    await stage.exactly_once(body["command_id"], follow)
