"""Write the golden session states of the current state version into ``contracts/sessions/``.

Run once per released state version (``python -m tests.contract.goldens``); existing files are
never overwritten, because old goldens must keep loading unchanged. Each state is written twice:
whole (``v<N>/``), and as the changelog records that hold it (``changelog-v<N>/``: a list of
``{"key", "value"}`` in write order, keys as text, values as JSON, ``null`` for a tombstone).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import orjson

from service.agent.state import SESSION_STATE_VERSION, SessionState
from service.sessions.history import unpack
from service.sessions.store import SessionStore
from service.sessions.writer import SessionWriter
from tests.contract.session_scenario import PROMPT, SESSION, continuation, step, support_agent

OUT = Path(__file__).resolve().parents[2] / "contracts" / "sessions"

NAMES = {
    ("checkpoint", "after_model", 0): "paused-after-model",
    ("checkpoint", "after_tools", 0): "paused-after-tools",
    ("interrupt", None, 1): "pending-interrupt",
}


async def capture() -> dict[str, SessionState]:
    """Run the scenario once and keep the states named in :data:`NAMES`."""
    agent = support_agent()
    state = SessionState(session_id=SESSION)
    value: object = PROMPT
    kept: dict[str, SessionState] = {}
    for index in range(10):
        result, state = await step(agent, state, f"cmd-{index + 1:04d}", value)
        cp = result.checkpoint
        name = NAMES.get(
            (
                result.stop_reason,
                cp.position if cp else None,
                cp.cycle_index if cp else state.cycle_index,
            )
        )
        if name is not None:
            kept[name] = state
        if result.stop_reason not in ("checkpoint", "interrupt"):
            return kept
        value = continuation(result)
    raise AssertionError("the scenario did not end")


def changelog_records(state: SessionState) -> list[dict[str, object]]:
    """The records one write of ``state`` puts on the changelog, readable."""
    write = SessionWriter(SessionStore(), record_max_bytes=900_000).write(state, 0)
    return [
        {"key": key.decode(), "value": None if value is None else unpack(value)[0]}
        for key, value in write.records
    ]


def main() -> int:
    whole = OUT / f"v{SESSION_STATE_VERSION}"
    records = OUT / f"changelog-v{SESSION_STATE_VERSION}"
    for name, state in asyncio.run(capture()).items():
        _write(whole / f"{name}.json", state.to_dict())
        _write(records / f"{name}.json", changelog_records(state))
    return 0


def _write(path: Path, value: object) -> None:
    if path.exists():
        print(f"kept {path} (goldens are never rewritten)")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(value, option=orjson.OPT_INDENT_2) + b"\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
