"""Re-creation of a failed partition owner: logged as a warning with the partition and the error,
spaced by an exponential backoff that a commit resets, and not ready while the partition is down.

The owners are stand-ins that fail on command; no broker is involved (nothing of Kafka runs).
"""

from __future__ import annotations

import asyncio
import logging
from itertools import pairwise
from types import SimpleNamespace
from typing import Any

import pytest

from service.observability.operability import Operability
from service.runtime.partition_owner import OwnerExit
from service.runtime.restart_backoff import RestartBackoff
from service.runtime.runtime import Runtime
from service.runtime.txn_stream import CommitFailedError
from service.settings import Settings

INITIAL_S = 0.1
CAP_S = 0.4


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


async def _run(steps: list[str], ops: Operability) -> _Script:
    script = _Script(steps)
    runtime = Runtime(
        Settings(),
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
