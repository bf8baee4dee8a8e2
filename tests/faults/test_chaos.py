"""Faults of every kind, in a random order at random moments, under a steady load of multi-step
sessions on three instances: an instance killed (kill -9), stopped past its session timeout and
resumed (SIGSTOP, then SIGCONT: a zombie that comes back), drained (SIGTERM), and the broker
restarted (a controlled shutdown or a kill -9). A killed or drained instance is replaced at once.
Hostile records (random bytes, mutated commands: ``tests.support.hostile``) go into the commands
and control topics all along, onto the same partitions as the sessions, and commands the
sessions must refuse (an unknown agent, a resume with nothing to resume) into their queues. In
three more sessions every turn is cancelled at a random moment (targeted or not, its running
tools let finish or not). Three more pause at every checkpoint and three at an interrupt in
every turn, each pause resumed once its result is read.

After each fault every session must be answered again; at the end, with every instance stopped,
what the client saw must be whole (``check_whole``: one result per command, in order, each turn
paused where it must and nowhere else, one answer per hostile record, each cancel answered after
what it stopped or skipped, events neither doubled nor missing, tools run again only by a new
owner, no transaction left open).

``CAIRN_TEST_CHAOS_FAULTS`` sets how many faults (default 6), ``CAIRN_TEST_CHAOS_SEED`` the seed
(default: a new one each run). Every failure names the seed and the faults made, so a run can be
repeated.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.own_broker import OwnBroker, own_broker
from tests.support.runtime_harness import Cluster, ServiceProcess, services, unique
from tests.support.under_load import Hostile, Load, RestartTolerantClient, check_whole, restart

FAULTS = int(os.environ.get("CAIRN_TEST_CHAOS_FAULTS", "6"))
SEED = int(os.environ.get("CAIRN_TEST_CHAOS_SEED") or random.SystemRandom().randrange(2**32))

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.timeout(180 + 60 * FAULTS)]

INSTANCES = 3
SESSIONS = {"long": 6, "slowtools": 6}
"""Sessions per agent: six tool cycles a turn, and two cycles of a tool that takes a while."""
CANCELLED = 3
"""Sessions of the slow tools whose every turn is followed by a cancel of it."""
PAUSING = {"cycles": 3, "approval": 3}
"""Sessions that pause in every turn: two tool cycles with checkpointing on, and a tool that
asks a human first (an interrupt)."""
SERVICE_ENV = {"CAIRN_TEST_TOOL_SLEEP": "0.2", "CAIRN_RUNTIME__COMMIT_TIMEOUT_S": "3"}
KINDS = ("kill", "stop", "term", "broker-stop", "broker-kill")
WEIGHTS = (4, 3, 2, 1, 1)
"""Instance faults more often than broker restarts, which take the longest."""
STOPPED_S = (1.0, 8.0)
"""How long a stopped instance stays stopped: from under to well past its session timeout."""
HOSTILE = 100 + 60 * FAULTS
"""Hostile records at most (one every 0.15 s on average, until the load stops)."""


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[OwnBroker]:
    with own_broker(tmp_path / "kafka") as started:
        yield started


async def test_random_faults_under_load_lose_and_double_nothing(
    broker: OwnBroker, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    made: list[str] = []

    def context() -> str:
        return f"CAIRN_TEST_CHAOS_SEED={SEED}, faults made: {made}"

    cluster = Cluster(broker.bootstrap, tmp_path)
    await cluster.create_topics()
    sessions = {unique("s"): agent for agent, count in SESSIONS.items() for _ in range(count)}
    cancelled = {unique("s"): "slowtools" for _ in range(CANCELLED)}
    pausing = {unique("s"): agent for agent, count in PAUSING.items() for _ in range(count)}
    checkpointed = [s for s, agent in pausing.items() if agent == "cycles"]
    broker_up = asyncio.Event()
    broker_up.set()
    with services() as procs:
        live: list[ServiceProcess] = []

        def start() -> None:
            proc = cluster.start(f"i{len(procs)}", **SERVICE_ENV)
            procs.append(proc)
            live.append(proc)

        for _ in range(INSTANCES):
            start()
        for proc in live:
            await proc.wait_ready(timeout=60)
        async with RestartTolerantClient(cluster, broker_up) as client:
            load = Load(
                client,
                sessions | cancelled | pausing,
                cancelled,
                random.Random(f"{SEED}-cancels"),
                checkpointed,
                context,
            )
            hostile = Hostile(client, load, HOSTILE, SEED)
            async with asyncio.TaskGroup() as group:
                drivers = [group.create_task(load.drive(s, a)) for s, a in load.sessions.items()]
                await load.every_session_answered_again(f"before any fault ({context()})")
                # Once every session has a state: a refusal's code depends on it.
                drivers.append(group.create_task(hostile.drive(load.stopping)))
                for _ in range(FAULTS):
                    # A random moment of the sessions' steps: a commit, a tool, a restore.
                    await asyncio.sleep(rng.uniform(0.0, 2.0))
                    kind = rng.choices(KINDS, WEIGHTS)[0]
                    victim = rng.choice(live)
                    made.append(kind if kind.startswith("broker") else f"{kind} {victim.name}")
                    if kind == "kill":
                        victim.kill()
                        live.remove(victim)
                        start()
                    elif kind == "stop":
                        victim.signal(signal.SIGSTOP)
                        await asyncio.sleep(rng.uniform(*STOPPED_S))
                        victim.signal(signal.SIGCONT)
                    elif kind == "term":
                        live.remove(victim)
                        start()
                        code = await victim.terminate(timeout=60)
                        assert code == 0, (context(), victim.text()[-3000:])
                    else:
                        await restart(broker, broker_up, kill=kind == "broker-kill")
                    for proc in live:
                        assert proc.alive, (context(), proc.name, proc.text()[-3000:])
                    await load.every_session_answered_again(f"after {made[-1]} ({context()})")
                load.stopping.set()
                await asyncio.gather(*drivers)
            await client.caught_up()
            for proc in live:
                code = await proc.terminate(timeout=60)
                assert code == 0, (context(), proc.name, proc.text()[-3000:])
            await client.caught_up()

    await check_whole(broker, cluster, client, load, procs, context(), hostile)
