"""What decoding one very large session costs the event loop, and what a thread would change.

Writes one session of ``--mb`` MB of JSON (user and assistant turns, every assistant turn a
toolUse answered by a tool result of ``--result-kb`` KiB of text) with :class:`SessionWriter`,
then loads it from a table holding its records, while a ticker task measures how late the
loop runs it (every 1 ms):

- ``get on the loop``: :meth:`SessionStore.get` of a session not in the cache, which decodes
  it on the event loop (what every read did before :meth:`SessionStore.prefetch`);
- ``prefetch, then get``: what the command path does now, the decode in a thread for a
  session above :data:`~service.sessions.store.DECODE_OFF_LOOP_BYTES`.

Prints the wall time of the decode and the ticker's largest lag, median of ``--runs``. A
benchmark, not a test: it reports, it does not assert targets.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from service.agent.state import SessionState
from service.runtime.records import RECORD_MAX_BYTES
from service.sessions.store import SessionStore
from service.sessions.table import MemoryTable, Row, Table
from service.sessions.writer import SessionWriter

WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "reading", "output")


def _text(size: int, seed: int) -> str:
    out: list[str] = []
    length = 0
    i = seed
    while length < size:
        word = WORDS[i % len(WORDS)] + str(i % 997)
        out.append(word)
        length += len(word) + 1
        i += 7
    return " ".join(out)


def session(mb: int, result_kb: int) -> SessionState:
    state = SessionState(session_id="big-session", agent="bench")
    result = _text(result_kb * 1024, 0)
    total = 0
    turn = 0
    while total < mb * 1_000_000:
        use_id = f"t{turn}"
        state.messages.append({"role": "user", "content": [{"text": _text(400, turn)}]})
        state.messages.append(
            {
                "role": "assistant",
                "content": [
                    {"text": _text(300, turn + 1)},
                    {"toolUse": {"toolUseId": use_id, "name": "read", "input": {"n": turn}}},
                ],
            }
        )
        block = {"toolUseId": use_id, "status": "success", "content": [{"text": result}]}
        state.messages.append({"role": "user", "content": [{"toolResult": block}]})
        total += len(result) + 900
        turn += 1
    state.messages.append({"role": "assistant", "content": [{"text": "done"}]})
    return state


async def _measured(decode: Any) -> tuple[float, float]:
    """Wall seconds of ``decode()`` and the ticker's largest lag meanwhile, in seconds."""
    lag = 0.0
    running = True

    async def ticker() -> None:
        nonlocal lag
        while running:
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            lag = max(lag, time.perf_counter() - before - 0.001)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    lag = 0.0
    started = time.perf_counter()
    await decode()
    took = time.perf_counter() - started
    running = False
    await task
    return took, lag


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, nargs="+", default=[10, 100, 300])
    parser.add_argument("--result-kb", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print("| session JSON MB | stored MB | mode | decode ms | largest loop lag ms |")
    print("|---:|---:|---|---:|---:|")
    for mb in args.mb:
        writer = SessionWriter(SessionStore(MemoryTable()), record_max_bytes=RECORD_MAX_BYTES)
        state = session(mb, args.result_kb)
        session_id = state.session_id
        write = writer.write(state, 1)
        head = session_id.encode()
        rows: list[Row] = [(key, value, 1 if key == head else 0, 0) for key, value in write.records]
        stored_mb = sum(len(value or b"") for _, value, _, _ in rows) / 1e6
        del writer, state, write
        table = MemoryTable()
        filling = SessionStore(table)
        filling.committed(rows, len(rows), {})
        filling.flush()
        del rows

        async def on_loop(table: Table = table, session_id: str = session_id) -> None:
            SessionStore(table).get(session_id)  # what a first read did, and still does

        async def prefetched(table: Table = table, session_id: str = session_id) -> None:
            store = SessionStore(table)
            # What the command path now does first, the session held while it is handled (a
            # session over the cache's budget is evicted at once when nothing holds it).
            with store.in_use(session_id):
                await store.prefetch(session_id)
                store.get(session_id)

        json_mb = (SessionStore(table).get(session_id) or _missing()).size / 1e6
        for mode, decode in (("get on the loop", on_loop), ("prefetch, then get", prefetched)):
            runs = [await _measured(decode) for _ in range(args.runs)]
            took = statistics.median(r[0] for r in runs) * 1000
            lag = statistics.median(r[1] for r in runs) * 1000
            print(f"| {json_mb:,.0f} | {stored_mb:,.0f} | {mode} | {took:,.0f} | {lag:,.1f} |")


def _missing() -> Any:
    raise AssertionError("the session did not load")


if __name__ == "__main__":
    asyncio.run(main())
