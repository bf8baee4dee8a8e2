"""What a cancel covered, against a real broker: its result names it and comes after theirs.

A cancel read together with commands it covers (an owner taking over a backlog) is answered
after them; a cancel of a session Cairn has never seen says it found nothing and writes no
session state.
"""

from __future__ import annotations

import pytest

from tests.support.runtime_harness import (
    Client,
    Cluster,
    committed_records,
    invoke,
    services,
    unique,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]

AGENTS = "tests.support.cancel_agents:registry"
SESSIONS = 12


def _cancel(session_id: str) -> dict[str, object]:
    return {
        "type": "cancel",
        "schema_version": 1,
        "command_id": unique("x"),
        "session_id": session_id,
    }


async def _session_keys(cluster: Cluster) -> set[bytes]:
    """Every key committed to the sessions topic so far."""
    records = await committed_records(
        cluster.bootstrap, cluster.topics.sessions, cluster.partitions
    )
    return {record.key for record in records if record.key is not None}


async def test_a_backlog_read_at_once_answers_covered_commands_before_their_cancel(
    cluster: Cluster,
) -> None:
    pairs = []
    async with Client(cluster) as client:
        # Published while no instance runs: the first owner reads both topics in one go.
        for _ in range(SESSIONS):
            s = unique("s")
            command, cancel = invoke(s, "hello", agent="simple"), _cancel(s)
            await client.send(command)
            await client.send(cancel, topic=cluster.topics.control)
            pairs.append((command["command_id"], str(cancel["command_id"])))
        with services() as procs:
            # One fetch takes the whole backlog (the default takes 20 records at a time), so
            # each partition's commands and cancels are routed in one pass, as the guarantee
            # under test assumes.
            proc = cluster.start(CAIRN_AGENTS=AGENTS, CAIRN_RUNTIME__FETCH_MAX_RECORDS="100")
            procs.append(proc)
            await client.wait_results(2 * SESSIONS, 60, alive=proc)
            await client.caught_up()
    for command_id, cancel_id in pairs:
        (skipped,) = client.results_for(command_id)
        (own,) = client.results_for(cancel_id)
        assert skipped["stop_reason"] == "cancelled", skipped
        # Both keyed by the session, so on one results partition: the order is the offsets'.
        assert skipped["_partition"] == own["_partition"]
        assert skipped["_offset"] < own["_offset"], (skipped, own)
        assert own["cancel"] == {"stopped": None, "skipped": [command_id], "resolved": None}
    assert cluster.model_calls() == []


async def test_a_cancel_of_an_unknown_session_writes_no_session_state(cluster: Cluster) -> None:
    unknown = unique("s")
    cancel = _cancel(unknown)
    with services() as procs:
        proc = cluster.start(CAIRN_AGENTS=AGENTS)
        procs.append(proc)
        await proc.wait_ready()
        async with Client(cluster) as client:
            await client.send(cancel, topic=cluster.topics.control)
            own = await client.result(str(cancel["command_id"]), 30, alive=proc)
            assert own["stop_reason"] == "cancelled" and own["message"] is None, own
            # The same cancel again: recognised, not answered twice.
            await client.send(cancel, topic=cluster.topics.control)
            follow = _cancel(unknown)
            await client.send(follow, topic=cluster.topics.control)
            await client.result(str(follow["command_id"]), 30, alive=proc)
            await client.caught_up()
    assert len(client.results_for(str(cancel["command_id"]))) == 1
    # Its result is committed, and so would be a state written with it: there is none.
    assert unknown.encode() not in await _session_keys(cluster)
    assert own["cancel"] == {"stopped": None, "skipped": [], "resolved": None}
