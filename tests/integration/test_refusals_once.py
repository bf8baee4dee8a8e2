"""Refused commands against a real broker and service: one result per command id, refusals too.

A refusal (``unknown_agent``, ``invalid_command``) is remembered by its session like any applied
command, also for a session that had no state before, so publishing it again is not answered
again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.support.runtime_harness import invoke, unique
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
    async with staged(kafka_bootstrap, Path(tmp_path_factory.mktemp("refusals"))) as ready:
        yield ready


def refusals(session_id: str) -> list[tuple[dict[str, Any], str]]:
    """Commands of a session that are refused, each with the code it is refused with."""
    return [
        (invoke(session_id, "hi", agent="no-such-agent"), "unknown_agent"),
        (invoke(session_id, "hi", agent="simple", checkpointing="yes"), "invalid_command"),
    ]


@pytest.mark.parametrize("known", [False, True], ids=["new-session", "known-session"])
async def test_a_refusal_published_twice_is_answered_once(stage: Stage, known: bool) -> None:
    session = unique("s")
    if known:
        first = invoke(session, "hello", agent="simple")
        await stage.client.send(first)
        assert (await stage.result(first["command_id"]))["stop_reason"] == "end_turn"
    commands = refusals(session)
    for command, _ in commands:
        await stage.client.send(command, command)
    # Answered after the duplicates were read: a second answer would already be visible.
    marker = invoke(session, "still here", agent="simple")
    await stage.client.send(marker)
    assert (await stage.result(marker["command_id"]))["stop_reason"] == "end_turn"
    await stage.client.caught_up()
    for command, code in commands:
        [answer] = stage.client.results_for(command["command_id"])
        assert answer["error"]["code"] == code
