"""Write the golden session states of the current state version into ``contracts/sessions/``.

Run once per released state version (``python -m tests.contract.goldens``); existing files are
never overwritten, because old goldens must keep loading unchanged.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import orjson

from service.agent.state import SESSION_STATE_VERSION, SessionState
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


def main() -> int:
    target = OUT / f"v{SESSION_STATE_VERSION}"
    target.mkdir(parents=True, exist_ok=True)
    for name, state in asyncio.run(capture()).items():
        path = target / f"{name}.json"
        if path.exists():
            print(f"kept {path} (goldens are never rewritten)")
            continue
        path.write_bytes(orjson.dumps(state.to_dict(), option=orjson.OPT_INDENT_2) + b"\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
