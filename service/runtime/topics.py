"""Creation and verification of the six topics the service reads and writes.

Guarantees that the service never starts against a missing topic or against co-partitioned
topics (commands, control, sessions) whose partition counts disagree.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from aiokafka.admin import NewTopic

from service.runtime.clients import admin
from service.settings import KafkaSettings, TopicSettings

logger = logging.getLogger(__name__)

_TOPIC_ALREADY_EXISTS = 36
_UNKNOWN_TOPIC = 3


class TopicLayoutError(RuntimeError):
    """The broker's topics do not fit the service: a clear, operator-facing message."""


class MissingTopicsError(TopicLayoutError):
    """Some of the six topics do not exist (yet): ``cairn topics create`` makes them."""


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    configs: dict[str, str]


def topic_specs(topics: TopicSettings) -> list[TopicSpec]:
    """The six topics with their partition counts and configs."""
    outputs = topics.output_partitions or topics.partitions
    return [
        TopicSpec(topics.commands, topics.partitions, {}),
        TopicSpec(topics.control, topics.partitions, {}),
        TopicSpec(
            topics.sessions,
            topics.partitions,
            {
                "cleanup.policy": "compact",
                "min.compaction.lag.ms": "0",
                "segment.ms": "3600000",
                "max.message.bytes": str(4 * 1024 * 1024),
            },
        ),
        TopicSpec(topics.results, outputs, {}),
        TopicSpec(topics.events, outputs, {}),
        TopicSpec(topics.dlq, outputs, {}),
    ]


async def create_topics(kafka: KafkaSettings, topics: TopicSettings) -> dict[str, str]:
    """Create the missing topics; returns what became of each topic (``created`` or
    ``exists``, with its partition count when it is not the one asked for).

    The layout stays one the service runs on, or nothing is created: missing co-partitioned
    topics (commands, control, sessions) take the count of those that exist, and co-partitioned
    topics that already disagree are refused before any topic is made.
    """
    specs = topic_specs(topics)
    counts = await partition_counts(kafka, [spec.name for spec in specs])
    specs = [_fitted(spec, topics, counts) for spec in specs]
    client = admin(kafka)
    try:
        await client.start()
        missing = [spec for spec in specs if counts[spec.name] is None]
        response = (
            await client.create_topics(
                [
                    NewTopic(
                        name=spec.name,
                        num_partitions=spec.partitions,
                        replication_factor=topics.replication_factor,
                        topic_configs=spec.configs,
                    )
                    for spec in missing
                ]
            )
            if missing
            else None
        )
        created: set[str] = set()
        for entry in response.topic_errors if response is not None else []:
            name, code = entry[0], entry[1]
            if code == 0:
                created.add(name)
            elif code != _TOPIC_ALREADY_EXISTS:
                message = entry[2] if len(entry) > 2 else ""
                made = f" (created before it: {', '.join(sorted(created))})" if created else ""
                raise TopicLayoutError(
                    f"creating topic {name!r} failed: code {code} {message}{made}"
                )
        logger.info("created=<%s> | topics ensured", sorted(created))
    finally:
        await client.close()
    await wait_for_leaders(kafka, [spec.name for spec in specs])
    await verify_topics(kafka, topics)
    final = await partition_counts(kafka, [spec.name for spec in specs])
    asked = {spec.name: spec.partitions for spec in topic_specs(topics)}
    reports = {}
    for spec in specs:
        report = "created" if spec.name in created else "exists"
        if final[spec.name] != asked[spec.name]:
            report += f", {final[spec.name]} partitions (not {asked[spec.name]})"
        reports[spec.name] = report
    return reports


def _fitted(spec: TopicSpec, topics: TopicSettings, counts: dict[str, int | None]) -> TopicSpec:
    """``spec`` with the partition count of the co-partitioned topics that exist, if it is one
    of them; refuses co-partitioned topics that exist with different counts."""
    if spec.name not in topics.co_partitioned:
        return spec
    existing = {name: counts[name] for name in topics.co_partitioned if counts[name] is not None}
    if len(set(existing.values())) > 1:
        layout = ", ".join(f"{name}={count}" for name, count in existing.items())
        raise TopicLayoutError(
            f"co-partitioned topics must have equal partition counts, found {layout}; "
            "nothing created"
        )
    if not existing:
        return spec
    [count] = set(existing.values())
    assert count is not None
    return TopicSpec(spec.name, count, spec.configs)


async def wait_for_leaders(kafka: KafkaSettings, names: list[str], timeout_s: float = 30.0) -> None:
    """Return once every partition of the named topics has a leader (new topics need a moment)."""
    client = admin(kafka)
    try:
        await client.start()
        deadline = time.monotonic() + timeout_s
        while True:
            described = await client.describe_topics(names)
            if all(
                entry["error_code"] == 0
                and all(p["error_code"] == 0 and p["leader"] >= 0 for p in entry["partitions"])
                for entry in described
            ):
                return
            if time.monotonic() > deadline:
                raise TopicLayoutError(f"topics {names} have partitions without a leader")
            await asyncio.sleep(0.05)
    finally:
        await client.close()


async def partition_counts(kafka: KafkaSettings, names: list[str]) -> dict[str, int | None]:
    """Partition count of each named topic; ``None`` when the topic does not exist."""
    client = admin(kafka)
    try:
        await client.start()
        described = await client.describe_topics(names)
    finally:
        await client.close()
    counts: dict[str, int | None] = dict.fromkeys(names)
    for entry in described:
        if entry["error_code"] == 0:
            counts[entry["topic"]] = len(entry["partitions"])
        elif entry["error_code"] != _UNKNOWN_TOPIC:
            raise TopicLayoutError(
                f"describing topic {entry['topic']!r} failed: code {entry['error_code']}"
            )
    return counts


async def verify_topics(kafka: KafkaSettings, topics: TopicSettings) -> int:
    """Refuse a layout the runtime cannot run on; returns the co-partitioned partition count."""
    names = [spec.name for spec in topic_specs(topics)]
    counts = await partition_counts(kafka, names)
    missing = [name for name, count in counts.items() if count is None]
    if missing:
        raise MissingTopicsError(
            f"missing topics: {', '.join(missing)}; create them with `cairn topics create`"
        )
    co = {name: counts[name] for name in topics.co_partitioned}
    if len(set(co.values())) != 1:
        layout = ", ".join(f"{name}={count}" for name, count in co.items())
        raise TopicLayoutError(
            f"co-partitioned topics must have equal partition counts, found {layout}"
        )
    count = co[topics.commands]
    assert count is not None
    spread = {
        name: counts[name] for name in (topics.results, topics.events) if counts[name] != count
    }
    if spread:
        logger.warning(
            "partitions=<%d>, outputs=<%s> | results and events are partitioned unlike the "
            "commands: a transaction a broker restart leaves open on them is not repaired "
            '(docs/runtime.md, "Across broker restarts")',
            count,
            ", ".join(f"{name}={n}" for name, n in spread.items()),
        )
    return count
