"""A zombie instance (SIGSTOP past the session timeout) comes back after another took over:
none of its late writes becomes visible and it stops cleanly."""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from tests.support.runtime_harness import Client, Cluster, invoke, services, unique, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.timeout(180)]


async def test_zombie_writes_never_become_visible(cluster: Cluster) -> None:
    session = unique("s")
    command = invoke(session, "go", agent="cycles")
    with services() as procs:
        zombie = cluster.start("zombie", CAIRN_TEST_MODEL_LATENCY="1:4")
        procs.append(zombie)
        await zombie.wait_ready()
        async with Client(cluster) as client:
            await client.send(command)
            await wait_for(
                lambda: any(m["index"] == 1 for m in cluster.model_calls()), 30, "model call 1"
            )
            zombie.signal(signal.SIGSTOP)
            successor = cluster.start("successor")
            procs.append(successor)
            result = await client.result(command["command_id"], timeout=60, alive=successor)
            assert result["stop_reason"] == "end_turn"
            zombie.signal(signal.SIGCONT)
            # Back to life, its in-flight invocation goes on and tries to commit.
            await wait_for(
                lambda: zombie.log_count("producer fenced") >= 1,
                60,
                "the zombie noticing it was fenced",
                on_timeout=zombie.text,
            )
            later = invoke(session, "again", agent="cycles")
            await client.send(later)
            await client.result(later["command_id"], timeout=60)
            assert await zombie.terminate() == 0, zombie.text()[-3000:]
            # Every future of the fenced producer was retrieved or cancelled.
            assert "never retrieved" not in zombie.text(), zombie.text()[-3000:]
            assert await successor.terminate() == 0
            await client.caught_up()
    assert Counter(r["command_id"] for r in client.results) == Counter(
        {command["command_id"]: 1, later["command_id"]: 1}
    )
    texts = [r["message"]["content"][0]["text"] for r in client.session_results(session)]
    assert texts == ["done turn 1", "done turn 2"]
    seqs = [e["seq"] for e in client.events if e["session_id"] == session]
    assert len(seqs) == len(set(seqs))
    # The zombie did run its tool after waking (at-least-once side effects), never visibly.
    zombie_models = [m["index"] for m in cluster.model_calls() if m["pid"] == zombie.pid]
    assert zombie_models[:2] == [0, 1]
