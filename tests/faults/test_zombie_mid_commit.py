"""A zombie stopped between its offset commit and its EndTxn: its transaction holds the partition's
offsets (and a result) open while another instance takes the partition over. The successor must
neither wait for the broker's transaction timeout nor let that transaction commit: it fences the
zombie's producer (its own producer of the partition does; with one stream per instance, it
fences the producer the unstable offsets name), which aborts it, and redoes the command. Woken
up, the zombie's EndTxn is refused; nothing it wrote becomes visible, and every command is
answered exactly once."""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from tests.support.runtime_harness import (
    Client,
    Cluster,
    invoke,
    services,
    transaction_streams,
    unique,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.timeout(180)]


async def test_a_zombie_stopped_before_its_end_txn_commits_nothing(cluster: Cluster) -> None:
    session = unique("s")
    command = invoke(session, "hello", agent="simple")
    with services() as procs:
        zombie = cluster.start(
            "zombie",
            CAIRN_FAULTS__STOP_AT="after_produce_before_commit",
            CAIRN_FAULTS__STOP_AFTER="1",
        )
        procs.append(zombie)
        await zombie.wait_ready()
        async with Client(cluster) as client:
            await client.send(command)
            # The offsets and the result are in the zombie's open transaction; it stops there.
            await zombie.wait_log("signal=<SIGSTOP>", timeout=30)
            successor = cluster.start("successor")
            procs.append(successor)
            result = await client.result(command["command_id"], timeout=60, alive=successor)
            assert result["stop_reason"] == "end_turn"
            zombie.signal(signal.SIGCONT)
            await wait_for(
                lambda: zombie.log_count("producer fenced") >= 1,
                60,
                "the zombie noticing it was fenced",
                on_timeout=zombie.text,
            )
            later = invoke(session, "again", agent="simple")
            await client.send(later)
            await client.result(later["command_id"], timeout=60, alive=successor)
            assert await zombie.terminate() == 0, zombie.text()[-3000:]
            assert "never retrieved" not in zombie.text(), zombie.text()[-3000:]
            assert await successor.terminate() == 0, successor.text()[-3000:]
            await client.caught_up()
    assert Counter(r["command_id"] for r in client.results) == Counter(
        {command["command_id"]: 1, later["command_id"]: 1}
    )
    seqs = [e["seq"] for e in client.events if e["session_id"] == session]
    assert len(seqs) == len(set(seqs))
    if transaction_streams() == "instance":
        # The successor fenced the producer the unstable offsets named instead of waiting out
        # its transaction (with a producer per partition, the successor's own start fences it).
        assert successor.log_count("fencing the producer") >= 1, successor.text()[-3000:]
