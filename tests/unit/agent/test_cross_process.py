"""Resume in another process: only the encoded state crosses, and the continuation is identical."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from engine_helpers import SCENARIOS, answers, invoke, resume

from service.agent.state import SessionState
from service.sessions.codec import decode_state, encode_state

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def comparable(state: SessionState) -> dict[str, Any]:
    data = state.to_dict()
    for key in ("turn_metrics", "turn_started_at"):
        data.pop(key)
    return data


def run_elsewhere(
    tmp: Path, scenario: str, state: SessionState, payload: Any
) -> tuple[SessionState, dict[str, Any]]:
    state_in, state_out, result_out = tmp / "in.bin", tmp / "out.bin", tmp / "result.json"
    state_in.write_bytes(encode_state(state))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)])}
    subprocess.run(
        [
            sys.executable,
            str(HERE / "resume_runner.py"),
            scenario,
            str(state_in),
            orjson.dumps(payload).decode(),
            str(state_out),
            str(result_out),
        ],
        check=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    return decode_state(state_out.read_bytes()), orjson.loads(result_out.read_bytes())


@pytest.mark.parametrize("pauses_before", [1, 2, 3])
async def test_resume_after_checkpoint_in_another_process(
    tmp_path: Path, pauses_before: int
) -> None:
    agent = SCENARIOS["two_cycles"]()
    out = await invoke(agent, SessionState(session_id="xp"), "go")
    for _ in range(pauses_before - 1):
        out = await invoke(agent, out.state, resume(out))
    payload = resume(out)
    local = await invoke(
        SCENARIOS["two_cycles"](),
        decode_state(encode_state(out.state)),
        payload,
        command_id="remote",
    )
    remote_state, remote_result = run_elsewhere(tmp_path, "two_cycles", out.state, payload)
    assert comparable(remote_state) == comparable(local.state)
    expected = local.result.to_dict()
    for result in (expected, remote_result):
        result.pop("metrics")
    assert remote_result == orjson.loads(orjson.dumps(expected))


@pytest.mark.parametrize("scenario", ["approval", "approval_off"])
async def test_answer_an_interrupt_in_another_process(tmp_path: Path, scenario: str) -> None:
    agent = SCENARIOS[scenario]()
    out = await invoke(agent, SessionState(session_id="xp"), "go")
    if out.stop == "checkpoint":
        out = await invoke(agent, out.state, resume(out))
    assert out.stop == "interrupt"
    payload = answers((out.result.interrupts[0].id, "approved"))
    local = await invoke(
        SCENARIOS[scenario](), decode_state(encode_state(out.state)), payload, command_id="remote"
    )
    remote_state, remote_result = run_elsewhere(tmp_path, scenario, out.state, payload)
    assert comparable(remote_state) == comparable(local.state)
    assert remote_result["stop_reason"] == local.result.stop_reason
    assert remote_state.messages[2]["content"][0]["toolResult"]["content"] == [
        {"text": "ship:approved"}
    ]
