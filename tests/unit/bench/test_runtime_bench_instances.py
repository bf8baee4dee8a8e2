"""The runtime benchmark's bookkeeping for several instances: their commit stats as one, and
when every partition is ready on one of them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, cast

import pytest

from bench.runtime_bench import all_commit_stats, wait_ready
from tests.support.runtime_harness import ServiceProcess


@dataclass
class FakeProcess:
    log: str

    def text(self) -> str:
        return self.log


def _stats(commits: int, results: int, ms_avg: float, ms_max: float) -> str:
    return (
        f"window_s=<10.0>, commits=<{commits}>, results=<{results}>, "
        f"results_per_s=<{results / 10}>, outcomes_per_commit=<{results / commits}>, "
        f"commit_ms_avg=<{ms_avg}>, commit_ms_max=<{ms_max}> | commit stats\n"
    )


def _procs(*logs: str) -> list[ServiceProcess]:
    return cast("list[ServiceProcess]", [FakeProcess(log) for log in logs])


def test_commit_stats_of_instances_add_counts_and_weigh_averages_by_commits() -> None:
    merged: dict[str, Any] = all_commit_stats(
        _procs(
            _stats(100, 1000, 50.0, 90.0) + _stats(300, 3000, 20.0, 70.0),
            _stats(100, 3000, 10.0, 200.0),
        )
    )
    assert merged["commits"] == 400
    assert merged["results"] == 6000
    assert merged["results_per_s"] == 600
    assert merged["window_s"] == 10.0
    assert merged["commit_ms_avg"] == pytest.approx((300 * 20.0 + 100 * 10.0) / 400, abs=0.01)
    assert merged["commit_ms_max"] == 200.0
    assert merged["outcomes_per_commit"] == pytest.approx((300 * 10 + 100 * 30) / 400, abs=0.01)


def test_one_instance_keeps_its_own_stats() -> None:
    assert all_commit_stats(_procs(_stats(10, 20, 1.0, 2.0), "")) == all_commit_stats(
        _procs(_stats(10, 20, 1.0, 2.0))
    )


def _assigned(*partitions: int) -> str:
    return f"partitions=<{sorted(partitions)}> | partitions assigned\n"


def _ready(partition: int) -> str:
    return f"partition=<{partition}> | partition ready\n"


async def test_ready_when_every_partition_is_ready_on_its_latest_owner() -> None:
    first = _assigned(0, 1, 2, 3) + "".join(_ready(p) for p in range(4)) + _assigned(0, 1)
    second = _assigned(2, 3) + _ready(2) + _ready(3)
    procs = _procs(first, second)
    with pytest.raises(TimeoutError):
        # The first instance's last assignment is not ready yet: partitions 0 and 1 are not.
        await wait_ready(procs, 4, timeout=0.3)
    cast("FakeProcess", procs[0]).log += _ready(0) + _ready(1)
    await asyncio.wait_for(wait_ready(procs, 4, timeout=5), 5)
