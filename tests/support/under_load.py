"""A steady load of multi-step sessions through faults, and what a client must see after it.

Shared by the fault tests that restart the broker or kill, stop and drain instances while
sessions run: a client that reads and sends through broker restarts, one closed loop per
session, and :func:`check_whole`, the checks every such run ends with (one result per command,
events neither doubled nor missing, tools run again only by a new owner, no transaction left
open).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from tests.support.kafka_logs import explain
from tests.support.own_broker import OwnBroker
from tests.support.runtime_harness import (
    Client,
    Cluster,
    ServiceProcess,
    invoke,
    wait_for,
)
from tests.support.txn_probe import stable_and_high

ANSWER_S = 150.0
"""Bound on one command's answer; a broker restart and a re-created owner fit many times over."""
SETTLE_S = 45.0
"""Bound on open transactions ending once the instances stopped: the coordinator aborts one it
knows of after the transaction timeout (20 s in the harness); one it does not know never ends."""


class RestartTolerantClient(Client):
    """The harness client, reading on through broker restarts, sending only to a serving
    broker and again when a send failed (the service answers a command id only once)."""

    def __init__(self, cluster: Cluster, broker_up: asyncio.Event) -> None:
        super().__init__(cluster)
        self.broker_up = broker_up
        self._sender: AIOKafkaProducer | None = None

    async def __aenter__(self) -> RestartTolerantClient:
        await super().__aenter__()
        self._sender = AIOKafkaProducer(
            bootstrap_servers=self.cluster.bootstrap, acks="all", linger_ms=0
        )
        await self._sender.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._sender is not None:
            await self._sender.stop()
        await super().__aexit__(*exc)

    async def _read(self, consumer: AIOKafkaConsumer, sink: list[dict[str, Any]]) -> None:
        while True:
            try:
                await super()._read(consumer, sink)
            except KafkaError:
                await asyncio.sleep(0.1)

    async def submit(self, command: dict[str, Any]) -> None:
        assert self._sender is not None
        while True:
            await self.broker_up.wait()
            try:
                delivery = await self._sender.send(
                    self.cluster.topics.commands,
                    key=command["session_id"].encode(),
                    value=orjson.dumps(command),
                )
                await delivery
                return
            except KafkaError:
                await asyncio.sleep(0.1)


class Load:
    """One closed loop per session: the next turn is sent once the last one is answered."""

    def __init__(self, client: RestartTolerantClient, sessions: dict[str, str]) -> None:
        self.client = client
        self.sessions = sessions
        """Agent of each session."""
        self.sent: list[dict[str, Any]] = []
        self.stopping = asyncio.Event()

    async def every_session_answered_again(self, what: str) -> None:
        before = Counter(r["session_id"] for r in self.client.results)

        def advanced() -> bool:
            now = Counter(r["session_id"] for r in self.client.results)
            return all(now[s] > before[s] for s in self.sessions)

        await wait_for(advanced, ANSWER_S, f"every session answered again {what}")

    async def drive(self, session: str, agent: str) -> None:
        turn = 0
        while not self.stopping.is_set():
            turn += 1
            command = invoke(session, f"turn {turn}", agent=agent)
            self.sent.append(command)
            await self.client.submit(command)
            await self.client.result(command["command_id"], timeout=ANSWER_S)


async def restart(broker: OwnBroker, broker_up: asyncio.Event, *, kill: bool) -> None:
    broker_up.clear()
    await asyncio.to_thread(broker.kill if kill else broker.stop)
    # On this thread: the broker must not die with a worker thread (see OwnBroker.start).
    broker.start()
    broker_up.set()


async def open_transactions(
    bootstrap: str, partitions: list[TopicPartition], timeout: float
) -> dict[TopicPartition, tuple[int, int]]:
    """Partitions whose last stable offset is still below their high watermark at the end."""
    deadline = time.monotonic() + timeout
    while True:
        found = await stable_and_high(bootstrap, partitions)
        gaps = {tp: pair for tp, pair in found.items() if pair[0] < pair[1]}
        if not gaps or time.monotonic() > deadline:
            return gaps
        await asyncio.sleep(0.2)


def diagnosis(broker: OwnBroker, group: str, partitions: Iterable[TopicPartition]) -> str:
    """What the broker's files say of these partitions, and every transaction marker the
    broker skipped (its coordinator took a partition without a leader for a deleted one)."""
    lines = ["broker runs that skipped transaction markers:"]
    for number, run in enumerate(broker.runs()):
        skipped = [line for line in run.splitlines() if "likely deleted" in line]
        lines += [f"  run {number}: {line[:300]}" for line in skipped]
    for tp in sorted(partitions):
        lines.append(explain(broker.log_dir, tp.topic, tp.partition, f"{group}-{tp.partition}"))
    return "\n".join(lines)


def owner_starts(procs: list[ServiceProcess]) -> Counter[int]:
    """How often an owner of each partition finished its restore, over every instance."""
    starts: Counter[int] = Counter()
    for proc in procs:
        for match in re.finditer(r"partition=<(\d+)> \| partition ready", proc.text()):
            starts[int(match.group(1))] += 1
    return starts


def event_identity(event: dict[str, Any]) -> tuple[Any, ...]:
    """What one step's event stands for, whatever seq it was published under."""
    return (
        event["session_id"],
        event["command_id"],
        event["type"],
        event.get("tool_use_id"),
        event.get("position"),
        event.get("cycle_index"),
        orjson.dumps(event.get("message"), option=orjson.OPT_SORT_KEYS),
    )


async def check_whole(
    broker: OwnBroker,
    cluster: Cluster,
    client: Client,
    load: Load,
    procs: list[ServiceProcess],
    context: str = "",
) -> None:
    """Every check of a run under faults, once every instance stopped and the client caught
    up: one result per command, in turn order per session, no dead letter; on the events topic
    no (session, seq) twice, no gap and no step twice; a tool run (or shown started) again only
    by a new owner of its partition; no transaction left open. ``context`` is added to every
    failure (a seed, the faults made)."""
    topics = cluster.topics
    partition_of = {e["session_id"]: e["_partition"] for e in client.events}

    def why(*partitions: TopicPartition) -> str:
        return f"{context}\n" + diagnosis(broker, cluster.group, partitions)

    def all_of(*names: str) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t in names for p in range(cluster.partitions)]

    counts = Counter(r["command_id"] for r in client.results)
    assert counts == Counter({c["command_id"]: 1 for c in load.sent}), why(*all_of(topics.results))
    for session in load.sessions:
        texts = [r["message"]["content"][0]["text"] for r in client.session_results(session)]
        assert texts == [f"done turn {k}" for k in range(1, len(texts) + 1)], (context, texts)
    assert not client.dead_letters, (context, client.dead_letters)

    seqs: defaultdict[str, list[int]] = defaultdict(list)
    for event in client.events:
        seqs[event["session_id"]].append(event["seq"])
    doubled = {
        s: sorted(n for n, k in Counter(published).items() if k > 1)
        for s, published in seqs.items()
        if len(set(published)) < len(published)
    }
    assert not doubled, f"event seqs published twice: {doubled}\n" + why(
        *{
            TopicPartition(t, partition_of[s])
            for s in doubled
            for t in (topics.events, topics.sessions)
        }
    )
    for session, published in seqs.items():
        assert sorted(published) == list(range(1, len(published) + 1)), (
            context,
            session,
            published,
        )
    # A tool's start is published as it starts, so a batch run again by a later owner shows
    # its start again (under a new seq); every other step is published once.
    steps = Counter(
        event_identity(e) for e in client.events if e["type"] not in ("text_delta", "tool_started")
    )
    assert not [step for step, k in steps.items() if k > 1], why(
        *all_of(topics.events, topics.sessions)
    )

    starts = owner_starts(procs)
    runs = Counter(c["idempotency_key"] for c in cluster.tool_calls())
    started = Counter(
        f"{e['session_id']}:{e['tool_use_id']}"
        for e in client.events
        if e["type"] == "tool_started"
    )
    finished = {
        f"{e['session_id']}:{e['tool_use_id']}"
        for e in client.events
        if e["type"] == "tool_finished"
    }
    assert finished <= set(runs), context
    for key in runs.keys() | started.keys():
        owners = starts[partition_of[key.split(":", 1)[0]]]
        # An owner runs a batch once; only a later owner of the partition runs it again.
        assert runs[key] <= owners, (context, key, runs[key], starts)
        assert started[key] <= owners, (context, key, started[key], starts)

    written = all_of(topics.sessions, topics.results, topics.events)
    hanging = await open_transactions(broker.bootstrap, written, SETTLE_S)
    assert not hanging, (
        f"transactions left open (stable offset, high watermark): {hanging}\n" + why(*hanging)
    )
