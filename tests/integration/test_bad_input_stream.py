"""A generated stream of random and mutated records into the commands and control topics while
valid traffic flows: the service never restarts anything, every valid command is answered exactly
once, and every invalid record is accounted for exactly once (a dead letter or a result).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.support.hostile import Sent, answers_of, generate, ids_of
from tests.support.runtime_harness import invoke, wait_for
from tests.support.stage import Stage, staged

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.timeout(180),
    pytest.mark.asyncio(loop_scope="module"),
]

GENERATED = 150
VALID_EVERY = 5


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
    for i, (name, key, value) in enumerate(generate(GENERATED)):
        if i % VALID_EVERY == 0:
            command = invoke(f"ok-{uuid.uuid4()}", "hello", agent="simple")
            await stage.client.send(command)
            valid.append(command["command_id"])
        meta = await producer.send_and_wait(topics[name], key=key, value=value)
        sent.append(Sent(topics[name], meta.partition, meta.offset, ids_of(value)))

    def counts() -> list[tuple[Sent, int]]:
        return answers_of(sent, stage.client.results, stage.client.dead_letters)

    def unaccounted() -> list[Sent]:
        return [item for item, count in counts() if count == 0]

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
    for item, count in counts():
        assert count == 1, (item, count)
    log = stage.service.text()
    assert "partition owner failed" not in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
