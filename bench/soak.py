"""Soak benchmark: does a serving instance's memory stay flat as sessions come and go?

One service process beside a broker (as ``make bench``: ``CAIRN_TEST_BOOTSTRAP`` names a running
one, otherwise one is started from the Maven jars). The driver runs ``--concurrency`` sessions
at a time, each a fresh session id that lives one short cycle and is gone: an invoke, an
untargeted cancel, a cancel naming a command never sent, a command refused (an unknown field),
then a delete, each sent once the previous one is answered. Idle expiry is on (its TTL longer
than the run) and the decoded-session cache small, so nothing the service is meant to keep
grows with the sessions it has seen: what an instance keeps per session beyond them is a leak.

It samples the service's resident memory every second and reports it after the warm-up and at
the end, and the growth per session in between (a median of the last samples at each end, as
the allocator moves a few hundred KB up and down), with the sessions done and the memory every
30 s. What an owner remembers on purpose is bounded but fills first: the command ids of the
sessions it deleted (100,000 per partition, about 4 per session here) and the partition hashes
of record keys (65,536 per instance), so warm up past them (with 2 partitions, about 65,000
sessions) to see the line flat. A benchmark, not a test: it reports, it does not assert.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.runtime_bench import broker, wait_ready  # noqa: E402
from tests.support.runtime_harness import Cluster  # noqa: E402

STEPS = ("invoke", "cancel", "targeted", "refused", "delete")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Soak:
    """Drives sessions through their cycle; counts the ones done."""

    def __init__(self, cluster: Cluster, run: str) -> None:
        self.cluster = cluster
        self.run = run
        self.next_session = 0
        self.done = 0
        self.errors: list[str] = []
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}

    async def __aenter__(self) -> Soak:
        options = self.cluster.client_options()
        self.producer = AIOKafkaProducer(**options, linger_ms=1)
        await self.producer.start()
        self.consumer = AIOKafkaConsumer(
            **options, isolation_level="read_committed", enable_auto_commit=False
        )
        await self.consumer.start()
        results = self.cluster.topics.results
        partitions = [TopicPartition(results, p) for p in range(self.cluster.partitions)]
        self.consumer.assign(partitions)
        await self.consumer.seek_to_end(*partitions)
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *_: object) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self.consumer.stop()
        await self.producer.stop()

    async def _read(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=100, max_records=5000)
            for records in batches.values():
                for record in records:
                    result = orjson.loads(record.value)
                    waiting = self._waiting.pop(result.get("command_id"), None)
                    if waiting is not None and not waiting.done():
                        waiting.set_result(result)

    async def _send(self, topic: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = asyncio.get_running_loop().create_future()
        self._waiting[body["command_id"]] = answer
        key = body["session_id"].encode()
        await self.producer.send(topic, orjson.dumps({"schema_version": 1, **body}), key=key)
        return await asyncio.wait_for(answer, 60)

    async def cycle(self) -> None:
        """One session's life, each command sent once the one before it is answered."""
        sid = f"{self.run}-{self.next_session}"
        self.next_session += 1
        topics = self.cluster.topics
        base = {"session_id": sid}
        sent: list[tuple[str, dict[str, Any]]] = [
            (topics.commands, {"type": "invoke", "agent": "simple", "prompt": "hello"}),
            (topics.control, {"type": "cancel"}),
            (topics.control, {"type": "cancel", "target_command_id": f"{sid}-never"}),
            (topics.commands, {"type": "invoke", "agent": "simple", "prompt": "x", "oops": 1}),
            (topics.commands, {"type": "delete"}),
        ]
        expected = ("end_turn", "cancelled", "cancelled", "error", "end_turn")
        for step, ((topic, body), stop_reason) in enumerate(zip(sent, expected, strict=True)):
            command_id = f"{sid}-{STEPS[step]}"
            result = await self._send(topic, {**base, **body, "command_id": command_id})
            if result["stop_reason"] != stop_reason:
                self.errors.append(f"{command_id}: {result['stop_reason']} {result.get('error')}")
        self.done += 1

    async def run_for(self, seconds: float, concurrency: int) -> None:
        deadline = time.monotonic() + seconds

        async def worker() -> None:
            while time.monotonic() < deadline:
                await self.cycle()

        async with asyncio.TaskGroup() as tasks:
            for _ in range(concurrency):
                tasks.create_task(worker())


def level(samples: list[tuple[int, int]], last: int = 5) -> tuple[int, int]:
    """Sessions done and resident bytes, medians of the last ``last`` samples."""
    tail = samples[-last:]
    return (
        int(statistics.median(done for done, _ in tail)),
        int(statistics.median(rss for _, rss in tail)),
    )


@contextlib.contextmanager
def sampling(pid: int, soak: Soak, into: list[tuple[int, int]]) -> Iterator[None]:
    async def sample() -> None:
        while True:
            into.append((soak.done, rss_bytes(pid)))
            await asyncio.sleep(1.0)

    task = asyncio.get_running_loop().create_task(sample())
    try:
        yield
    finally:
        task.cancel()


async def soak(args: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="cairn-soak-"))
    cluster = Cluster(bootstrap, workdir, partitions=args.partitions)
    await cluster.create_topics()
    env = {
        "CAIRN_TEST_TOOL_LOG": "",
        "CAIRN_TEST_MODEL_LOG": "",
        "CAIRN_LOG_LEVEL": "INFO",
        "CAIRN_SESSIONS__IDLE_TTL_S": str(24 * 3600),
        "CAIRN_SESSIONS__CACHE_MAX_BYTES": str(args.cache_mb * 1024 * 1024),
    }
    proc = cluster.start("soak", **env)
    report: dict[str, Any] = {
        "partitions": args.partitions,
        "concurrency": args.concurrency,
        "cache_max_mb": args.cache_mb,
    }
    try:
        await wait_ready([proc], args.partitions)
        samples: list[tuple[int, int]] = []
        async with Soak(cluster, cluster.prefix) as driver:
            with sampling(proc.pid, driver, samples):
                await driver.run_for(args.warmup, args.concurrency)
                warm = level(samples)
                started = time.monotonic()
                await driver.run_for(args.duration, args.concurrency)
                end = level(samples)
                elapsed = time.monotonic() - started
        sessions = end[0] - warm[0]
        report |= {
            "sessions_warmup": warm[0],
            "sessions_measured": sessions,
            "sessions_per_s": round(sessions / elapsed, 1),
            "rss_after_warmup_mb": round(warm[1] / 2**20, 1),
            "rss_at_end_mb": round(end[1] / 2**20, 1),
            "rss_growth_bytes_per_session": round((end[1] - warm[1]) / max(sessions, 1), 1),
            "rss_mb_every_30_s": [[done, round(rss / 2**20, 1)] for done, rss in samples[::30]],
            "wrong_answers": len(driver.errors),
            "first_wrong_answers": driver.errors[:5],
        }
    finally:
        await proc.terminate()
        await cluster.delete_topics()
        shutil.rmtree(workdir, ignore_errors=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=200, help="sessions at a time")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds before measuring")
    parser.add_argument("--duration", type=float, default=240.0, help="seconds measured")
    parser.add_argument("--cache-mb", type=int, default=8, help="decoded-session cache budget")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "soak.json")
    args = parser.parse_args()
    with broker({}) as (bootstrap, _):
        report = asyncio.run(soak(args, bootstrap))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
