"""Session state benchmark: what the head + history layout of the sessions changelog costs.

Prints, in one run, plain tables of:

1. step: the bytes and CPU of one step (an assistant message with a toolUse and its tool
   result appended, written by :class:`SessionWriter`) at 10 to 5,000 messages of history,
   beside the whole state in one record (:func:`encode_state`, what the old design wrote per
   step); median CPU (``time.process_time``) of many repetitions;
2. restore: MB/s of :meth:`SessionsReader.restore` into a :class:`SqliteTable` from a fresh
   compacted topic on a running broker, cold (empty folder) and warm (the table reopened: only
   the tail, here nothing, is read); skipped when nothing listens at ``--bootstrap``;
3. rss: a subprocess per session count fills a SQLite-backed store with sessions of ~20 KiB,
   reads every one once and reports its RSS (current and peak) and the SQLite file's size;
4. runtime (``--runtime``): committed steps/s of ``bench/runtime_bench.py`` (saturation), for a
   before/after comparison between two trees.

Messages are realistic: user and assistant alternate, ~400 bytes of compressible text each,
every third assistant message has a toolUse answered by the next user message's toolResult.
A benchmark, not a test: it reports, it does not assert targets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from aiokafka import AIOKafkaProducer
from aiokafka.admin import NewTopic

from service.agent.state import SessionState
from service.agent.types import Message
from service.runtime.clients import admin
from service.runtime.records import RECORD_MAX_BYTES
from service.runtime.restore import SessionsReader
from service.runtime.topics import topic_specs, wait_for_leaders
from service.sessions.cache import CACHE_MAX_BYTES, SessionCache
from service.sessions.codec import encode_state
from service.sessions.delivery import APPLIED_KEPT, Delivery
from service.sessions.store import SessionStore, event_seq_header
from service.sessions.table import MemoryTable, Row, SqliteTable
from service.sessions.writer import SessionWriter, StateWrite
from service.settings import KafkaSettings, TopicSettings

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")
MB = 1_000_000
MIB = 1024 * 1024
TEXT_BYTES = 400
SESSION_MESSAGES = 44
"""Messages of a ~20 KiB session (about 460 bytes of JSON each)."""
STEP_BUDGET_S = 0.5
MIN_REPS = 15
MAX_REPS = 3_000
WORDS = (  # words of a support conversation
    "the order shipment customer refund invoice was is will be has not yet delayed because of "
    "a missing address please check status tracking number warehouse carrier estimated date "
    "delivery and then we can offer discount on next purchase for inconvenience I looked up "
    "account history found two open tickets about same issue agent replied earlier today with "
    "update confirm whether payment cleared bank transfer usually takes three business days"
)


# ---- realistic conversations ------------------------------------------------------------------


def text_pool(count: int = 256, size: int = TEXT_BYTES, seed: int = 7) -> list[str]:
    """``count`` texts of about ``size`` bytes of English-like (compressible) words."""
    rng = random.Random(seed)
    vocabulary = WORDS.split()
    texts = []
    for _ in range(count):
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < size:
            words.append(rng.choice(vocabulary))
        texts.append(" ".join(words)[:size])
    return texts


def text_message(role: str, text: str) -> Message:
    return {"role": role, "content": [{"text": text}]}


def tool_use_message(text: str, tool_use_id: str) -> Message:
    return {
        "role": "assistant",
        "content": [
            {"text": text[:300]},
            {
                "toolUse": {
                    "toolUseId": tool_use_id,
                    "name": "lookup_order",
                    "input": {"order_id": tool_use_id[-6:], "fields": ["status", "tracking"]},
                }
            },
        ],
    }


def tool_result_message(text: str, tool_use_id: str) -> Message:
    return {
        "role": "user",
        "content": [
            {
                "toolResult": {
                    "toolUseId": tool_use_id,
                    "status": "success",
                    "content": [{"text": text}],
                }
            }
        ],
    }


def conversation(
    session_id: str, count: int, texts: Sequence[str], start: int = 0
) -> list[Message]:
    """Messages ``start`` to ``start + count`` of a session: user first, roles alternating,
    every third assistant message a toolUse answered by the next user message."""
    return [message_at(session_id, index, texts) for index in range(start, start + count)]


def message_at(session_id: str, index: int, texts: Sequence[str]) -> Message:
    text = texts[(index * 31 + len(session_id)) % len(texts)]
    if index % 2 == 1:
        if uses_tool(index):
            return tool_use_message(text, f"tooluse-{session_id}-{index}")
        return text_message("assistant", text)
    if index > 0 and uses_tool(index - 1):
        return tool_result_message(text, f"tooluse-{session_id}-{index - 1}")
    return text_message("user", text)


def uses_tool(assistant_index: int) -> bool:
    return (assistant_index // 2) % 3 == 2


def session_state(
    session_id: str, count: int, texts: Sequence[str], *, applied_ids: bool = True
) -> tuple[SessionState, Delivery]:
    """A session after ``count`` messages: one command applied per two messages (the session
    keeps the last ``APPLIED_KEPT`` ids), as the runtime leaves it."""
    state = SessionState(session_id=session_id, agent="support")
    state.messages = conversation(session_id, count, texts)
    state.turn_metrics = {"cycles": 3, "input_tokens": 5210, "output_tokens": 812}
    applied = count // 2 if applied_ids else 0
    first = max(0, applied - APPLIED_KEPT)
    return state, Delivery(tuple(command_id(session_id, step) for step in range(first, applied)))


def command_id(session_id: str, step: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_OID, f"{session_id}/{step}"))


def step_messages(session_id: str, at: int, texts: Sequence[str]) -> list[Message]:
    """New objects for the assistant toolUse message and its tool result of one step."""
    tool_use_id = f"tooluse-{session_id}-{at}"
    return [
        tool_use_message(texts[at % len(texts)], tool_use_id),
        tool_result_message(texts[(at + 1) % len(texts)], tool_use_id),
    ]


def record_bytes(records: Sequence[tuple[bytes, bytes | None]]) -> int:
    return sum(len(key) + len(value or b"") for key, value in records)


# ---- 1. bytes and CPU per step ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Written:
    """One step written by the SessionWriter: its records, their bytes, its median CPU."""

    records: int
    step_bytes: int
    head_bytes: int
    cpu_us: float


@dataclass(frozen=True, slots=True)
class StepCost:
    history: int
    step: Written
    bare: Written
    """The same with no applied command ids in the head."""
    whole_bytes: int
    whole_cpu_us: float


Step = tuple[tuple[SessionState, Delivery], list[Message], str | None]
"""A step's input: the session before, the two messages it appends, the command it applies."""


def median_cpu(prepare: Callable[[], T], run: Callable[[T], object]) -> float:
    """Median process CPU seconds of ``run(prepare())`` (``prepare`` is not timed)."""
    times: list[float] = []
    while len(times) < MIN_REPS or (sum(times) < STEP_BUDGET_S and len(times) < MAX_REPS):
        given = prepare()
        started = time.process_time()
        run(given)
        times.append(time.process_time() - started)
    return statistics.median(times)


def stepped(given: Step) -> tuple[SessionState, Delivery]:
    """The session after the step: a snapshot of the state (as the engine takes one) with the
    step's messages, the command marked applied."""
    state, delivery = given[0][0].snapshot(), given[0][1]
    state.messages.extend(given[1])
    if given[2] is not None:
        delivery = delivery.applying(given[2])
    return state, delivery


def step_inputs(history: int, texts: Sequence[str], *, applied_ids: bool) -> Callable[[], Step]:
    session_id = f"step-{history}"
    base = session_state(session_id, history, texts, applied_ids=applied_ids)
    applied = command_id(session_id, history // 2) if applied_ids else None

    def prepare() -> Step:
        return base, step_messages(session_id, history, texts), applied

    return prepare


def written_step(history: int, texts: Sequence[str], *, applied_ids: bool) -> Written:
    """A session of ``history`` messages written once, then the cost of one more step (each
    repetition steps from the same state, with new message objects)."""
    prepare = step_inputs(history, texts, applied_ids=applied_ids)
    writer = SessionWriter(SessionStore(MemoryTable()), record_max_bytes=RECORD_MAX_BYTES)
    state, delivery = prepare()[0]
    writer.write(state, 1, delivery)
    last: list[StateWrite] = []

    def step(given: Step) -> None:
        state, delivery = stepped(given)
        last[:] = [writer.write(state, 2, delivery)]

    cpu = median_cpu(prepare, step)
    records = last[0].records
    return Written(len(records), record_bytes(records), record_bytes(records[-1:]), cpu * 1e6)


def step_cost(history: int, texts: Sequence[str]) -> StepCost:
    prepare = step_inputs(history, texts, applied_ids=True)
    whole = encode_state(*stepped(prepare()))
    return StepCost(
        history=history,
        step=written_step(history, texts, applied_ids=True),
        bare=written_step(history, texts, applied_ids=False),
        whole_bytes=len(f"step-{history}") + len(whole),
        whole_cpu_us=median_cpu(prepare, lambda given: encode_state(*stepped(given))) * 1e6,
    )


def step_table(costs: list[StepCost]) -> str:
    rows = [
        [
            f"{c.history:,}",
            str(c.step.records),
            f"{c.step.step_bytes:,}",
            f"{c.step.head_bytes:,}",
            f"{c.step.cpu_us:.0f}",
            f"{c.bare.step_bytes:,}",
            f"{c.bare.cpu_us:.0f}",
            f"{c.whole_bytes:,}",
            f"{c.whole_cpu_us:.0f}",
        ]
        for c in costs
    ]
    first, last = costs[0], costs[-1]
    rows.append(
        [
            f"{last.history:,}/{first.history:,}",
            "",
            f"{last.step.step_bytes / first.step.step_bytes:.2f}x",
            f"{last.step.head_bytes / first.step.head_bytes:.2f}x",
            f"{last.step.cpu_us / first.step.cpu_us:.2f}x",
            f"{last.bare.step_bytes / first.bare.step_bytes:.2f}x",
            f"{last.bare.cpu_us / first.bare.cpu_us:.2f}x",
            f"{last.whole_bytes / first.whole_bytes:.1f}x",
            f"{last.whole_cpu_us / first.whole_cpu_us:.1f}x",
        ]
    )
    headers = [
        "history msgs",
        "records",
        "step bytes",
        "of which head",
        "step CPU us",
        "no-ids bytes",
        "no-ids CPU us",
        "whole-state bytes",
        "whole-state CPU us",
    ]
    return render(headers, rows)


# ---- 2. restore MB/s --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Restore:
    mb: float
    records: int
    sessions: int
    cold_s: float
    cold_cpu_s: float
    warm_s: float
    warm_records: int
    sqlite_mb: float


def listening(bootstrap: str) -> bool:
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=1.0):
            return True
    except OSError:
        return False


def changelog(target_bytes: int, texts: Sequence[str]) -> Iterator[tuple[bytes, bytes, bool]]:
    """Records of sessions written step by step (two messages and the head per step, 64
    sessions interleaved), as an uncompacted changelog holds them: (key, value, is head)."""
    writer = SessionWriter(SessionStore(MemoryTable()), record_max_bytes=RECORD_MAX_BYTES)
    produced = session = 0
    while produced < target_bytes:
        ids = [f"restore-{session + i:07d}" for i in range(64)]
        session += len(ids)
        for at in range(0, SESSION_MESSAGES, 2):
            for session_id in ids:
                state = SessionState(session_id=session_id, agent="support")
                delivery = Delivery()
                before = writer.store.get(session_id)
                if before is not None:
                    state, delivery = before.state.snapshot(), before.delivery
                state.messages.extend(conversation(session_id, 2, texts, start=at))
                delivery = delivery.applying(command_id(session_id, at // 2))
                write = writer.write(state, at // 2 + 1, delivery)
                for key, value in write.records:
                    assert value is not None
                    produced += len(key) + len(value)
                    yield key, value, key == write.records[-1][0]
        for session_id in ids:
            writer.store.drop(session_id)


async def create_topic(kafka: KafkaSettings, name: str) -> None:
    """One partition, configured as the service configures its sessions topic."""
    spec = next(s for s in topic_specs(TopicSettings()) if s.name == TopicSettings().sessions)
    client = admin(kafka)
    await client.start()
    try:
        await client.create_topics([NewTopic(name, 1, 1, topic_configs=spec.configs)])
    finally:
        await client.close()
    await wait_for_leaders(kafka, [name])


async def delete_topic(kafka: KafkaSettings, name: str) -> None:
    client = admin(kafka)
    await client.start()
    try:
        await client.delete_topics([name])
    finally:
        await client.close()


async def produce(kafka: KafkaSettings, topic: str, target_bytes: int) -> tuple[int, int, int]:
    """Fill partition 0 of ``topic``; returns (records, bytes of keys and values, sessions)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka.bootstrap_servers,
        acks=1,
        linger_ms=5,
        compression_type=None,
        max_batch_size=1024 * 1024,
        max_request_size=4 * 1024 * 1024,
    )
    await producer.start()
    records = size = 0
    heads: set[bytes] = set()
    pending: list[asyncio.Future[Any]] = []
    try:
        for key, value, head in changelog(target_bytes, text_pool()):
            headers = [event_seq_header(1)] if head else []
            pending.append(await producer.send(topic, value, key=key, partition=0, headers=headers))
            records += 1
            size += len(key) + len(value)
            if head:
                heads.add(key)
            if len(pending) >= 10_000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return records, size, len(heads)


async def timed_restore(kafka: KafkaSettings, topic: str, folder: Path) -> tuple[float, float, int]:
    """Wall and CPU seconds of one restore into the table in ``folder`` (opened for it and
    closed after), and how many offsets it read."""
    table = SqliteTable(folder, max_age_s=3600)
    reader = SessionsReader(kafka, topic)
    try:
        before = table.position
        wall, cpu = time.perf_counter(), time.process_time()
        await reader.restore(0, table, cache=SessionCache())
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        return wall, cpu, table.position - before
    finally:
        await reader.close()
        # As an owner that stopped cleanly: the next open trusts the table (a warm restore).
        table.mark_clean()
        table.close()


async def restore_cost(kafka: KafkaSettings, mb: float) -> Restore:
    topic = f"state-bench-{uuid.uuid4().hex[:8]}"
    await create_topic(kafka, topic)
    try:
        records, size, sessions = await produce(kafka, topic, int(mb * MB))
        with tempfile.TemporaryDirectory(prefix="cairn-state-bench-") as tmp:
            folder = Path(tmp) / "store"
            cold_s, cold_cpu, cold_read = await timed_restore(kafka, topic, folder)
            warm_s, _, warm_read = await timed_restore(kafka, topic, folder)
            sqlite = folder_bytes(folder)
    finally:
        await delete_topic(kafka, topic)
    if cold_read != records:
        print(f"restore: cold read {cold_read} offsets, {records} were produced", file=sys.stderr)
    return Restore(
        mb=size / MB,
        records=records,
        sessions=sessions,
        cold_s=cold_s,
        cold_cpu_s=cold_cpu,
        warm_s=warm_s,
        warm_records=warm_read,
        sqlite_mb=sqlite / MB,
    )


def restore_table(results: list[Restore]) -> str:
    headers = [
        "MB (key+value)",
        "records",
        "sessions",
        "cold s",
        "cold MB/s",
        "cold CPU s",
        "warm s",
        "warm equiv MB/s",
        "warm records",
        "sqlite MB",
    ]
    rows = [
        [
            f"{r.mb:.0f}",
            f"{r.records:,}",
            f"{r.sessions:,}",
            f"{r.cold_s:.2f}",
            f"{r.mb / r.cold_s:.1f}",
            f"{r.cold_cpu_s:.2f}",
            f"{r.warm_s:.3f}",
            f"{r.mb / r.warm_s:,.0f}",
            f"{r.warm_records:,}",
            f"{r.sqlite_mb:.0f}",
        ]
        for r in results
    ]
    return render(headers, rows)


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.iterdir() if path.is_file())


# ---- 3. RSS by session count ------------------------------------------------------------------


def current_rss() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def max_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def fill(store: SessionStore, sessions: int, texts: Sequence[str]) -> int:
    """Write ``sessions`` sessions into the store's table as committed changelog records;
    returns the JSON bytes of one session."""
    writer = SessionWriter(SessionStore(MemoryTable()), record_max_bytes=RECORD_MAX_BYTES)
    rows: list[Row] = []
    position = size = 0
    for index in range(sessions):
        state, delivery = session_state(f"rss-{index:07d}", SESSION_MESSAGES, texts)
        write = writer.write(state, 1, delivery)
        stored = writer.store.get(state.session_id)
        assert stored is not None
        size = stored.size
        writer.store.drop(state.session_id)
        head = state.session_id.encode()
        rows.extend((key, value, 1 if key == head else 0, 0) for key, value in write.records)
        if len(rows) >= 5_000 or index == sessions - 1:
            position += len(rows)
            store.committed(rows, position, {})
            rows = []
    return size


def rss_child(sessions: int, folder: Path, cache_max_bytes: int) -> dict[str, float]:
    """Runs in a process of its own: fill a SQLite-backed store, touch every session once."""
    table = SqliteTable(folder, max_age_s=3600)
    store = SessionStore(table, cache_max_bytes=cache_max_bytes)
    started = time.perf_counter()
    session_bytes = fill(store, sessions, text_pool())
    filled_s = time.perf_counter() - started
    rss_filled = current_rss()
    started = time.perf_counter()
    missing = sum(store.get(f"rss-{index:07d}") is None for index in range(sessions))
    get_s = time.perf_counter() - started
    rss, peak = current_rss(), max_rss()
    table.close()  # checkpoints the WAL into the file
    return {
        "session_kib": session_bytes / 1024,
        "sqlite_mb": folder_bytes(folder) / MB,
        "fill_s": filled_s,
        "get_s": get_s,
        "missing": missing,
        "cached_mib": store.cached_bytes / MIB,
        "rss_filled_mib": rss_filled / MIB,
        "rss_mib": rss / MIB,
        "max_rss_mib": peak / MIB,
    }


def rss_cost(sessions: int, cache_max_bytes: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="cairn-state-bench-") as tmp:
        command = [
            sys.executable,
            "-m",
            "bench.state_bench",
            "--rss-child",
            str(sessions),
            "--rss-dir",
            tmp,
            "--cache-max-bytes",
            str(cache_max_bytes),
        ]
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"rss child for {sessions} sessions failed:\n{done.stderr[-3000:]}")
    found: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return found


def rss_table(results: list[tuple[int, dict[str, float]]]) -> str:
    headers = [
        "sessions",
        "KiB/session",
        "sqlite MB",
        "fill s",
        "get-all s",
        "missing",
        "cached MiB",
        "RSS filled MiB",
        "RSS MiB",
        "max RSS MiB",
    ]
    rows = [
        [
            f"{count:,}",
            f"{r['session_kib']:.1f}",
            f"{r['sqlite_mb']:.0f}",
            f"{r['fill_s']:.1f}",
            f"{r['get_s']:.1f}",
            f"{r['missing']:.0f}",
            f"{r['cached_mib']:.0f}",
            f"{r['rss_filled_mib']:.0f}",
            f"{r['rss_mib']:.0f}",
            f"{r['max_rss_mib']:.0f}",
        ]
        for count, r in results
    ]
    return render(headers, rows)


# ---- 4. runtime steps/s -----------------------------------------------------------------------


def runtime_steps(bootstrap: str) -> str:
    """Committed steps/s at saturation from one run of bench/runtime_bench.py (no takeover)."""
    with tempfile.TemporaryDirectory(prefix="cairn-state-bench-") as tmp:
        out = Path(tmp) / "runtime.json"
        command = [sys.executable, "bench/runtime_bench.py", "--skip-takeover", "--out", str(out)]
        env = {**os.environ, "CAIRN_TEST_BOOTSTRAP": bootstrap}
        done = subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, check=False
        )
        if done.returncode != 0 or not out.exists():
            return f"runtime bench failed ({done.returncode}):\n{done.stderr[-2000:]}"
        report = json.loads(out.read_text())
    sat = report["saturation"]
    return (
        f"committed steps/s at saturation: {sat['steps_per_s']} "
        f"({report['sessions']} sessions, {report['partitions']} partitions; service CPU "
        f"{sat['service_cpu_ms_per_step']} ms/step, state record bytes avg "
        f"{sat['commit'].get('state_bytes_avg')})"
    )


# ---- output and arguments ---------------------------------------------------------------------


def render(headers: list[str], rows: list[list[str]]) -> str:
    """A plain table, every column right-aligned."""
    table = [headers, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
        for row in table
    )


def numbers(text: str) -> list[float]:
    return [float(item) for item in text.split(",") if item.strip()]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--bootstrap",
        default=os.environ.get("CAIRN_TEST_BOOTSTRAP") or "127.0.0.1:9092",
        help="broker for the restore part (default: $CAIRN_TEST_BOOTSTRAP or 127.0.0.1:9092)",
    )
    parser.add_argument("--history", default="10,100,1000,5000", help="messages, for the step")
    parser.add_argument("--restore-mb", default="100", help='MB to restore, e.g. "100,1000"')
    parser.add_argument("--sessions", default="1000,10000,50000", help="session counts, for RSS")
    parser.add_argument("--cache-max-bytes", type=int, default=CACHE_MAX_BYTES)
    parser.add_argument(
        "--parts", default="step,restore,rss", help="which of step,restore,rss to run"
    )
    parser.add_argument("--runtime", action="store_true", help="also run bench/runtime_bench.py")
    parser.add_argument("--rss-child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rss-dir", default=None, help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if args.rss_child is not None:
        report = rss_child(args.rss_child, Path(args.rss_dir), args.cache_max_bytes)
        print(json.dumps(report))
        return 0
    parts = set(args.parts.split(","))
    if "step" in parts:
        texts = text_pool()
        costs = [step_cost(int(n), texts) for n in numbers(args.history)]
        print(
            "1. one step (assistant toolUse + tool result) as head + history records vs the whole "
            "state in one record (old design)\n   no-ids: the head holds no applied command ids; "
            "target for the new design: 5,000/10 within 2x"
        )
        print(step_table(costs), end="\n\n", flush=True)
    if "restore" in parts:
        print(f"2. restore from {args.bootstrap} into a SqliteTable (1 partition)")
        if listening(args.bootstrap):
            kafka = KafkaSettings(bootstrap_servers=args.bootstrap)
            results = [asyncio.run(restore_cost(kafka, mb)) for mb in numbers(args.restore_mb)]
            print(restore_table(results), end="\n\n", flush=True)
        else:
            print(f"skipped: nothing listens at {args.bootstrap} (make kafka-up)", end="\n\n")
    if "rss" in parts:
        budget = args.cache_max_bytes / MIB
        print(f"3. RSS after reading every session once (cache budget {budget:.0f} MiB)")
        counts = [int(n) for n in numbers(args.sessions)]
        print(rss_table([(n, rss_cost(n, args.cache_max_bytes)) for n in counts]), flush=True)
        print()
    if args.runtime:
        print("4. runtime (bench/runtime_bench.py --skip-takeover)")
        print(runtime_steps(args.bootstrap))
    else:
        print("4. runtime: make bench RUNTIME_BENCH_ARGS=--skip-takeover (or pass --runtime)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
