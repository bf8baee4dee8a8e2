"""Transaction cost benchmark: what one commit of a partition costs, apart from the service.

A transactional producer built as the runtime builds one (``--transactions-version`` 1 or 2)
writes one small record to each of three partitions (result, event, session state) per
transaction, as a partition owner's commit does at low load. Reports the median over several
rounds of: wall time per commit, client CPU per commit, broker CPU per commit (when its pid is
known) and how long each request type took.
Prints a table and one JSON object (also written to ``bench-results/txn_cost.json``).

Broker: ``CAIRN_TEST_BOOTSTRAP`` names a running one (pass ``--broker-pid``); otherwise one is
started from the Maven jars for the run and stopped after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.client import AIOKafkaClient

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.runtime_bench import broker, cpu_seconds  # noqa: E402
from service.runtime.kafka_transport import KafkaTxnProducer  # noqa: E402
from service.runtime.transport import TxnProducer  # noqa: E402
from service.runtime.txn_v2 import KafkaTxnV2Producer  # noqa: E402
from service.runtime.work import OutRecord  # noqa: E402
from service.settings import KafkaSettings  # noqa: E402
from tests.support.runtime_harness import delete_topics  # noqa: E402

RequestTimes = dict[str, list[float]]


def time_requests(times: RequestTimes) -> Callable[[], None]:
    """Records how long every request of every aiokafka client takes; returns the undo."""
    original = AIOKafkaClient.send

    async def send(self: AIOKafkaClient, node_id: int, request: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await original(self, node_id, request, **kwargs)
        finally:
            times[type(request).__name__].append(time.perf_counter() - started)

    AIOKafkaClient.send = send  # type: ignore[method-assign]

    def undo() -> None:
        AIOKafkaClient.send = original  # type: ignore[method-assign]

    return undo


async def commit(producer: TxnProducer, topics: list[str], payload: bytes) -> None:
    await producer.begin()
    deliveries = [
        delivery
        for topic in topics
        for delivery, _ in await producer.send(topic, 0, [OutRecord(topic, b"k", payload)])
    ]
    await asyncio.gather(*deliveries)
    await producer.commit()


async def round_of(
    run: Callable[[], Awaitable[None]], commits: int, gap_s: float, broker_pid: int | None
) -> dict[str, float]:
    broker_before = cpu_seconds(broker_pid) if broker_pid else 0.0
    cpu_before = time.process_time()
    busy = 0.0
    for _ in range(commits):
        started = time.perf_counter()
        await run()
        busy += time.perf_counter() - started
        await asyncio.sleep(gap_s)
    figures = {
        "wall_ms": busy / commits * 1000,
        "client_cpu_ms": (time.process_time() - cpu_before) / commits * 1000,
    }
    if broker_pid:
        figures["broker_cpu_ms"] = (cpu_seconds(broker_pid) - broker_before) / commits * 1000
    return figures


async def bench(args: argparse.Namespace, bootstrap: str, broker_pid: int | None) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:8]
    topics = [f"txn-cost-{run_id}-{name}" for name in ("results", "events", "sessions")]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1) for topic in topics])
    finally:
        await admin.close()
    try:
        return await _measured(args, bootstrap, broker_pid, run_id, topics)
    finally:
        await delete_topics(AIOKafkaAdminClient(bootstrap_servers=bootstrap), topics)


async def _measured(
    args: argparse.Namespace,
    bootstrap: str,
    broker_pid: int | None,
    run_id: str,
    topics: list[str],
) -> dict[str, Any]:
    kafka = KafkaSettings(bootstrap_servers=bootstrap)
    make = KafkaTxnV2Producer if args.transactions_version == 2 else KafkaTxnProducer
    producer: TxnProducer = make(kafka, f"txn-cost-{run_id}", 30_000)
    await producer.start()
    payload = b"x" * args.record_bytes
    times: RequestTimes = defaultdict(list)
    try:
        for _ in range(args.warmup):  # topic leadership, connections, broker JIT
            await commit(producer, topics, payload)
        undo = time_requests(times)
        try:
            rounds = [
                await round_of(
                    lambda: commit(producer, topics, payload),
                    args.commits,
                    args.gap_ms / 1000,
                    broker_pid,
                )
                for _ in range(args.rounds)
            ]
        finally:
            undo()
    finally:
        await producer.close()
    report: dict[str, Any] = {
        "transactions_version": args.transactions_version,
        "warmup_commits": args.warmup,
        "commits_per_round": args.commits,
        "rounds": args.rounds,
        "gap_ms": args.gap_ms,
        "record_bytes": args.record_bytes,
    }
    for key in rounds[0]:
        report[f"{key}_median"] = round(statistics.median(r[key] for r in rounds), 2)
    report["requests_per_commit"] = {
        name: round(len(values) / (args.commits * args.rounds), 2) for name, values in times.items()
    }
    report["request_ms_median"] = {
        name: round(statistics.median(values) * 1000, 2) for name, values in times.items()
    }
    return report


def table(report: dict[str, Any]) -> str:
    rows = [
        ("commit wall time (ms)", report["wall_ms_median"]),
        ("client CPU per commit (ms)", report["client_cpu_ms_median"]),
        ("broker CPU per commit (ms)", report.get("broker_cpu_ms_median", "n/a")),
    ]
    for name, count in report["requests_per_commit"].items():
        rows.append(
            (f"  {name} per commit / median ms", f"{count} / {report['request_ms_median'][name]}")
        )
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--commits", type=int, default=200, help="commits per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="commits before measuring (default 50, or 3000 when the run starts its own broker: "
        "a fresh broker is still compiling its hot paths)",
    )
    parser.add_argument(
        "--gap-ms", type=float, default=20.0, help="pause between commits (0: back to back)"
    )
    parser.add_argument("--record-bytes", type=int, default=500)
    parser.add_argument(
        "--transactions-version",
        type=int,
        choices=(1, 2),
        default=1,
        help="1: aiokafka's producer; 2: the service's producer of KIP-890 transactions",
    )
    parser.add_argument("--broker-pid", type=int, default=None, help="for CPU accounting")
    parser.add_argument("--out", default=str(REPO / "bench-results" / "txn_cost.json"))
    args = parser.parse_args()
    with broker({}) as (bootstrap, broker_pid):
        if args.warmup is None:
            args.warmup = 50 if broker_pid is None else 3000
        report = asyncio.run(bench(args, bootstrap, broker_pid or args.broker_pid))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    print()
    print(table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
