"""kill -9 of the owning instance at the worst moments; a fresh instance finishes every command.

Proven each time: exactly one visible result per command, tools ran at most twice and saw the
same idempotency key, and a turn continues from its last committed boundary (model calls
counted per process).
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from tests.support.runtime_harness import Client, Cluster, invoke, services, unique, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.timeout(180)]


def _boundary_seen(client: Client, session: str, position: str, cycle: int) -> bool:
    return any(
        e["session_id"] == session
        and e["type"] == "checkpoint_reached"
        and e["position"] == position
        and e["cycle_index"] == cycle
        for e in client.events
    )


async def test_kill_during_a_model_call_resumes_from_the_last_boundary(cluster: Cluster) -> None:
    session = unique("s")
    command = invoke(session, "go", agent="long")
    with services() as procs:
        victim = cluster.start("victim", CAIRN_TEST_MODEL_LATENCY="3:60")
        procs.append(victim)
        await victim.wait_ready()
        async with Client(cluster) as client:
            await client.send(command)
            await wait_for(
                lambda: any(m["index"] == 3 for m in cluster.model_calls()), 30, "model call 3"
            )
            await wait_for(
                lambda: _boundary_seen(client, session, "after_tools", 2), 30, "boundary committed"
            )
            victim.kill()
            fresh = cluster.start("fresh")
            procs.append(fresh)
            result = await client.result(command["command_id"], timeout=60, alive=fresh)
            assert result["stop_reason"] == "end_turn", result
            assert await fresh.terminate() == 0
            await client.caught_up()
    assert len(client.results_for(command["command_id"])) == 1
    calls = cluster.model_calls()
    by_victim = [m["index"] for m in calls if m["pid"] == victim.pid]
    by_fresh = [m["index"] for m in calls if m["pid"] == fresh.pid]
    assert by_victim == [0, 1, 2, 3]
    # Continued from after_tools of cycle 2: the interrupted call again, then the rest; cycles
    # 0-2 were not repeated.
    assert by_fresh == [3, 4, 5, 6]
    tools = Counter(c["tool_use_id"] for c in cluster.tool_calls())
    assert tools == Counter({f"t1c{i}": 1 for i in range(6)})


async def test_kill_during_a_tool_batch_reruns_it_with_the_same_idempotency_key(
    cluster: Cluster,
) -> None:
    session = unique("s")
    command = invoke(session, "go", agent="slowtools")
    with services() as procs:
        victim = cluster.start("victim", CAIRN_TEST_TOOL_SLEEP="60")
        procs.append(victim)
        await victim.wait_ready()
        async with Client(cluster) as client:
            await client.send(command)
            await wait_for(lambda: len(cluster.tool_calls()) == 1, 30, "the slow tool started")
            victim.kill()
            fresh = cluster.start("fresh")
            procs.append(fresh)
            result = await client.result(command["command_id"], timeout=60, alive=fresh)
            assert result["stop_reason"] == "end_turn", result
            assert await fresh.terminate() == 0
            await client.caught_up()
    assert len(client.results_for(command["command_id"])) == 1
    calls = cluster.tool_calls()
    first = [c for c in calls if c["tool_use_id"] == "t1c0"]
    assert [c["pid"] for c in first] == [victim.pid, fresh.pid]
    assert {c["idempotency_key"] for c in first} == {f"{session}:t1c0"}
    assert [c["tool_use_id"] for c in calls if c["pid"] == fresh.pid] == ["t1c0", "t1c1"]
    # The model was not asked again for the batch it had already chosen (after_model boundary).
    assert [m["index"] for m in cluster.model_calls() if m["pid"] == fresh.pid] == [1, 2]


@pytest.mark.parametrize(
    ("point", "offsets_every_ms", "kill_after"),
    [
        ("after_produce_before_commit", "0", "5"),
        ("after_commit", "0", "5"),
        # Offsets lag the results: the fresh instance re-reads answered commands and must
        # recognise every one of them from the session states.
        ("after_commit", "60000", "20"),
    ],
)
async def test_kill_between_producing_and_committing_loses_and_doubles_nothing(
    cluster: Cluster, point: str, offsets_every_ms: str, kill_after: str
) -> None:
    sessions = [unique("s") for _ in range(12)]
    commands = [invoke(s, f"turn {k}", agent="cycles") for k in range(2) for s in sessions]
    with services() as procs:
        victim = cluster.start(
            "victim",
            CAIRN_FAULTS__KILL_AT=point,
            CAIRN_FAULTS__KILL_AFTER=kill_after,
            CAIRN_RUNTIME__OFFSETS_EVERY_MS=offsets_every_ms,
        )
        procs.append(victim)
        await victim.wait_ready()
        async with Client(cluster) as client:
            await client.send(*commands)
            await wait_for(lambda: not victim.alive, 30, "the victim killing itself")
            assert "fault point reached, killing" in victim.text()
            fresh = cluster.start("fresh", CAIRN_RUNTIME__OFFSETS_EVERY_MS=offsets_every_ms)
            procs.append(fresh)
            await client.wait_results(len(commands), timeout=60, alive=fresh)
            assert await fresh.terminate() == 0
            await client.caught_up()
    counts = Counter(r["command_id"] for r in client.results)
    assert counts == Counter({c["command_id"]: 1 for c in commands})
    for session in sessions:
        mine = client.session_results(session)
        assert all(r["stop_reason"] == "end_turn" for r in mine), mine
        texts = [r["message"]["content"][0]["text"] for r in mine]
        assert texts == ["done turn 1", "done turn 2"]
    tools = Counter(c["idempotency_key"] for c in cluster.tool_calls())
    assert max(tools.values()) <= 2
    assert len(tools) == len(commands) * 2
    if offsets_every_ms != "0":
        assert "duplicate command, already answered" in fresh.text()


async def test_a_failed_commit_recreates_the_partition_owner_and_loses_nothing(
    cluster: Cluster,
) -> None:
    sessions = [unique("s") for _ in range(12)]
    commands = [invoke(s, f"turn {k}", agent="cycles") for k in range(2) for s in sessions]
    with services() as procs:
        proc = cluster.start(
            "flaky",
            CAIRN_FAULTS__FAIL_AT="after_produce_before_commit",
            CAIRN_FAULTS__FAIL_AFTER="4",
        )
        procs.append(proc)
        await proc.wait_ready()
        async with Client(cluster) as client:
            await client.send(*commands)
            await client.wait_results(len(commands), timeout=60, alive=proc)
            assert proc.log_count("partition owner failed, it will be re-created") == 1
            (line,) = [ln for ln in proc.text().splitlines() if "partition owner failed" in ln]
            assert " WARNING " in line and "error=<InjectedCommitError(" in line, line
            assert "failures=<1>" in line, line
            assert await proc.terminate() == 0
            assert "never retrieved" not in proc.text(), proc.text()[-3000:]
            await client.caught_up()
    counts = Counter(r["command_id"] for r in client.results)
    assert counts == Counter({c["command_id"]: 1 for c in commands})
    for session in sessions:
        mine = client.session_results(session)
        assert [r["message"]["content"][0]["text"] for r in mine] == ["done turn 1", "done turn 2"]


async def test_a_static_member_restarted_after_kill_takes_its_partitions_back_at_once(
    cluster: Cluster,
) -> None:
    session = unique("s")
    static = {"CAIRN_GROUP__INSTANCE_ID": "cairn-0", "CAIRN_GROUP__SESSION_TIMEOUT_MS": "20000"}
    with services() as procs:
        first = cluster.start("first", **static)
        procs.append(first)
        await first.wait_ready()
        first.kill()
        async with Client(cluster) as client:
            restarted_at = time.monotonic()
            again = cluster.start("again", **static)
            procs.append(again)
            command = invoke(session, "go", agent="simple")
            await client.send(command)
            await client.result(command["command_id"], timeout=60, alive=again)
            # A new member would wait out the dead one's 20 s session; the same static
            # instance id replaces it without a rebalance.
            assert time.monotonic() - restarted_at < 15
            assert await again.terminate() == 0
