"""A committed step whose marker a broker restart dropped on the sessions topic only, taken over
by a new owner on the in-memory Kafka: its results and events are visible, so its session
records must be published again, and nothing of the step may run or show twice, whichever
call of the repair fails on the way."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import pytest
from aiokafka.errors import KafkaConnectionError

from service.runtime.partition_owner import OwnerExit
from tests.support.memory_kafka import MemoryKafka
from tests.support.owner_harness import (
    TOPICS,
    Instance,
    answered,
    command,
    committed,
    put,
    shorten_waits,
    until,
)

pytestmark = pytest.mark.timeout(60)

FAILURES = [
    *(
        pytest.param([(call, 0)], id=call)
        for call in (
            "sessions.read_open",
            "sessions.restore",
            "sessions.partition_for",
            "sessions.committed_tail",
        )
    ),
    pytest.param([("sessions.restore", 1)], id="restore-after-the-abort"),
    pytest.param([("commit", 0)], id="claim"),
    pytest.param([("commit", 0), ("sessions.committed_tail", 1)], id="claim-then-the-held-check"),
]
"""Where new owners fail, one after the other (a call and how many of it pass first): before
the open batch is ended (nothing changed, the next owner decides again), or after (the instance
holds the decision until an owner publishes it)."""


@pytest.fixture(autouse=True)
def short_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    shorten_waits(monkeypatch)


def event_seqs(kafka: MemoryKafka, session_id: str) -> list[int]:
    """The ``seq`` of every visible event of the session, in log order."""
    bodies = [orjson.loads(v) for v in kafka.visible(TOPICS.events) if v is not None]
    return [b["seq"] for b in bodies if b["session_id"] == session_id]


async def a_step_left_open(kafka: MemoryKafka, instance: Instance) -> None:
    """c0 then c2 of session s0 answered by an owner; c2's transaction commits everywhere but on
    the sessions topic, where its batch stays open. The owner stops (its last commit moves
    offsets only, so ends nothing there)."""
    owner, task = instance.owner()
    put(kafka, command(0))
    await until(lambda: committed(kafka) == 1, "c0")
    kafka.lose_markers_on(TOPICS.sessions, 0)
    put(kafka, command(2))
    await until(lambda: committed(kafka) == 2, "c2")
    assert await instance.stop(owner, task) is OwnerExit.STOPPED
    assert kafka.markers_lost_on is None, "the marker was not lost"
    assert kafka.open_entries() > 0


async def serve_again(
    kafka: MemoryKafka, instance: Instance, failures: list[tuple[str, int]]
) -> None:
    """New owners, one failing at each of ``failures`` (a call, the n-th from the first new
    owner's start), then one that serves c2 again and c4, both of s0."""
    for call, after in failures:
        kafka.fail(call, KafkaConnectionError(f"{call} failed"), after=after)
    for _ in failures:
        owner, task = instance.owner()
        assert await task is OwnerExit.FAILED
        instance.owners.pop(0)
    owner, task = instance.owner()
    await until(lambda: owner.restored, "the new owner's start")
    put(kafka, command(2), command(4))
    await until(lambda: committed(kafka) == 4, "c2 again and c4")
    assert await instance.stop(owner, task) is OwnerExit.STOPPED


@pytest.mark.parametrize("failures", [[], *FAILURES])
async def test_a_step_committed_but_on_sessions_is_kept_not_redone(
    tmp_path: Path, failures: list[tuple[str, int]]
) -> None:
    kafka = MemoryKafka()
    async with Instance(kafka, tmp_path) as instance:
        await a_step_left_open(kafka, instance)
        seqs = event_seqs(kafka, "s0")
        await serve_again(kafka, instance, failures)
    assert kafka.open_entries() == 0
    # c2 is applied in the state: sent again, it is a duplicate, not a second answer.
    assert answered(kafka) == Counter({"c0": 1, "c2": 1, "c4": 1})
    # c4's events follow c2's: no seq is used twice.
    after = event_seqs(kafka, "s0")
    assert after[: len(seqs)] == seqs
    assert len(after) > len(seqs)
    assert len(set(after)) == len(after), after
    assert min(after[len(seqs) :]) > max(seqs)
