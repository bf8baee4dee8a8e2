"""Many sessions across instances joining and leaving mid-run: exactly one result per command,
in per-session order, seen by a read_committed consumer."""

from __future__ import annotations

import pytest

from tests.support.runtime_harness import Client, Cluster, invoke, services, unique, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

SESSIONS = 200
COMMANDS_PER_SESSION = 3


async def test_two_instances_a_third_joins_one_leaves_exactly_one_result_in_order(
    kafka_bootstrap: str, tmp_path
) -> None:
    cluster = Cluster(kafka_bootstrap, tmp_path, partitions=6)
    await cluster.create_topics()
    sessions = [unique("s") for _ in range(SESSIONS)]
    waves = [
        [invoke(session, f"turn {wave}", agent="cycles") for session in sessions]
        for wave in range(COMMANDS_PER_SESSION)
    ]
    total = SESSIONS * COMMANDS_PER_SESSION
    with services() as procs:
        first, second = cluster.start("a"), cluster.start("b")
        procs += [first, second]
        await first.wait_ready()
        await second.wait_ready()
        async with Client(cluster) as client:
            await client.send(*waves[0])
            await wait_for(lambda: len(client.results) >= SESSIONS // 2, 60, "first results")
            third = cluster.start("c")
            procs.append(third)
            await client.send(*waves[1])
            await third.wait_ready()
            await wait_for(lambda: len(client.results) >= SESSIONS * 3 // 2, 90, "more results")
            await client.send(*waves[2])
            assert await first.terminate() == 0, first.text()[-3000:]
            await client.wait_results(total, timeout=120)
            assert await second.terminate() == 0
            assert await third.terminate() == 0
            # Everything the instances ever committed is read before counting.
            await client.caught_up()
            results = list(client.results)

    by_command: dict[str, int] = {}
    for result in results:
        by_command[result["command_id"]] = by_command.get(result["command_id"], 0) + 1
    sent = [command["command_id"] for wave in waves for command in wave]
    assert sorted(by_command) == sorted(sent)
    assert set(by_command.values()) == {1}
    for index, session in enumerate(sessions):
        mine = [r for r in results if r["session_id"] == session]
        assert [r["command_id"] for r in mine] == [w[index]["command_id"] for w in waves]
        # The k-th command continued the session's state: it answered turn k.
        texts = [r["message"]["content"][0]["text"] for r in mine]
        assert texts == [f"done turn {k}" for k in range(1, COMMANDS_PER_SESSION + 1)]
        assert all(r["stop_reason"] == "end_turn" for r in mine)
    # Every instance did part of the work: the one that left before it went, the one that
    # joined after it came.
    workers = {call["pid"] for call in cluster.tool_calls()}
    assert {first.pid, second.pid, third.pid} <= workers
