"""Run one invocation in a fresh process: state bytes in, state bytes and result JSON out.

Usage: ``python resume_runner.py <scenario> <state-in> <input-json> <state-out> <result-out>``.
Nothing is shared with the calling process but those files.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import orjson
from engine_helpers import SCENARIOS, invoke

from service.sessions.codec import decode_state, encode_state


async def main(
    scenario: str, state_in: str, input_json: str, state_out: str, result_out: str
) -> None:
    agent = SCENARIOS[scenario]()
    state = decode_state(Path(state_in).read_bytes())
    out = await invoke(agent, state, orjson.loads(input_json), command_id="remote")
    Path(state_out).write_bytes(encode_state(out.state))
    Path(result_out).write_bytes(orjson.dumps(out.result.to_dict()))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
