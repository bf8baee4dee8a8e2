"""Golden session states of every released version load through the sessions codec and resume.

A golden file is never rewritten: when the state version changes, the old files stay here and
must keep loading (through the upcasters) and continue their turn to the end.
"""

from __future__ import annotations

import asyncio
import zlib
from pathlib import Path

import orjson
import pytest

from service.agent.errors import CheckpointStaleError
from service.agent.state import SESSION_STATE_VERSION
from service.agent.types import Checkpoint
from service.sessions.codec import decode_record, decode_state, encode_state, record_dict
from service.sessions.history import pack
from service.sessions.store import SessionStore
from service.wire.session_record import SessionStateRecord
from tests.contract.session_scenario import FINAL_TEXT, SESSION, run_to_end, support_agent

SESSIONS = Path(__file__).resolve().parents[2] / "contracts" / "sessions"
GOLDENS = sorted(SESSIONS.glob("v*/*.json"))
CHANGELOG_GOLDENS = sorted(SESSIONS.glob("changelog-v*/*.json"))


def test_goldens_exist_for_the_current_version_with_both_kinds_of_pause() -> None:
    current = {p.stem for p in GOLDENS if p.parent.name == f"v{SESSION_STATE_VERSION}"}
    assert {"paused-after-model", "paused-after-tools", "pending-interrupt"} <= current


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_golden_loads_plain_and_compressed(path: Path) -> None:
    raw = path.read_bytes()
    state, delivery = decode_record(raw)
    assert decode_record(b"z" + zlib.compress(raw)) == (state, delivery)
    assert decode_record(encode_state(state, delivery)) == (state, delivery)
    assert state.schema_version == SESSION_STATE_VERSION
    assert delivery.applied, "every golden session answered commands"
    if path.parent.name == f"v{SESSION_STATE_VERSION}":
        data = orjson.loads(raw)
        assert SessionStateRecord.model_validate(data).model_dump() == data
        assert record_dict(state, delivery) == data


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_golden_resumes_to_the_end_of_its_turn(path: Path) -> None:
    state = decode_state(path.read_bytes())
    if state.interrupted:
        assert state.pending is not None
        first = [
            {"interruptResponse": {"interruptId": i.id, "response": {"approved": True}}}
            for i in state.pending.interrupts
        ]
    else:
        assert state.checkpoint is not None
        first = {"checkpointResume": {"checkpoint": state.checkpoint.to_dict()}}
    results, final = asyncio.run(run_to_end(support_agent(), state, first))
    assert results[-1].stop_reason == "end_turn"
    assert results[-1].message == {"role": "assistant", "content": [{"text": FINAL_TEXT}]}
    uses = [b for m in final.messages for b in m["content"] if "toolUse" in b]
    answers = [b for m in final.messages for b in m["content"] if "toolResult" in b]
    assert [u["toolUse"]["toolUseId"] for u in uses] == [
        a["toolResult"]["toolUseId"] for a in answers
    ]
    assert any("refunded 4.99 EUR" in str(a) for a in answers)


def test_a_stale_checkpoint_against_a_golden_is_refused() -> None:
    state = decode_state((SESSIONS / "v1" / "paused-after-tools.json").read_bytes())
    stale = Checkpoint(position="after_model", cycle_index=0)
    result = {"checkpointResume": {"checkpoint": stale.to_dict()}}
    with pytest.raises(CheckpointStaleError):
        asyncio.run(run_to_end(support_agent(), state, result))


def test_state_from_the_future_is_refused() -> None:
    data = orjson.loads((SESSIONS / "v1" / "paused-after-model.json").read_bytes())
    data["schema_version"] = SESSION_STATE_VERSION + 1
    with pytest.raises(ValueError, match="newer than this build"):
        decode_state(orjson.dumps(data))


def _from_changelog(path: Path) -> SessionStore:
    store = SessionStore()
    for record in orjson.loads(path.read_bytes()):
        value = record["value"]
        store.load(record["key"].encode(), None if value is None else pack(value)[0], [])
    return store


def test_changelog_goldens_exist_for_the_current_version() -> None:
    current = f"changelog-v{SESSION_STATE_VERSION}"
    names = {p.stem for p in CHANGELOG_GOLDENS if p.parent.name == current}
    assert {"paused-after-model", "paused-after-tools", "pending-interrupt"} <= names


@pytest.mark.parametrize("path", CHANGELOG_GOLDENS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_changelog_golden_loads_as_the_same_state_written_whole(path: Path) -> None:
    """The head and history records load as the whole golden of the same name, which the
    resume test above continues to the end of its turn."""
    stored = _from_changelog(path).get(SESSION)
    assert stored is not None
    version = path.parent.name.removeprefix("changelog-")
    whole = decode_record((SESSIONS / version / path.name).read_bytes())
    assert (stored.state, stored.delivery) == whole
