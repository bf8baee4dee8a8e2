"""`cairn topics create` lays out the six topics; `cairn serve` refuses layouts it cannot run
(missing topics it waits for: test_robust_start.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from tests.support.runtime_harness import REPO, Cluster, create_topics_raw

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]


def _run(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service", *args],
        cwd=REPO,
        env=cluster.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_topics_create_makes_six_topics_with_compacted_sessions(
    kafka_bootstrap: str, tmp_path
) -> None:
    cluster = Cluster(kafka_bootstrap, tmp_path, partitions=3)
    first = _run(cluster, "topics", "create")
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("created") == 6
    again = _run(cluster, "topics", "create")
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("exists") == 6
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        topics = cluster.topics
        names = [
            topics.commands,
            topics.control,
            topics.sessions,
            topics.results,
            topics.events,
            topics.dlq,
        ]
        described = {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(names)}
        assert described == dict.fromkeys(names, 3)
        [response] = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topics.sessions)]
        )
        configs = {entry[0]: entry[1] for entry in response.resources[0][4]}
        assert configs["cleanup.policy"] == "compact"
    finally:
        await admin.close()


async def test_topics_create_completes_a_layout_an_earlier_run_left_half_done(
    kafka_bootstrap: str, tmp_path
) -> None:
    # A topics Job interrupted after some topics were made: its retry makes the rest, keeps
    # what exists, and exits 0.
    cluster = Cluster(kafka_bootstrap, tmp_path, partitions=2)
    topics = cluster.topics
    await create_topics_raw(kafka_bootstrap, {topics.commands: 2, topics.results: 2})
    result = _run(cluster, "topics", "create")
    assert result.returncode == 0, result.stderr
    reported = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    existed = {topics.commands, topics.results}
    names = [topics.commands, topics.control, topics.sessions]
    names += [topics.results, topics.events, topics.dlq]
    assert reported == {n: "exists" if n in existed else "created" for n in names}
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        described = {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(names)}
    finally:
        await admin.close()
    assert described == dict.fromkeys(names, 2)


async def _counts(bootstrap: str, names: list[str]) -> dict[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(names)
    finally:
        await admin.close()
    return {t["topic"]: len(t["partitions"]) for t in described if t["error_code"] == 0}


async def test_topics_create_keeps_the_layout_one_the_service_runs_on(
    kafka_bootstrap: str, tmp_path
) -> None:
    # The co-partitioned topics that exist set the count of those made beside them, and the
    # report says it is not the one asked for.
    cluster = Cluster(kafka_bootstrap, tmp_path, partitions=2)
    topics = cluster.topics
    await create_topics_raw(kafka_bootstrap, {topics.commands: 3})
    result = _run(cluster, "topics", "create")
    assert result.returncode == 0, result.stderr
    reported = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert reported == {
        topics.commands: "exists, 3 partitions (not 2)",
        topics.control: "created, 3 partitions (not 2)",
        topics.sessions: "created, 3 partitions (not 2)",
        topics.results: "created",
        topics.events: "created",
        topics.dlq: "created",
    }
    # Co-partitioned topics that already disagree: refused, and nothing is made.
    (tmp_path / "again").mkdir()
    cluster = Cluster(kafka_bootstrap, tmp_path / "again", partitions=2)
    topics = cluster.topics
    await create_topics_raw(kafka_bootstrap, {topics.commands: 2, topics.control: 3})
    result = _run(cluster, "topics", "create")
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert "must have equal partition counts" in line and "nothing created" in line
    names = [topics.sessions, topics.results, topics.events, topics.dlq]
    assert await _counts(kafka_bootstrap, names) == {}


async def test_serve_refuses_co_partitioned_topics_that_disagree(
    kafka_bootstrap: str, tmp_path
) -> None:
    cluster = Cluster(kafka_bootstrap, tmp_path, partitions=2)
    topics = cluster.topics
    await create_topics_raw(
        kafka_bootstrap, {topics.commands: 2, topics.control: 2, topics.sessions: 3}
    )
    await create_topics_raw(kafka_bootstrap, {topics.results: 2, topics.events: 2, topics.dlq: 2})
    result = _run(cluster, "serve")
    assert result.returncode == 1
    assert "co-partitioned topics must have equal partition counts" in result.stderr
    assert f"{topics.sessions}=3" in result.stderr
