"""A steady load of multi-step sessions through faults, and what a client must see after it.

Shared by the fault tests that restart the broker or kill, stop and drain instances while
sessions run: a client that reads and sends through broker restarts, one closed loop per
session, hostile records sent now and then beside them (:class:`Hostile`), and
:func:`check_whole`, the checks every such run ends with (one result per command, one answer per
hostile record, events neither doubled nor missing, tools run again only by a new owner, no
transaction left open).
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import RecordMetadata

from tests.support.agents import registry
from tests.support.hostile import REFUSED, Sent, answers_of, generate, ids_of, refused, source_of
from tests.support.kafka_logs import explain
from tests.support.own_broker import OwnBroker
from tests.support.runtime_harness import (
    Client,
    Cluster,
    ServiceProcess,
    cancel,
    checkpoint_resume,
    invoke,
    resume,
    wait_for,
)
from tests.support.txn_probe import stable_and_high

ANSWER_S = 150.0
"""Bound on one command's answer; a broker restart and a re-created owner fit many times over."""
SETTLE_S = 45.0
"""Bound on open transactions ending once the instances stopped: the coordinator aborts one it
knows of after the transaction timeout (20 s in the harness); one it does not know never ends."""
INTERRUPTING = {"approval"}
"""The agents whose every tool call asks a human first (an interrupt per tool cycle)."""


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

    async def submit(self, command: dict[str, Any], topic: str | None = None) -> None:
        """Send ``command`` (to the commands topic unless ``topic`` is given)."""
        assert self._sender is not None
        while True:
            await self.broker_up.wait()
            try:
                delivery = await self._sender.send(
                    topic or self.cluster.topics.commands,
                    key=command["session_id"].encode(),
                    value=orjson.dumps(command),
                )
                await delivery
                return
            except KafkaError:
                await asyncio.sleep(0.1)

    async def send_once(self, topic: str, key: bytes | None, value: bytes) -> RecordMetadata | None:
        """Send one record to a serving broker; ``None`` when the send failed (the broker may
        hold the record or not)."""
        assert self._sender is not None
        await self.broker_up.wait()
        try:
            return await (await self._sender.send(topic, key=key, value=value))
        except KafkaError:
            return None


class Load:
    """One closed loop per session: the next turn is sent once the last one is answered. In
    the ``cancelled`` sessions each turn is followed by a cancel of it (targeted or not, its
    tools let finish or not) at a random moment, and the next turn waits for both answers. The
    turns of the ``checkpointed`` sessions pause at every checkpoint, and those of an
    :data:`INTERRUPTING` agent at every interrupt; each pause is resumed (from the checkpoint the
    result carries, or with an answer to each interrupt) once its result is read."""

    def __init__(
        self,
        client: RestartTolerantClient,
        sessions: dict[str, str],
        cancelled: Iterable[str] = (),
        rng: random.Random | None = None,
        checkpointed: Iterable[str] = (),
        context: Callable[[], str] = str,
    ) -> None:
        self.client = client
        self.sessions = sessions
        """Agent of each session."""
        self.cancelled = set(cancelled)
        self.checkpointed = set(checkpointed)
        self.rng = rng or random.Random()
        self.sent: list[dict[str, Any]] = []
        self.cancels: list[tuple[dict[str, Any], dict[str, Any]]] = []
        """Each turn of a ``cancelled`` session with the cancel sent after it."""
        self.stopping = asyncio.Event()
        self.context = context
        """What a failure of a session's loop adds to its message (a seed, the faults made)."""

    @property
    def plain(self) -> list[str]:
        """The sessions whose turns run to their end uncancelled and without a pause."""
        return sorted(
            session
            for session, agent in self.sessions.items()
            if session not in self.cancelled | self.checkpointed and agent not in INTERRUPTING
        )

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
            checkpointing = True if session in self.checkpointed else None
            command = invoke(session, f"turn {turn}", agent=agent, checkpointing=checkpointing)
            self.sent.append(command)
            await self.client.submit(command)
            if session in self.cancelled:
                # The cancel's moment: before, during or after the turn's model and tool calls.
                await asyncio.sleep(self.rng.uniform(0.0, 1.0))
                fields: dict[str, Any] = {"after_current_tools": self.rng.random() < 0.5}
                if self.rng.random() < 0.5:
                    fields["target_command_id"] = command["command_id"]
                stop = cancel(session, **fields)
                self.sent.append(stop)
                self.cancels.append((command, stop))
                await self.client.submit(stop, self.client.cluster.topics.control)
                await self._answer(stop)
            result = await self._answer(command)
            while result["stop_reason"] in ("checkpoint", "interrupt"):
                if result["stop_reason"] == "checkpoint":
                    command = checkpoint_resume(session, result["checkpoint"])
                else:
                    answers = [
                        {"interruptResponse": {"interruptId": asked["id"], "response": "yes"}}
                        for asked in result["interrupts"]
                    ]
                    command = resume(session, answers)
                self.sent.append(command)
                await self.client.submit(command)
                result = await self._answer(command)

    async def _answer(self, command: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self.client.result(command["command_id"], timeout=ANSWER_S)
        except AssertionError as exc:
            raise AssertionError(
                f"{self.context()}: session {command['session_id']}, {command['type']}: {exc}"
            ) from None

    def turn_shape(self, session: str) -> list[tuple[Any, ...]]:
        """How each turn of ``session`` must end, result by result: where it pauses, then
        ``end_turn``."""
        agent = self.sessions[session]
        cycles = getattr(registry()[agent].model, "cycles", 0)
        if session in self.checkpointed:
            pauses = [
                ("checkpoint", position, cycle)
                for cycle in range(cycles)
                for position in ("after_model", "after_tools")
            ]
        elif agent in INTERRUPTING:
            pauses = [("interrupt", 1)] * cycles
        else:
            pauses = []
        return [*pauses, ("end_turn",)]

    def check_turns(self, client: Client, load_ids: set[str], context: str) -> None:
        """Each session not cancelled answered its turns in order, each turn paused exactly
        where its shape says and nowhere else, and ended with the text of its own turn."""
        for session in self.sessions.keys() - self.cancelled:
            answered = [r for r in client.session_results(session) if r["command_id"] in load_ids]
            shape = self.turn_shape(session)
            seen = [_shape_of(r) for r in answered]
            turns = len(seen) // len(shape)
            assert seen == shape * turns, (context, session, shape, seen)
            texts = [
                r["message"]["content"][0]["text"]
                for r in answered
                if r["stop_reason"] == "end_turn"
            ]
            assert texts == [f"done turn {k}" for k in range(1, turns + 1)], (context, texts)

    def check_cancels(self, client: Client, context: str) -> None:
        """Each cancelled turn ended ``end_turn`` or ``cancelled``; a turn its cancel says it
        stopped or skipped ended ``cancelled``, and its result came first; every cancel's own
        result is ``cancelled``; a turn that ended is never claimed by its cancel."""
        by_id = {r["command_id"]: r for r in client.results}
        for command, stop in self.cancels:
            ended, answer = by_id[command["command_id"]], by_id[stop["command_id"]]
            assert answer["stop_reason"] == "cancelled", (context, answer)
            assert ended["stop_reason"] in ("end_turn", "cancelled"), (context, ended)
            report = answer["cancel"]
            claimed = command["command_id"] in (report["stopped"], *report["skipped"])
            if claimed:
                assert ended["stop_reason"] == "cancelled", (context, stop, report, ended)
                assert (ended["_partition"], ended["_offset"]) < (
                    answer["_partition"],
                    answer["_offset"],
                ), (context, "a cancel answered before what it covered", ended, answer)
        for session in self.cancelled:
            # A turn that ran to its end answers for every prompt of the session so far.
            turns = [
                int(r["message"]["content"][0]["text"].removeprefix("done turn "))
                for r in client.session_results(session)
                if r["stop_reason"] == "end_turn"
            ]
            assert turns == sorted(set(turns)), (context, session, turns)


def _shape_of(result: dict[str, Any]) -> tuple[Any, ...]:
    reason = result["stop_reason"]
    if reason == "checkpoint":
        return (reason, result["checkpoint"]["position"], result["checkpoint"]["cycle_index"])
    if reason == "interrupt":
        return (reason, len(result["interrupts"]))
    return (reason,)


class Hostile:
    """Hostile records (:mod:`tests.support.hostile`) sent one at a time, at random intervals,
    into the commands and control topics beside the load; one in four is instead a command of
    one of the load's sessions that it must refuse (which leaves the session as it was)."""

    def __init__(self, client: RestartTolerantClient, load: Load, count: int, seeded: int) -> None:
        self.client = client
        self.load = load
        self.records = generate(count, seeded)
        self.rng = random.Random(seeded)
        self.sent: list[Sent] = []
        """Records the broker took, where it put them."""
        self.unsure: list[tuple[str, str] | None] = []
        """The ids of records whose send failed: the broker may hold them or not."""
        self.contents: set[tuple[str, bytes | None, bytes]] = set()
        """Every record sent (topic, key, value): a send retried by the producer across a
        broker restart may have written one twice, at two offsets."""

    async def drive(self, stopping: asyncio.Event) -> None:
        topics = self.client.cluster.topics
        names = {"commands": topics.commands, "control": topics.control}
        # Not of the cancelled sessions (a cancel covers what is queued, and would answer it),
        # nor of those that pause (a pause is what the refusals lack).
        sessions = self.load.plain
        for name, key, value in self.records:
            # The pace of the records, not a wait on a condition.
            await asyncio.sleep(self.rng.uniform(0.0, 0.3))
            if stopping.is_set():
                return
            code = None
            if self.rng.random() < 0.25:
                code = self.rng.choice(sorted(REFUSED))
                name = "commands"
                key, value = refused(self.rng.choice(sessions), code)
            self.contents.add((names[name], key, value))
            meta = await self.client.send_once(names[name], key, value)
            if meta is None:
                self.unsure.append(ids_of(value))
            else:
                sent = Sent(names[name], meta.partition, meta.offset, ids_of(value), code)
                self.sent.append(sent)

    def check(self, client: Client, load_ids: set[str], context: str) -> None:
        """One answer for every record the broker took, at most one for the ids of those it
        may hold, a dead letter of no other offset than a copy of a record sent, and nothing
        else besides the load's results."""
        results = [r for r in client.results if r["command_id"] not in load_ids]
        counts = answers_of(self.sent, results, client.dead_letters)
        wrong = [(item, count) for item, count in counts if count != 1]
        assert not wrong, (
            context,
            f"{len(wrong)} of {len(counts)} hostile records not answered once "
            f"({sum(item.ids is None for item, _ in wrong)} without ids): {wrong[:10]}",
        )
        by_ids = {(r["session_id"], r["command_id"]): r for r in results}
        codes = [
            (item.code, by_ids[item.ids].get("error"))
            for item in self.sent
            if item.code is not None and item.ids is not None
        ]
        assert all(error is not None and error["code"] == code for code, error in codes), (
            context,
            [pair for pair in codes if pair[1] is None or pair[1]["code"] != pair[0]],
        )
        taken = {(item.topic, item.partition, item.offset) for item in self.sent}
        strays = [
            d
            for d in client.dead_letters
            if source_of(d) not in taken
            and (source_of(d)[0], d["key"], d["value"]) not in self.contents
        ]
        assert not strays, (context, "dead letters of records never sent", strays[:10])
        known = {item.ids for item in self.sent} | set(self.unsure)
        answered = Counter((r["session_id"], r["command_id"]) for r in results)
        assert all(pair in known for pair in answered), (context, answered)
        assert all(answered[pair] <= 1 for pair in self.unsure if pair is not None), (
            context,
            answered,
        )


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
    hostile: Hostile | None = None,
) -> None:
    """Every check of a run under faults, once every instance stopped and the client caught
    up: one result per command, in turn order per session, each turn pausing where it must
    (:meth:`Load.check_turns`); one answer per hostile record and no other dead letter; on the
    events topic no (session, seq) twice, no gap and no step twice; a tool run (or shown
    started) again only by a new owner of its partition; no transaction left open. ``context``
    is added to every failure (a seed, the faults made)."""
    topics = cluster.topics
    partition_of = {e["session_id"]: e["_partition"] for e in client.events}

    def why(*partitions: TopicPartition) -> str:
        return f"{context}\n" + diagnosis(broker, cluster.group, partitions)

    def all_of(*names: str) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t in names for p in range(cluster.partitions)]

    load_ids = {c["command_id"] for c in load.sent}
    counts = Counter(r["command_id"] for r in client.results if r["command_id"] in load_ids)
    assert counts == Counter(dict.fromkeys(load_ids, 1)), why(*all_of(topics.results))
    load.check_cancels(client, context)
    load.check_turns(client, load_ids, context)
    if hostile is None:
        assert len(counts) == len(client.results), (context, client.results)
        assert not client.dead_letters, (context, client.dead_letters)
    else:
        hostile.check(client, load_ids, context)

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
    # The load's tools log each run (a hostile record's may not).
    runs = Counter((c["session_id"], c["tool_use_id"]) for c in cluster.tool_calls())
    own = [e for e in client.events if e["session_id"] in load.sessions]
    started = Counter(
        (e["session_id"], e["tool_use_id"]) for e in own if e["type"] == "tool_started"
    )
    finished = {(e["session_id"], e["tool_use_id"]) for e in own if e["type"] == "tool_finished"}
    assert finished <= set(runs), context
    for key in runs.keys() | started.keys():
        # An owner runs a batch once; only a later owner of the partition runs it again. A
        # tool that asks a human runs once more, answered.
        owners = starts[partition_of[key[0]]] + (load.sessions.get(key[0]) in INTERRUPTING)
        assert runs[key] <= owners, (context, key, runs[key], starts)
        assert started[key] <= owners, (context, key, started[key], starts)

    written = all_of(topics.sessions, topics.results, topics.events)
    hanging = await open_transactions(broker.bootstrap, written, SETTLE_S)
    assert not hanging, (
        f"transactions left open (stable offset, high watermark): {hanging}\n" + why(*hanging)
    )
