"""Re-creation of a failed partition owner: logged as a warning with the partition and the error,
spaced by an exponential backoff that a commit resets, not ready while the partition is down,
and only once the group coordinator answered a heartbeat sent after the wait: an instance whose
membership is over (woken from a pause past the session timeout, before its own heartbeat told
it) starts no producer that would fence the partition's new owner.

The owners of the backoff tests are stand-ins that fail on command; those of the membership
tests are real owners on the in-memory Kafka. No broker is involved.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError

from service.observability.operability import Operability
from service.runtime.partition_owner import OwnerExit
from service.runtime.restart_backoff import RestartBackoff
from service.runtime.runtime import Runtime
from service.runtime.txn_stream import CommitFailedError
from service.settings import Settings
from tests.support.memory_kafka import MemoryKafka, MemoryMember
from tests.support.owner_harness import (
    PARTITION_0,
    Instance,
    answered,
    command,
    committed,
    put,
    shorten_waits,
    until,
)

pytestmark = pytest.mark.timeout(60)

INITIAL_S = 0.1
CAP_S = 0.4
HEARTBEAT_MS = 100


def test_the_wait_doubles_up_to_the_cap_and_a_success_resets_it() -> None:
    backoff = RestartBackoff(initial_s=1.0, cap_s=5.0)
    assert [backoff.failed() for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert backoff.failures == 5
    backoff.succeeded()
    assert [backoff.failed() for _ in range(2)] == [1.0, 2.0]
    for _ in range(2000):
        backoff.failed()
    assert backoff.failed() == 5.0


class _Script:
    """What each successive owner of the partition does: fail (after committing or not), or
    serve until stopped."""

    def __init__(self, steps: list[str]) -> None:
        self.steps = steps
        self.started: list[float] = []
        self.ready_while_down: list[bool] = []
        self.serving = asyncio.Event()


class _StandInOwner:
    def __init__(self, script: _Script, partition: int, ctx: Any) -> None:
        self.partition = partition
        self._script = script
        self._ctx = ctx
        self._stop = asyncio.Event()
        self.restored = False
        self.transactions = 0
        self.error: BaseException | None = None
        self.exit: OwnerExit | None = None

    def request_stop(self, grace_s: float) -> None:
        self._stop.set()

    async def run(self) -> OwnerExit:
        script = self._script
        script.started.append(asyncio.get_running_loop().time())
        step = script.steps[len(script.started) - 1]
        if step == "serve":
            self.restored = True
            self._ctx.on_restored(self.partition)
            script.serving.set()
            await self._stop.wait()
            return OwnerExit.STOPPED
        await asyncio.sleep(0)
        if step == "commit, then fail":
            self.transactions = 1
        self.error = CommitFailedError(f"commit of partition {self.partition} timed out")
        return OwnerExit.FAILED


async def _run(steps: list[str], ops: Operability, kafka: MemoryKafka | None = None) -> _Script:
    script = _Script(steps)
    settings = Settings()
    settings.group.heartbeat_interval_ms = HEARTBEAT_MS
    runtime = Runtime(
        settings,
        {},
        operability=ops,
        owner_factory=lambda partition, ctx: _StandInOwner(  # type: ignore[arg-type,return-value]
            script, partition, ctx
        ),
        restart_backoff=lambda: RestartBackoff(initial_s=INITIAL_S, cap_s=CAP_S),
    )

    async def watch_readiness() -> None:
        while not script.serving.is_set():
            if len(script.started) > 0:
                script.ready_while_down.append(runtime.ready or ops.readiness())
            await asyncio.sleep(0.005)

    async with asyncio.TaskGroup() as tasks:
        # The runtime's own task group and owner context, as run() would set them up.
        runtime._tasks = tasks
        runtime._ctx = SimpleNamespace(on_restored=runtime._restored)  # type: ignore[assignment]
        runtime._member = MemoryMember(kafka or MemoryKafka())
        watcher = tasks.create_task(watch_readiness())
        await runtime._assign({3})
        await asyncio.wait_for(script.serving.wait(), 10)
        await watcher
        assert runtime.ready and ops.readiness()
        await runtime._stop_owners({3})
    return script


def _gaps(started: list[float]) -> list[float]:
    return [later - earlier for earlier, later in pairwise(started)]


async def test_repeated_failures_back_off_exponentially_and_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="service.runtime.runtime")
    ops = Operability(port=None)
    script = await _run(["fail", "fail", "fail", "fail", "serve"], ops)
    gaps = _gaps(script.started)
    expected = [INITIAL_S, 2 * INITIAL_S, CAP_S, CAP_S]
    assert len(gaps) == len(expected)
    for gap, wanted in zip(gaps, expected, strict=True):
        assert wanted * 0.9 <= gap < wanted + 1.0, (gaps, expected)
    # Every re-created owner re-reads from the committed offsets.
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 4
    for failures, record in enumerate(warnings, start=1):
        message = record.getMessage()
        assert message.startswith("partition=<3>, error=<CommitFailedError(")
        assert f"failures=<{failures}>" in message
    # While the partition had no serving owner the instance was never ready.
    assert script.ready_while_down and not any(script.ready_while_down)


async def test_a_commit_since_the_last_failure_resets_the_backoff() -> None:
    ops = Operability(port=None)
    script = await _run(["fail", "fail", "commit, then fail", "serve"], ops)
    gaps = _gaps(script.started)
    assert gaps[0] >= INITIAL_S * 0.9 and gaps[1] >= 2 * INITIAL_S * 0.9
    # Back to the shortest wait, well below the 4x a third failure in a row would have cost.
    assert INITIAL_S * 0.9 <= gaps[2] < 3 * INITIAL_S, gaps


async def test_a_heartbeat_left_unanswered_is_sent_again_a_heartbeat_interval_later() -> None:
    kafka = MemoryKafka()
    kafka.fail("heartbeat", KafkaConnectionError("coordinator moving"), times=2)
    script = await _run(["fail", "serve"], Operability(port=None), kafka)
    assert [call for call in kafka.calls if call[1] == "heartbeat"] == [("group", "heartbeat")] * 3
    (gap,) = _gaps(script.started)
    wanted = INITIAL_S + 2 * HEARTBEAT_MS / 1000
    assert wanted * 0.9 <= gap < wanted + 1.0, gap


@pytest.mark.parametrize("membership_over", [False, True], ids=["member", "membership over"])
async def test_a_failed_owner_is_re_created_only_while_the_group_counts_this_member(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, membership_over: bool
) -> None:
    """An instance paused past the session timeout lost partition 0 to another instance, whose
    owner started the partition's producer (the same transactional id, ``<group>-0``) and
    aborted the paused one's transaction. Woken, the instance's owner fails at its next commit
    and the instance still holds partition 0 until its own heartbeat tells it otherwise: an
    owner re-created in that window started the producer again and fenced the live owner. On a
    member in good standing a failed owner is re-created after its backoff, as before."""
    shorten_waits(monkeypatch)
    kafka = MemoryKafka()
    put(kafka, command(0))
    async with Instance(kafka, tmp_path, partition_streams=True) as instance:
        runtime = Runtime(
            instance.settings,
            {},
            restart_backoff=lambda: RestartBackoff(initial_s=INITIAL_S, cap_s=CAP_S),
        )
        async with asyncio.timeout(30), asyncio.TaskGroup() as tasks:
            # What run() sets up, around the instance's consumer loop and stream factory.
            runtime._tasks = tasks
            runtime._ctx = instance.ctx
            runtime._owners = instance.owners
            runtime._member = MemoryMember(kafka)
            await runtime._assign({0})
            first = runtime._owners[0]
            owning = runtime._owner_tasks[first]
            await until(lambda: committed(kafka) == 1, "c0 committed")
            if membership_over:
                kafka.rebalance()  # the group moved on during the pause; the member has not heard
            starts = kafka.calls.count((PARTITION_0, "start"))
            kafka.fail("send", KafkaConnectionError("the commit failed"))
            put(kafka, command(1))
            failed_at = asyncio.get_running_loop().time()
            await owning
            assert first.exit is OwnerExit.FAILED
            if membership_over:
                assert 0 not in runtime._owners, "an owner was re-created for a lost partition"
                assert ("group", "heartbeat") in kafka.calls, "the member was not asked"
            else:
                assert runtime._owners[0] is not first
                took_s = asyncio.get_running_loop().time() - failed_at
                assert took_s < INITIAL_S + 0.5, "not re-created promptly (backoff, heartbeat)"
                await until(lambda: committed(kafka) == 2, "c1 committed by the re-created owner")
                await runtime._stop_owners({0})
    restarted = kafka.calls.count((PARTITION_0, "start")) - starts
    assert restarted == (0 if membership_over else 1), "producers started after the failure"
    assert answered(kafka) == Counter({"c0": 1} if membership_over else {"c0": 1, "c1": 1})


async def test_a_stop_does_not_wait_for_a_heartbeat_left_unanswered() -> None:
    # The member's heartbeat waits up to a session timeout for the coordinator; a stop ends
    # the question at once, and nothing is re-created.
    kafka = MemoryKafka()
    gate = kafka.hang("heartbeat")
    script = _Script(["fail", "serve"])
    runtime = Runtime(
        Settings(),
        {},
        operability=Operability(port=None),
        owner_factory=lambda partition, ctx: _StandInOwner(  # type: ignore[arg-type,return-value]
            script, partition, ctx
        ),
        restart_backoff=lambda: RestartBackoff(initial_s=INITIAL_S, cap_s=CAP_S),
    )
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(5):
        async with asyncio.TaskGroup() as tasks:
            runtime._tasks = tasks
            runtime._ctx = SimpleNamespace(on_restored=runtime._restored)  # type: ignore[assignment]
            runtime._member = MemoryMember(kafka)
            await runtime._assign({3})
            while ("group", "heartbeat") not in kafka.calls:
                await asyncio.sleep(0.005)
            stopped_at = loop.time()
            runtime._begin_stopping()  # what a stop and a drain begin with
        took_s = loop.time() - stopped_at  # the task group waited for the failed owner's task
    assert not gate.is_set()
    assert len(script.started) == 1, "an owner was re-created while stopping"
    assert took_s < 1.0, took_s


async def test_a_rebalance_is_not_ready_from_the_revoke_until_the_new_partitions_restored() -> None:
    # An eager rebalance revokes everything first: between the revoke and the new assignment the
    # instance holds nothing, and is not ready although nothing restores.
    script = _Script(["serve", "serve"])
    ops = Operability(port=None)
    runtime = Runtime(
        Settings(),
        {},
        operability=ops,
        owner_factory=lambda partition, ctx: _StandInOwner(  # type: ignore[arg-type,return-value]
            script, partition, ctx
        ),
    )
    async with asyncio.timeout(5), asyncio.TaskGroup() as tasks:
        runtime._tasks = tasks
        runtime._ctx = SimpleNamespace(on_restored=runtime._restored)  # type: ignore[assignment]
        await runtime._assign({3})
        await script.serving.wait()
        assert ops.readiness()
        await runtime._revoke({3})
        assert not ops.readiness()
        assert ops.readiness.describe()["rebalancing"] is True
        assert ops.readiness.describe()["assigned"] == []
        script.serving.clear()
        await runtime._assign({4})
        await script.serving.wait()
        assert ops.readiness()
        assert ops.readiness.describe()["assigned"] == ["4"]
        await runtime._stop_owners({4})
