"""kill -9 of the owning instance in the middle of a turn; after the takeover, the session's
history lists every committed version exactly once, numbered without a gap or a repeat.

Proven from what a client sees: the committed results and events, and a ``history`` command's
answer, never from the service's log lines.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.runtime_harness import Client, Cluster, invoke, services, unique, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.timeout(180)]

CYCLES = 6
"""Tool cycles of the ``long`` test agent."""


def _expected_steps() -> list[tuple[str | None, str | None, int]]:
    """(position, stop_reason, cycle) of every step of one ``long`` turn, oldest first."""
    steps: list[tuple[str | None, str | None, int]] = []
    for cycle in range(CYCLES):
        steps += [("after_model", None, cycle), ("after_tools", None, cycle)]
    # The end is listed at the session's cycle index, which the closing model call (no tools,
    # so no boundary) leaves at the last cycle's.
    return [*steps, (None, "end_turn", CYCLES - 1)]


async def _history(client: Client, session: str, alive: Any) -> list[dict[str, Any]]:
    """Every version of ``session``, newest first, read page by page."""
    versions: list[dict[str, Any]] = []
    before: int | None = None
    while True:
        command: dict[str, Any] = {
            "type": "history",
            "command_id": unique("h"),
            "session_id": session,
            "limit": 5,
        }
        if before is not None:
            command["before"] = before
        await client.send(command)
        page = (await client.result(command["command_id"], alive=alive))["history"]
        versions += page["versions"]
        before = page["next_before"]
        if before is None:
            return versions


@pytest.mark.parametrize(
    "fault",
    [
        # Killed while it waits for a model call, after a boundary committed.
        {"CAIRN_TEST_MODEL_LATENCY": "3:60"},
        # Killed between producing a step's records and committing them: that step's version
        # was written and aborted, and is written again by the next owner.
        {"CAIRN_FAULTS__KILL_AT": "after_produce_before_commit", "CAIRN_FAULTS__KILL_AFTER": "6"},
    ],
    ids=["during-model-call", "before-commit"],
)
async def test_history_after_a_kill_and_takeover_lists_every_version_once(
    cluster: Cluster, fault: dict[str, str]
) -> None:
    session = unique("s")
    command = invoke(session, "go", agent="long")
    with services() as procs:
        victim = cluster.start("victim", **fault)
        procs.append(victim)
        await victim.wait_ready()
        async with Client(cluster) as client:
            await client.send(command)
            if "CAIRN_TEST_MODEL_LATENCY" in fault:
                await wait_for(
                    lambda: any(m["index"] == 3 for m in cluster.model_calls()), 30, "model call 3"
                )
                victim.kill()
            else:
                await wait_for(lambda: not victim.alive, 30, "the fault point's kill")
            fresh = cluster.start("fresh")
            procs.append(fresh)
            result = await client.result(command["command_id"], timeout=60, alive=fresh)
            assert result["stop_reason"] == "end_turn", result
            versions = await _history(client, session, fresh)
            assert await fresh.terminate() == 0
            await client.caught_up()
        events = [e for e in client.events if e["session_id"] == session]

    assert {m["pid"] for m in cluster.model_calls()} == {victim.pid, fresh.pid}
    expected = _expected_steps()
    assert [v["version"] for v in versions] == list(range(len(expected), 0, -1))
    listed = [(v.get("position"), v.get("stop_reason"), v["cycle_index"]) for v in versions]
    assert listed[::-1] == expected
    assert all(v["command_id"] == command["command_id"] for v in versions)
    assert result["version"] == len(expected)
    # Message counts grow with every step: 2 per cycle (a tool call, its results).
    assert [v["messages"] for v in versions[::-1]] == [
        *[1 + 2 * c + k for c in range(CYCLES) for k in (1, 2)],
        2 + 2 * CYCLES,
    ]
    # Each committed boundary event names the version history lists for it.
    boundaries = {
        (e["position"], e["cycle_index"]): e["version"]
        for e in events
        if e["type"] == "checkpoint_reached"
    }
    assert boundaries
    for version in versions:
        key = (version.get("position"), version["cycle_index"])
        if key in boundaries:
            assert boundaries[key] == version["version"]
