"""Progress events on a real broker are live: a running tool shows as started while it runs.

The ``patient`` agent's tool waits until it is cancelled, so the only way its ``tool_started``
event can be read before the cancel is that it was committed when the batch started.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.support.runtime_harness import invoke, unique, wait_for
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
    async with staged(
        kafka_bootstrap,
        Path(tmp_path_factory.mktemp("live")),
        CAIRN_TEST_TOOL_SLEEP="90",
    ) as ready:
        yield ready


async def _cancelled_with_every_seq_once(stage: Stage, session: str, command_id: str) -> None:
    """Cancel the session's running command, and check its events' ``seq`` run from 1 on."""
    await stage.cancel(session)
    assert (await stage.result(command_id))["stop_reason"] == "cancelled"
    await stage.client.caught_up()
    seqs = [e["seq"] for e in stage.client.events if e["session_id"] == session]
    assert seqs == list(range(1, len(seqs) + 1))


@pytest.mark.parametrize("checkpointing", [False, True], ids=["durable", "paused"])
async def test_a_running_tool_shows_as_started(stage: Stage, checkpointing: bool) -> None:
    session = unique("s")
    command = invoke(session, "go", agent="patient", checkpointing=checkpointing)
    await stage.client.send(command)
    if checkpointing:
        paused = await stage.result(command["command_id"])
        assert paused["stop_reason"] == "checkpoint"
        command = {
            **invoke(session, {"checkpointResume": {"checkpoint": paused["checkpoint"]}}),
            "agent": "patient",
        }
        await stage.client.send(command)
    await stage.tool_running(session)
    await wait_for(
        lambda: bool(stage.events(session, "tool_started")),
        30,
        "tool_started while the tool runs",
        alive=stage.service,
    )
    assert stage.tool_outcomes(session) == []
    assert stage.client.results_for(command["command_id"]) == []

    await _cancelled_with_every_seq_once(stage, session, command["command_id"])
    [started] = stage.events(session, "tool_started")
    [finished] = stage.events(session, "tool_finished")
    assert started["seq"] < finished["seq"]


async def test_streamed_text_shows_while_the_model_streams(stage: Stage) -> None:
    """The ``drawl`` model streams 400 words 0.05 s apart: its text is readable while it
    streams (every ``runtime.text_events_every_ms``, 500 ms by default), in order, each word
    once, before the cancel that ends it."""
    session = unique("s")
    command = invoke(session, "talk", agent="drawl")
    await stage.client.send(command)
    await wait_for(
        lambda: len(stage.events(session, "text_delta")) >= 2,
        30,
        "text_delta events while the model streams",
        alive=stage.service,
    )
    assert stage.client.results_for(command["command_id"]) == []
    await _cancelled_with_every_seq_once(stage, session, command["command_id"])
    words = "".join(e["text"] for e in stage.events(session, "text_delta")).split()
    assert words == [f"w{i}" for i in range(len(words))]
