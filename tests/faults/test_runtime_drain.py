"""SIGTERM drains: a running turn is committed at its next boundary and left there; the process
exits cleanly within the grace period, and the next instance continues from that boundary."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from tests.support.runtime_harness import Client, Cluster, invoke, services, unique, wait_for

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
