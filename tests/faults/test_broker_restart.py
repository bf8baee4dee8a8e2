"""Broker restarts, controlled shutdowns and kill -9 alike, under a steady load of multi-step
sessions on two instances: every command is answered once and what a client sees stays whole.

Proven each time: one result per command; on the events topic (read_committed) no (session, seq)
twice and every session's seqs without a gap, so no step's events became visible twice (a
transaction marker covering a batch left open by an earlier producer would show exactly so); a
tool ran, and showed as started, again only through a new owner of its partition; and once
everything settled, no transaction is left open on the sessions, results or events topics (last
stable offset equals the high watermark on every partition).

A commit outlives the commit timeout of the instances (3 s here) while the broker is away, so
every restart also re-creates the owners that were committing: the new owner of a partition
fences the old producer and restores the partition from what is committed, which is where a
transaction the broker left open would show.

``CAIRN_TEST_BROKER_RESTARTS`` sets how many restarts (default 4);
``CAIRN_TEST_BROKER_RESTART_KINDS`` their kinds in turn (default ``stop,kill``: a controlled
shutdown, then a kill -9); ``CAIRN_TEST_BROKER_VERIFICATION=false`` starts the broker without
transaction verification (KIP-890 part 1), to see what that protection is worth.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.own_broker import OwnBroker, own_broker
from tests.support.runtime_harness import Cluster, services, unique
from tests.support.txn_probe import VERIFICATION_OFF
from tests.support.under_load import Load, RestartTolerantClient, check_whole, restart

RESTARTS = int(os.environ.get("CAIRN_TEST_BROKER_RESTARTS", "4"))
KINDS = os.environ.get("CAIRN_TEST_BROKER_RESTART_KINDS", "stop,kill").split(",")
VERIFICATION = os.environ.get("CAIRN_TEST_BROKER_VERIFICATION", "true").lower() != "false"

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.faults,
    pytest.mark.timeout(150 + 45 * RESTARTS),
]

SESSIONS = {"long": 6, "slowtools": 6}
"""Sessions per agent: six tool cycles a turn, and two cycles of a tool that takes a while."""
SERVICE_ENV = {"CAIRN_TEST_TOOL_SLEEP": "0.2", "CAIRN_RUNTIME__COMMIT_TIMEOUT_S": "3"}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[OwnBroker]:
    with own_broker(tmp_path / "kafka", {} if VERIFICATION else VERIFICATION_OFF) as started:
        yield started


async def test_broker_restarts_under_load_lose_and_double_nothing(
    broker: OwnBroker, tmp_path: Path
) -> None:
    cluster = Cluster(broker.bootstrap, tmp_path)
    await cluster.create_topics()
    sessions = {unique("s"): agent for agent, count in SESSIONS.items() for _ in range(count)}
    broker_up = asyncio.Event()
    broker_up.set()
    with services() as procs:
        for name in ("one", "two"):
            procs.append(cluster.start(name, **SERVICE_ENV))
        for proc in procs:
            await proc.wait_ready(timeout=60)
        async with RestartTolerantClient(cluster, broker_up) as client:
            load = Load(client, sessions)
            async with asyncio.TaskGroup() as group:
                drivers = [group.create_task(load.drive(s, a)) for s, a in sessions.items()]
                for n in range(RESTARTS + 1):
                    # Every session answered again since the last restart: all partitions are
                    # served and committing when the broker goes away (and at the end, every
                    # owner has written to its partitions after the last restart).
                    await load.every_session_answered_again(f"after restart {n}")
                    if n < RESTARTS:
                        await restart(broker, broker_up, kill=KINDS[n % len(KINDS)] == "kill")
                load.stopping.set()
                await asyncio.gather(*drivers)
            await client.caught_up()
            for proc in procs:
                assert await proc.terminate(timeout=60) == 0, proc.text()[-3000:]
            await client.caught_up()

    await check_whole(broker, cluster, client, load, procs)
