"""The LangGraph side of ``bench/compare_bench.py``, run inside its own scratch virtualenv.

A graph of two nodes over ``MessagesState``: ``agent`` asks a scripted zero-latency model, which
calls the tool ``tick`` three times per turn and then answers; ``tools`` is LangGraph's prebuilt
``ToolNode`` running ``tick``, a coroutine that returns at once. A turn is one ``ainvoke`` on the
session's thread with ``durability="sync"`` (each super-step's checkpoint is saved before the
next super-step starts). It saves nine checkpoints: ``input`` as the turn begins, then one
(metadata source ``loop``) after each super-step: ``__start__``, which moves the prompt into
the state, and seven that run a node: agent, tools, agent, tools, agent, tools, agent.

A step is one of those seven: counted when the checkpointer's ``aput`` of its checkpoint
returns. Its latency runs from the moment the step could start (the previous step's checkpoint
committed, or the call to ``ainvoke`` for a turn's first step, whose latency so includes the
``input`` and ``__start__`` checkpoints) to that moment. Every checkpoint saved in a measuring
window is also counted, as ``checkpoints``.

Phases, on the same sessions: saturation (closed loop: every session runs turns back to back),
then an open loop starting turns at ``--load`` of the measured steps/s (divided by seven, as
turns), picking an idle session for each (a new one when none is idle). The process writes
one JSON line to stdout when each measuring window opens and closes (the parent reads the CPU
of this process and of the database between them), and a last line with the report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

TOOL_CYCLES = 3
STEPS_PER_TURN = 2 * TOOL_CYCLES + 1


@tool
async def tick(step: int) -> str:
    """Return at once (a zero-latency tool).

    Args:
        step: Which cycle asked.
    """
    return f"tick {step}"


class ScriptedModel:
    """A zero-latency model: ``cycles`` calls of ``tick`` per turn, then a text answer. Like
    Cairn's bench model, its cost does not grow with the conversation: it reads back to the
    turn's prompt (``turn N``) only."""

    def __init__(self, cycles: int) -> None:
        self.cycles = cycles

    async def ainvoke(self, messages: list[AnyMessage]) -> AIMessage:
        index = 0
        turn = ""
        for message in reversed(messages):
            if isinstance(message, HumanMessage):
                turn = str(message.content).removeprefix("turn ")
                break
            if isinstance(message, ToolMessage):
                index += 1
        if index < self.cycles:
            call = {"id": f"t{turn}c{index}", "name": "tick", "args": {"step": index}}
            return AIMessage(content="", tool_calls=[call])
        return AIMessage(content=f"done turn {turn}")


@dataclass
class Session:
    thread_id: str
    boundary: float = 0.0
    """When the step now running could start."""
    turns: int = 0
    applying_input: bool = False


@dataclass
class Window:
    started: float
    steps: int = 0
    checkpoints: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: int = 0


class Recorder:
    """Learns from the checkpointer when each checkpoint is committed."""

    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}
        self.window: Window | None = None
        self.first_error: str | None = None

    def committed(self, thread_id: str, source: str | None) -> None:
        now = time.perf_counter()
        window = self.window
        if window is not None:
            window.checkpoints += 1
        session = self.sessions[thread_id]
        if source != "loop":
            return
        if session.applying_input:
            # The turn's first super-step only moves the prompt into the state (the graph's
            # __start__ node): part of the first step, like the input checkpoint before it.
            session.applying_input = False
            return
        latency = now - session.boundary
        session.boundary = now
        if window is not None:
            window.steps += 1
            window.latencies.append(latency)

    def failed(self, error: BaseException | str) -> None:
        if self.window is not None:
            self.window.errors += 1
        if self.first_error is None:
            self.first_error = repr(error)
            print(f"turn failed: {error!r}", file=sys.stderr, flush=True)

    def open(self, phase: str) -> None:
        self.window = Window(started=time.perf_counter())
        emit({"event": "window", "phase": phase, "state": "open"})

    def close(self, phase: str) -> tuple[Window, float]:
        window, self.window = self.window, None
        assert window is not None
        elapsed = time.perf_counter() - window.started
        emit({"event": "window", "phase": phase, "state": "closed"})
        return window, elapsed


RECORDER = Recorder()


def emit(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def timed(base: type) -> type:
    """``base`` (a checkpointer class) telling the recorder when each checkpoint is committed."""

    class Timed(base):  # type: ignore[misc]
        async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            stored = await super().aput(config, checkpoint, metadata, new_versions)
            RECORDER.committed(config["configurable"]["thread_id"], metadata.get("source"))
            return stored

    return Timed


def build_graph(checkpointer: Any) -> Any:
    model = ScriptedModel(TOOL_CYCLES)

    async def agent(state: MessagesState) -> dict[str, list[AnyMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([tick]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=checkpointer)


class Bench:
    def __init__(self, graph: Any, durability: str) -> None:
        self.graph = graph
        self.durability = durability
        self.idle: deque[Session] = deque()
        self.run_id = uuid.uuid4().hex[:8]

    def add_session(self) -> Session:
        session = Session(f"{self.run_id}-{len(RECORDER.sessions)}")
        RECORDER.sessions[session.thread_id] = session
        return session

    async def turn(self, session: Session) -> None:
        session.turns += 1
        session.boundary = time.perf_counter()
        session.applying_input = True
        config = {"configurable": {"thread_id": session.thread_id}}
        prompt = {"messages": [HumanMessage(content=f"turn {session.turns}")]}
        try:
            out = await self.graph.ainvoke(prompt, config, durability=self.durability)
        except Exception as error:
            RECORDER.failed(error)
            return
        if out["messages"][-1].content != f"done turn {session.turns}":
            RECORDER.failed(f"unexpected answer {out['messages'][-1]!r}")

    async def closed(
        self, sessions: list[Session], duration: float, warmup: float
    ) -> tuple[Window, float]:
        stop = asyncio.Event()

        async def loop(session: Session) -> None:
            while not stop.is_set():
                await self.turn(session)

        tasks = [asyncio.create_task(loop(session)) for session in sessions]
        await asyncio.sleep(warmup)
        RECORDER.open("saturation")
        await asyncio.sleep(duration)
        window, elapsed = RECORDER.close("saturation")
        stop.set()
        await asyncio.gather(*tasks)
        return window, elapsed

    async def open_loop(
        self, step_rate: float, duration: float, warmup: float
    ) -> tuple[Window, float]:
        turn_rate = step_rate / STEPS_PER_TURN
        running: set[asyncio.Task[None]] = set()

        async def one(session: Session) -> None:
            try:
                await self.turn(session)
            finally:
                self.idle.append(session)

        started = time.perf_counter()
        begun = 0
        opened = False
        while True:
            now = time.perf_counter()
            if not opened and now >= started + warmup:
                RECORDER.open("half_load")
                opened = True
            if now - started >= warmup + duration:
                break
            due = int((now - started) * turn_rate) - begun
            while due > 0:
                session = self.idle.popleft() if self.idle else self.add_session()
                task = asyncio.create_task(one(session))
                running.add(task)
                task.add_done_callback(running.discard)
                begun += 1
                due -= 1
            await asyncio.sleep(0.002)
        window, elapsed = RECORDER.close("half_load")
        await asyncio.gather(*running)
        return window, elapsed


@contextlib.asynccontextmanager
async def checkpointer(args: argparse.Namespace) -> AsyncIterator[Any]:
    if args.backend == "sqlite":
        import aiosqlite
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        async with aiosqlite.connect(args.sqlite_path) as conn:
            saver = timed(AsyncSqliteSaver)(conn)
            await saver.setup()
            if args.sqlite_synchronous:
                await conn.execute(f"PRAGMA synchronous={args.sqlite_synchronous}")
            yield saver
        return
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    # The settings the checkpointer requires of its connections (autocommit, dict rows, no
    # prepared statements), over a pool as a service would hold one.
    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    async with AsyncConnectionPool(
        args.postgres_dsn, min_size=args.pool_size, max_size=args.pool_size, kwargs=kwargs
    ) as pool:
        saver = timed(AsyncPostgresSaver)(pool)
        await saver.setup()
        yield saver


def phase_report(window: Window, elapsed: float) -> dict[str, Any]:
    return {
        "elapsed_s": round(elapsed, 3),
        "steps": window.steps,
        "steps_per_s": round(window.steps / elapsed, 1),
        "checkpoints": window.checkpoints,
        "errors": window.errors,
        "latencies_s": window.latencies,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    async with checkpointer(args) as saver:
        bench = Bench(build_graph(saver), args.durability)
        sessions = [bench.add_session() for _ in range(args.sessions)]
        report: dict[str, Any] = {"sessions": args.sessions}
        if args.rate is None:
            saturation, elapsed = await bench.closed(sessions, args.duration, args.warmup)
            report["saturation"] = phase_report(saturation, elapsed)
            rate = saturation.steps / elapsed * args.load
        else:
            rate = args.rate
        bench.idle.extend(sessions)
        half, elapsed = await bench.open_loop(rate, args.duration, args.warmup)
        report["half_load"] = {"target_rate": round(rate, 1), **phase_report(half, elapsed)}
        report["sessions_used"] = len(RECORDER.sessions)
        report["turns"] = sum(session.turns for session in RECORDER.sessions.values())
        report["first_error"] = RECORDER.first_error
        return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), required=True)
    parser.add_argument("--sqlite-path", default=":memory:")
    parser.add_argument(
        "--sqlite-synchronous",
        choices=("OFF", "NORMAL", "FULL", "EXTRA"),
        default=None,
        help="PRAGMA synchronous of the connection (default: SQLite's, FULL)",
    )
    parser.add_argument("--postgres-dsn", default="")
    parser.add_argument("--pool-size", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--load", type=float, default=0.5)
    parser.add_argument("--rate", type=float, default=None)
    parser.add_argument("--durability", choices=("sync", "async", "exit"), default="sync")
    args = parser.parse_args()
    report = asyncio.run(run(args))
    report.update(
        {
            "event": "report",
            "backend": args.backend,
            "durability": args.durability,
            "steps_per_turn": STEPS_PER_TURN,
            "versions": {
                name: version(name)
                for name in (
                    "langgraph",
                    "langgraph-checkpoint",
                    "langgraph-checkpoint-sqlite",
                    "langgraph-checkpoint-postgres",
                    "langchain-core",
                    "aiosqlite",
                    "psycopg",
                )
            },
        }
    )
    emit(report)


if __name__ == "__main__":
    main()
