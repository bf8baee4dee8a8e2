"""SIGTERM drains: a running turn is committed at its next boundary and left there; the process
exits cleanly within the grace period, and the next instance continues from that boundary."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest

from service.runtime.restore import partition_of
from tests.support.runtime_harness import (
    Client,
    Cluster,
    health_port,
    invoke,
    probe,
    services,
    unique,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.timeout(120)]


async def test_sigterm_commits_the_next_boundary_and_the_next_instance_goes_on(
    cluster: Cluster,
) -> None:
    session = unique("s")
    command = invoke(session, "go", agent="long")
    with services() as procs:
        first = cluster.start("first", CAIRN_TEST_MODEL_LATENCY="2:2")
        procs.append(first)
        await first.wait_ready()
        async with Client(cluster) as client:
            await client.send(command)
            await wait_for(
                lambda: any(m["index"] == 2 for m in cluster.model_calls()), 30, "model call 2"
            )
            asked = time.monotonic()
            assert await first.terminate() == 0, first.text()[-3000:]
            # Bounded by the grace period (3 s in the tests) plus leaving the group, not by the
            # rest of the turn; generous for a loaded machine.
            assert time.monotonic() - asked < 15
            assert "invocation left at its boundary" in first.text()
            assert not client.results_for(command["command_id"])
            second = cluster.start("second")
            procs.append(second)
            result = await client.result(command["command_id"], timeout=60, alive=second)
            assert result["stop_reason"] == "end_turn"
            assert await second.terminate() == 0
            await client.caught_up()
    assert Counter(r["command_id"] for r in client.results) == {command["command_id"]: 1}
    calls = cluster.model_calls()
    assert [m["index"] for m in calls if m["pid"] == first.pid] == [0, 1, 2]
    # The reply of call 2 was committed (after_model boundary) before the first one left.
    assert [m["index"] for m in calls if m["pid"] == second.pid] == [3, 4, 5, 6]
    tools = Counter(c["tool_use_id"] for c in cluster.tool_calls())
    assert tools == Counter({f"t1c{i}": 1 for i in range(6)})


async def test_a_drain_gives_the_partitions_to_the_other_instance_before_sigterm(
    cluster: Cluster,
) -> None:
    """The pre-stop hook's drain leaves the group: the other instance takes every partition
    and serves while the drained one, alive and not ready, waits for its SIGTERM."""
    everything = sorted(str(p) for p in range(cluster.partitions))
    with services() as procs:
        first = cluster.start("first")
        procs.append(first)
        await first.wait_ready()
        second = cluster.start("second")
        procs.append(second)
        await second.wait_ready()
        first_health, second_health = await health_port(first), await health_port(second)

        assert await probe(first_health, "/drain") == (200, {"status": "drained"})
        status, body = await probe(first_health, "/readyz")
        assert (status, body["assigned"]) == (503, [])
        assert (await probe(first_health, "/livez"))[0] == 200

        answers: list[tuple[int, dict[str, object]]] = []

        async def owns_everything() -> bool:
            answers.append(await probe(second_health, "/readyz"))
            return answers[-1][0] == 200 and answers[-1][1]["assigned"] == everything

        deadline = time.monotonic() + 30
        while not await owns_everything():
            assert time.monotonic() < deadline, (answers[-1], second.text()[-3000:])
            await asyncio.sleep(0.1)
        async with Client(cluster) as client:
            commands = [invoke(unique("s"), "hi", agent="simple") for _ in range(8)]
            for command in commands:
                await client.send(command)
            for command in commands:
                await client.result(command["command_id"], timeout=60, alive=second)
        assert first.alive
        assert await first.terminate() == 0
        assert await second.terminate() == 0


async def test_a_drain_while_restoring_gives_the_partitions_back_and_loses_no_result(
    cluster: Cluster,
) -> None:
    """A drain of an instance whose restore is under way (held at the restore's start until
    SIGUSR1, which never comes): it answers drained without finishing the restore, reports not
    ready holding nothing, and the other instance takes every partition and answers every
    command, those sent while the restore was held included, exactly once."""
    everything = sorted(str(p) for p in range(cluster.partitions))
    sessions = [unique("s") for _ in range(8)]
    with services() as procs:
        first = cluster.start("first")
        procs.append(first)
        await first.wait_ready()
        first_health = await health_port(first)
        async with Client(cluster) as client:
            before = [invoke(s, "hi", agent="simple") for s in sessions]
            for command in before:
                await client.send(command)
            for command in before:
                await client.result(command["command_id"], timeout=60, alive=first)

            second = cluster.start("second", CAIRN_FAULTS__HOLD_RESTORE="true")
            procs.append(second)
            second_health = await health_port(second)
            await second.wait_log("restore held until SIGUSR1", timeout=60)
            status, body = await probe(second_health, "/readyz")
            assert status == 503 and body["restoring"], body
            during = [invoke(s, "again", agent="simple") for s in sessions]
            for command in during:
                await client.send(command)

            assert await probe(second_health, "/drain") == (200, {"status": "drained"})
            status, body = await probe(second_health, "/readyz")
            assert (status, body["assigned"], body["stopping"]) == (503, [], True), body
            assert (await probe(second_health, "/livez"))[0] == 200

            answers: list[tuple[int, dict[str, object]]] = []

            async def owns_everything() -> bool:
                answers.append(await probe(first_health, "/readyz"))
                return answers[-1][0] == 200 and answers[-1][1]["assigned"] == everything

            deadline = time.monotonic() + 60
            while not await owns_everything():
                assert time.monotonic() < deadline, (answers[-1], first.text()[-3000:])
                await asyncio.sleep(0.1)
            after = [invoke(s, "more", agent="simple") for s in sessions]
            for command in after:
                await client.send(command)
            for command in [*during, *after]:
                result = await client.result(command["command_id"], timeout=60, alive=first)
                assert result["stop_reason"] == "end_turn", result
            await client.caught_up()
            assert second.alive
            assert "partition ready" not in second.text()
            assert await second.terminate() == 0, second.text()[-3000:]
            assert await first.terminate() == 0, first.text()[-3000:]
    everyone = [c["command_id"] for c in [*before, *during, *after]]
    assert Counter(r["command_id"] for r in client.results) == dict.fromkeys(everyone, 1)
    # Each session's turns were answered in order, none run twice: three user turns each.
    for session in sessions:
        turns = [r for r in client.results if r["session_id"] == session]
        assert [r["command_id"] for r in turns] == [
            c["command_id"] for c in [*before, *during, *after] if c["session_id"] == session
        ]


async def test_a_revoke_while_restoring_ends_the_restore_at_once(cluster: Cluster) -> None:
    """A partition taken back while its owner is still starting (here its restore is held until
    SIGUSR1, as a long cold read would hold it) has nothing to commit: its start ends at once,
    so the rebalance goes on without waiting for the grace period (60 s here) and the other
    instance serves its share. Before, the revoke waited for every start to end (a restore,
    and those queued behind it), and no partition of the group served meanwhile."""
    slow = {"CAIRN_RUNTIME__REVOKE_GRACE_S": "60", "CAIRN_GROUP__REBALANCE_TIMEOUT_MS": "90000"}
    with services() as procs:
        first = cluster.start("first", CAIRN_FAULTS__HOLD_RESTORE="true", **slow)
        procs.append(first)
        await first.wait_log("restore held until SIGUSR1", timeout=60)
        second = cluster.start("second", **slow)
        procs.append(second)
        second_health = await health_port(second)
        answers: list[tuple[int, dict[str, Any]]] = []

        async def second_ready() -> bool:
            answers.append(await probe(second_health, "/readyz"))
            return answers[-1][0] == 200 and bool(answers[-1][1]["assigned"])

        deadline = time.monotonic() + 40
        while not await second_ready():
            assert time.monotonic() < deadline, (answers[-1], first.text()[-3000:])
            await asyncio.sleep(0.1)
        owned = {int(p) for p in answers[-1][1]["assigned"]}
        candidates = (unique("s") for _ in range(200))
        mine = (s for s in candidates if partition_of(s, cluster.partitions) in owned)
        sessions = [next(mine) for _ in range(4)]
        async with Client(cluster) as client:
            commands = [invoke(s, "hi", agent="simple") for s in sessions]
            for command in commands:
                await client.send(command)
            for command in commands:
                result = await client.result(command["command_id"], timeout=30, alive=second)
                assert result["stop_reason"] == "end_turn", result
        assert first.alive
        assert "partition ready" not in first.text()
        assert await second.terminate() == 0, second.text()[-3000:]
        assert await first.terminate() == 0, first.text()[-3000:]
