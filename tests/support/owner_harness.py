"""One partition owner on the in-memory Kafka, as the runtime makes it: the real consumer loop,
transaction stream, committer, command path and engine around it, and the helpers its tests
share (commands, what is answered, what is committed)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition

from service.agent.definition import AgentDefinition
from service.agent.provider import ModelChunk, ModelRequest
from service.runtime import partition_owner, stable_starts, transactions
from service.runtime.consumer_loop import ConsumerLoop
from service.runtime.faults import FaultPoints
from service.runtime.owner_context import InFlight, OwnerContext
from service.runtime.partition_owner import OwnerExit, PartitionOwner
from service.runtime.streams import InstanceStream, PartitionStreams
from service.runtime.txn_stream import TransactionStream
from service.settings import Settings
from tests.support.agents import CycleModel, tick
from tests.support.memory_kafka import MemoryInput, MemoryKafka, MemorySessions

SETTINGS = Settings()
TOPICS = SETTINGS.topics
GROUP = SETTINGS.group.group_id
OURS, OLD = f"{GROUP}-a", f"{GROUP}-old"
PARTITION_0 = f"{GROUP}-0"
COMMANDS_0 = TopicPartition(TOPICS.commands, 0)
CONTROL_0 = TopicPartition(TOPICS.control, 0)


class GatedModel(CycleModel):
    """Answers once ``gate`` is set: every call (``cycles`` 0), or every call after the first
    tool cycle (``cycles`` 1, which calls ``tick`` once a turn: its turns pass a boundary, and
    commit an in-flight marker, before they wait)."""

    def __init__(self, cycles: int = 0) -> None:
        super().__init__(cycles, "tick")
        self.gate = asyncio.Event()
        self.waiting = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        if self.cycles == 0 or _has_tool_result(request.messages[-1]):
            self.waiting += 1
            await self.gate.wait()
        async for chunk in super().stream(request):
            yield chunk


def _has_tool_result(message: dict[str, Any]) -> bool:
    return any("toolResult" in block for block in message.get("content") or ())


def shorten_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The waits for stable offsets and open transactions, shortened (their length is a broker
    matter; what is tested is what happens after them)."""
    monkeypatch.setattr(partition_owner, "SETTLE_S", 0.02)
    monkeypatch.setattr(stable_starts, "_POLL_S", 0.002)
    monkeypatch.setattr(transactions, "_POLL_S", 0.002)


class Instance:
    """One instance on the in-memory Kafka: its input, its stream, its loop, and owners made on
    demand (as the runtime makes them) for partition 0. With ``partition_streams`` each owner
    commits through a stream of its own partition (``transaction_streams=partition``, its
    transactional id :data:`PARTITION_0`) instead of the instance's."""

    def __init__(self, kafka: MemoryKafka, root: Path, *, partition_streams: bool = False) -> None:
        self.kafka = kafka
        self.gated = GatedModel()
        self.gated_after_tools = GatedModel(1)
        runtime = SETTINGS.runtime.model_copy(
            update={"transaction_timeout_ms": 3_000, "commit_timeout_s": 2.0}
        )
        self.settings = SETTINGS.model_copy(update={"runtime": runtime})
        self.input = MemoryInput(kafka)
        self.input.assign([COMMANDS_0, CONTROL_0])
        self.sessions = MemorySessions(kafka, TOPICS.sessions)
        self.stream = TransactionStream(
            transport=kafka,
            transactional_id=OURS,
            group_id=GROUP,
            sessions_topic=TOPICS.sessions,
            membership=kafka.membership,
            timeout_s=2.0,
            faults=FaultPoints(self.settings.faults),
        )
        self.inflight = InFlight(1_000)
        self.ctx = OwnerContext(
            settings=self.settings,
            agents={
                "simple": AgentDefinition(name="simple", model=CycleModel(0)),
                "gated": AgentDefinition(name="gated", model=self.gated),
                "gated-after-tools": AgentDefinition(
                    name="gated-after-tools", model=self.gated_after_tools, tools=[tick]
                ),
            },
            inputs=self.input,
            streams=PartitionStreams(self._partition_stream)
            if partition_streams
            else InstanceStream(self.stream),
            inflight=self.inflight,
            faults=FaultPoints(self.settings.faults),
            on_restored=lambda partition: None,
            sessions=self.sessions,
            store_root=root,
        )
        self.owners: dict[int, PartitionOwner] = {}
        self.loop = ConsumerLoop(self.input, self.owners, self.inflight, max_records=50)
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Instance:
        await self.stream.start()
        self._tasks = [
            asyncio.create_task(self.stream.run()),
            asyncio.create_task(self.loop.run()),
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.loop.stop()
        for task in self._tasks:
            if task is not self._tasks[1]:
                task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.stream.close()

    def _partition_stream(self, partition: int) -> TransactionStream:
        return TransactionStream(
            transport=self.kafka,
            transactional_id=f"{GROUP}-{partition}",
            group_id=GROUP,
            sessions_topic=TOPICS.sessions,
            membership=self.kafka.membership,
            timeout_s=2.0,
            faults=FaultPoints(self.settings.faults),
            shared=False,
        )

    def owner(self) -> tuple[PartitionOwner, asyncio.Task[OwnerExit]]:
        owner = self.owners[0] = PartitionOwner(0, self.ctx)
        return owner, asyncio.create_task(owner.run())

    async def stop(
        self, owner: PartitionOwner, task: asyncio.Task[OwnerExit], grace_s: float = 1.0
    ) -> OwnerExit:
        owner.request_stop(grace_s)
        async with asyncio.timeout(10):
            exit_ = await task
        self.owners.pop(0, None)
        assert self.inflight.count == 0, "what the owner took and did not finish is released"
        return exit_


def command(index: int, *, agent: str = "simple", sessions: int = 2) -> dict[str, Any]:
    return {
        "type": "invoke",
        "schema_version": 1,
        "command_id": f"c{index}",
        "session_id": f"s{index % sessions}",
        "agent": agent,
        "prompt": "hi",
    }


def put(kafka: MemoryKafka, *bodies: dict[str, Any]) -> None:
    for body in bodies:
        kafka.append(TOPICS.commands, 0, body["session_id"].encode(), orjson.dumps(body))


def answered(kafka: MemoryKafka) -> Counter[str]:
    """Visible results by command id."""
    return Counter(
        orjson.loads(value)["command_id"]
        for value in kafka.visible(TOPICS.results)
        if value is not None
    )


def committed(kafka: MemoryKafka, partition: TopicPartition = COMMANDS_0) -> int:
    return kafka.committed.get(partition, (-1, ""))[0]


async def until(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not condition():
                await asyncio.sleep(0.002)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def first(kafka: MemoryKafka, owner: str, call: str) -> int:
    return kafka.calls.index((owner, call))
