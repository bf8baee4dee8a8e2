"""kill -9 while a step that spans many records is being committed: each tool result here is
split across several history records. The next owner finds the session as it was before that
step or after it, never a mix: the turn ends once, its conversation holds every tool result
whole, and a head never points at history that is not there."""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from tests.support.agents import bulky_text
from tests.support.runtime_harness import (
    Client,
    Cluster,
    committed_records,
    invoke,
    last_session_state,
    services,
    unique,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.timeout(180)]

RECORD_MAX = "100000"
RESULT_BYTES = 250_000
"""Three history records per tool result."""
CYCLES = 4


@pytest.mark.parametrize("kill_after", ["4", "7"])
async def test_kill_mid_commit_of_a_multi_record_step_leaves_old_or_new(
    cluster: Cluster, kill_after: str
) -> None:
    sessions = [unique("s") for _ in range(2)]
    commands = [invoke(s, "go", agent="bulky") for s in sessions]
    limits = {
        "CAIRN_RUNTIME__STATE_RECORD_MAX_BYTES": RECORD_MAX,
        "CAIRN_TEST_RESULT_BYTES": str(RESULT_BYTES),
    }
    with services() as procs:
        victim = cluster.start(
            "victim",
            CAIRN_FAULTS__KILL_AT="after_produce_before_commit",
            CAIRN_FAULTS__KILL_AFTER=kill_after,
            **limits,
        )
        procs.append(victim)
        await victim.wait_ready()
        async with Client(cluster) as client:
            await client.send(*commands)
            await wait_for(lambda: not victim.alive, 60, "the victim killing itself")
            assert victim.process.returncode == -signal.SIGKILL, victim.text()[-3000:]
            fresh = cluster.start("fresh", **limits)
            procs.append(fresh)
            await client.wait_results(len(commands), timeout=90, alive=fresh)
            assert await fresh.terminate() == 0
            await client.caught_up()
    assert Counter(r["command_id"] for r in client.results) == Counter(
        {c["command_id"]: 1 for c in commands}
    )
    for session in sessions:
        [result] = client.session_results(session)
        assert result["stop_reason"] == "end_turn", result
        assert result["message"]["content"] == [{"text": "done turn 1"}]
        state, _ = await last_session_state(cluster, session)
        results = [
            block["toolResult"]
            for message in state.messages
            for block in message["content"]
            if "toolResult" in block
        ]
        assert [r["toolUseId"] for r in results] == [f"t1c{i}" for i in range(CYCLES)]
        for r in results:
            expected = bulky_text(f"{session}:{r['toolUseId']}", RESULT_BYTES)
            assert r["content"] == [{"text": expected}], "a tool result came back incomplete"
        assert len(state.messages) == 2 + 2 * CYCLES
    tools = Counter(c["idempotency_key"] for c in cluster.tool_calls())
    assert len(tools) == CYCLES * len(sessions) and max(tools.values()) <= 2
    records = await committed_records(
        cluster.bootstrap, cluster.topics.sessions, cluster.partitions
    )
    assert max(len(r.value or b"") for r in records) <= int(RECORD_MAX)


HOARD_CYCLES = 25
HOARD_RESULT_BYTES = 2_000_000
"""25 tool results of 2 MB: a conversation of 50 MB."""


async def test_a_50_mb_session_survives_a_kill_and_takes_a_command_on_another_instance(
    cluster: Cluster,
) -> None:
    session = unique("s")
    first = invoke(session, "collect", agent="hoard")
    env = {
        "CAIRN_TEST_RESULT_BYTES": str(HOARD_RESULT_BYTES),
        "CAIRN_TEST_HOARD_CYCLES": str(HOARD_CYCLES),
    }
    with services() as procs:
        victim = cluster.start(
            "victim",
            CAIRN_FAULTS__KILL_AT="after_commit",
            CAIRN_FAULTS__KILL_AFTER="40",
            **env,
        )
        procs.append(victim)
        await victim.wait_ready()
        async with Client(cluster) as client:
            await client.send(first)
            await wait_for(lambda: not victim.alive, 120, "the victim killing itself")
            assert victim.process.returncode == -signal.SIGKILL, victim.text()[-3000:]
            fresh = cluster.start("fresh", **env)
            procs.append(fresh)
            result = await client.result(first["command_id"], timeout=120, alive=fresh)
            assert result["message"]["content"] == [{"text": "done turn 1"}], result
            # Another instance, restoring the whole session from the topic, takes the next turn.
            assert await fresh.terminate() == 0
            other = cluster.start("other", **env)
            procs.append(other)
            again = invoke(session, "and now?", agent="simple")
            await client.send(again)
            answer = await client.result(again["command_id"], timeout=120, alive=other)
            assert answer["message"]["content"] == [{"text": "done turn 2"}], answer
            assert await other.terminate() == 0
            await client.caught_up()
    assert len(client.results_for(first["command_id"])) == 1
    state, _ = await last_session_state(cluster, session)
    results = [
        block["toolResult"]
        for message in state.messages
        for block in message["content"]
        if "toolResult" in block
    ]
    assert len(results) == HOARD_CYCLES
    for r in results:
        expected = bulky_text(f"{session}:{r['toolUseId']}", HOARD_RESULT_BYTES)
        assert r["content"] == [{"text": expected}]
    assert sum(len(r["content"][0]["text"]) for r in results) == 50_000_000
