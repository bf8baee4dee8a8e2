"""Standby copies (``CAIRN_SESSIONS__STANDBY``): an instance follows the partitions it does not
own, so when their owner is killed it takes them over reading only what was written since its
copy last caught up, not the whole partitions, and answers every command exactly once."""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from tests.support.runtime_harness import (
    Client,
    Cluster,
    ServiceProcess,
    committed_records,
    invoke,
    metric_total,
    services,
    unique,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.timeout(180)]


async def _restored_records(proc: ServiceProcess) -> float:
    return await metric_total(proc, "cairn_restored_records")


async def test_a_standby_takes_a_killed_owners_partitions_over_from_its_copy(
    cluster: Cluster,
) -> None:
    sessions = [unique("s") for _ in range(24)]
    turns = [[invoke(s, f"turn {k}", agent="cycles") for s in sessions] for k in range(3)]
    standby = {"CAIRN_SESSIONS__STANDBY": "true"}
    with services() as procs:
        victim = cluster.start("victim", **standby)
        procs.append(victim)
        await victim.wait_ready()
        survivor = cluster.start("survivor", **standby)
        procs.append(survivor)
        await survivor.wait_ready()
        async with Client(cluster) as client:
            # Both serve (two partitions each) and each follows the other's.
            await wait_for(lambda: "partitions assigned" in survivor.text(), 30, "assignment")
            for batch in turns[:2]:
                await client.send(*batch)
                await client.wait_results(
                    sum(len(b) for b in turns[: turns.index(batch) + 1]), 60, alive=survivor
                )
            before = await _restored_records(survivor)
            victim.process.send_signal(signal.SIGKILL)
            await client.send(*turns[2])
            await client.wait_results(sum(len(b) for b in turns), 90, alive=survivor)
            after = await _restored_records(survivor)
            assert await survivor.terminate() == 0
            await client.caught_up()
    all_commands = [c for batch in turns for c in batch]
    assert Counter(r["command_id"] for r in client.results) == Counter(
        {c["command_id"]: 1 for c in all_commands}
    )
    for session in sessions:
        texts = [r["message"]["content"][0]["text"] for r in client.session_results(session)]
        assert texts == ["done turn 1", "done turn 2", "done turn 3"], texts
    written = len(
        await committed_records(cluster.bootstrap, cluster.topics.sessions, cluster.partitions)
    )
    # The killed owner's two partitions hold about half of what was written; the takeover read
    # only the little its copies had not seen yet.
    assert after - before < written / 8, (before, after, written)
