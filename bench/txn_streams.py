"""Transaction streams benchmark: one transactional producer per partition, or one per instance.

The same work both ways: ``--partitions`` partitions, each with a steady supply of outcomes (a
result, an event and a session state record, as a step commits), each commit carrying
``--outcomes`` outcomes of every partition it covers and the input offsets of those partitions
(``send_offsets_to_transaction``). ``per-partition``: one producer per partition, each in its own
closed loop, as the runtime commits today. ``per-instance``: one producer whose every transaction
spans all the partitions, as Kafka Streams' exactly_once_v2 does. Reports, for each, committed
outcomes per second, commits per second, and client and broker CPU per outcome (medians over
``--rounds``), so the gain a single stream could bring is known before it is built.

Broker: ``CAIRN_TEST_BOOTSTRAP`` names a running one (pass ``--broker-pid`` for its CPU);
otherwise one is started from the Maven jars for the run and stopped after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import OffsetAndMetadata

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.runtime_bench import broker, cpu_seconds  # noqa: E402
from service.runtime.clients import transactional_producer  # noqa: E402
from service.settings import KafkaSettings  # noqa: E402
from tests.support.runtime_harness import delete_topics  # noqa: E402

KINDS = ("results", "events", "sessions", "commands")


class Stream:
    """One transactional producer committing the outcomes of ``partitions`` in a loop."""

    def __init__(
        self, producer: AIOKafkaProducer, topics: dict[str, str], partitions: list[int]
    ) -> None:
        self.producer = producer
        self.topics = topics
        self.partitions = partitions
        self.commits = 0
        self.offset = 0

    async def commit(self, outcomes: int, payload: bytes, group: str) -> None:
        producer = self.producer
        await producer.begin_transaction()
        deliveries = []
        for partition in self.partitions:
            for _ in range(outcomes):
                for kind in ("results", "events", "sessions"):
                    deliveries.append(
                        await producer.send(self.topics[kind], payload, partition=partition)
                    )
        await asyncio.gather(*deliveries)
        self.offset += outcomes
        offsets = {
            TopicPartition(self.topics["commands"], p): OffsetAndMetadata(self.offset, "")
            for p in self.partitions
        }
        await producer.send_offsets_to_transaction(offsets, group)
        await producer.commit_transaction()
        self.commits += 1


async def measure(
    streams: list[Stream], args: argparse.Namespace, group: str, broker_pid: int | None
) -> dict[str, float]:
    payload = b"x" * args.record_bytes
    for stream in streams:  # connections, leadership, the broker's hot paths
        for _ in range(args.warmup):
            await stream.commit(args.outcomes, payload, group)
    for stream in streams:
        stream.commits = 0
    stop = asyncio.Event()

    async def loop(stream: Stream) -> None:
        while not stop.is_set():
            await stream.commit(args.outcomes, payload, group)

    broker_before = cpu_seconds(broker_pid) if broker_pid else 0.0
    cpu_before = time.process_time()
    started = time.perf_counter()
    tasks = [asyncio.create_task(loop(stream)) for stream in streams]
    await asyncio.sleep(args.seconds)
    stop.set()
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - started
    commits = sum(stream.commits for stream in streams)
    outcomes = sum(stream.commits * len(stream.partitions) for stream in streams) * args.outcomes
    figures = {
        "outcomes_per_s": outcomes / elapsed,
        "commits_per_s": commits / elapsed,
        "client_cpu_us_per_outcome": (time.process_time() - cpu_before) / outcomes * 1e6,
    }
    if broker_pid:
        broker_cpu = cpu_seconds(broker_pid) - broker_before
        figures["broker_cpu_us_per_outcome"] = broker_cpu / outcomes * 1e6
    return figures


async def bench(args: argparse.Namespace, bootstrap: str, broker_pid: int | None) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:8]
    topics = {kind: f"txn-streams-{run_id}-{kind}" for kind in KINDS}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, args.partitions, 1) for t in topics.values()])
    finally:
        await admin.close()
    try:
        return await _measured(args, bootstrap, broker_pid, run_id, topics)
    finally:
        await delete_topics(AIOKafkaAdminClient(bootstrap_servers=bootstrap), list(topics.values()))


async def _measured(
    args: argparse.Namespace,
    bootstrap: str,
    broker_pid: int | None,
    run_id: str,
    topics: dict[str, str],
) -> dict[str, Any]:
    kafka = KafkaSettings(bootstrap_servers=bootstrap)
    partitions = list(range(args.partitions))
    report: dict[str, Any] = {
        "partitions": args.partitions,
        "outcomes_per_partition_per_commit": args.outcomes,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "record_bytes": args.record_bytes,
    }
    for mode in ("per-partition", "per-instance"):
        rounds = []
        for round_index in range(args.rounds):
            prefix = f"txn-streams-{run_id}-{mode}-{round_index}"
            groups = [[p] for p in partitions] if mode == "per-partition" else [partitions]
            producers = [
                transactional_producer(kafka, f"{prefix}-{i}", transaction_timeout_ms=30_000)
                for i in range(len(groups))
            ]
            for producer in producers:
                await producer.start()
            try:
                streams = [
                    Stream(producer, topics, group)
                    for producer, group in zip(producers, groups, strict=True)
                ]
                rounds.append(await measure(streams, args, f"{prefix}-group", broker_pid))
            finally:
                for producer in producers:
                    await producer.stop()
        report[mode] = {
            key: round(statistics.median(r[key] for r in rounds), 1) for key in rounds[0]
        }
    return report


def table(report: dict[str, Any]) -> str:
    one, each = report["per-instance"], report["per-partition"]
    rows = [("", "per partition", "per instance", "ratio")]
    for key in each:
        ratio = one[key] / each[key] if each[key] else float("nan")
        rows.append((key, f"{each[key]:,}", f"{one[key]:,}", f"{ratio:.2f}x"))
    width = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join(
        "  ".join(cell.rjust(width[i]) if i else cell.ljust(width[i]) for i, cell in enumerate(row))
        for row in rows
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--outcomes", type=int, default=4, help="per partition per commit")
    parser.add_argument("--seconds", type=float, default=10.0, help="per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=20, help="commits per stream first")
    parser.add_argument("--record-bytes", type=int, default=500)
    parser.add_argument("--broker-pid", type=int, default=None, help="for CPU accounting")
    parser.add_argument("--out", default=str(REPO / "bench-results" / "txn_streams.json"))
    args = parser.parse_args()
    with broker({}) as (bootstrap, started_pid):
        report = asyncio.run(bench(args, bootstrap, args.broker_pid or started_pid))
    print(table(report))
    print(json.dumps(report))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
