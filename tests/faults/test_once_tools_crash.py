"""kill -9 around tools of effect ``once``: never run twice silently, never an outcome dropped.

Proven each time, by tool-call counters kept outside the service: a ``once`` tool killed while
it ran is not run again by the next owner, which asks (``tool_outcome_unknown``) instead and goes
on as answered; one that finished before the kill is not asked about, its recorded result is
used; the idempotent tool of the same batch runs again without asking.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.support.runtime_harness import (
    Client,
    Cluster,
    ServiceProcess,
    checkpoint_resume,
    invoke,
    last_session_state,
    metric_total,
    resume,
    services,
    unique,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.timeout(240)]

AGENTS = "tests.support.effect_agents:registry"


def _calls(cluster: Cluster, session: str) -> Counter[str]:
    return Counter(c["tool"] for c in cluster.tool_calls() if c["session_id"] == session)


def _start(cluster: Cluster, name: str, gates: Path) -> ServiceProcess:
    return cluster.start(name, CAIRN_AGENTS=AGENTS, CAIRN_TEST_GATE_DIR=str(gates))


async def _victim(
    cluster: Cluster, procs: list[ServiceProcess], gates: Path, *held: str
) -> ServiceProcess:
    """The first owner, ready, with the tools named in ``held`` held inside their run."""
    for name in held:
        (gates / name).touch()
    victim = _start(cluster, "victim", gates)
    procs.append(victim)
    await victim.wait_ready()
    return victim


async def _result_of(cluster: Cluster, session: str, tool_use_id: str) -> dict[str, Any]:
    """The toolResult the session's committed history holds for ``tool_use_id``."""
    state, _ = await last_session_state(cluster, session)
    [found] = [
        block["toolResult"]
        for message in state.messages
        for block in message["content"]
        if block.get("toolResult", {}).get("toolUseId") == tool_use_id
    ]
    return dict(found)


def _answer(session: str, interrupt_id: str, response: Any) -> dict[str, Any]:
    return resume(
        session, [{"interruptResponse": {"interruptId": interrupt_id, "response": response}}]
    )


def _unknown(result: dict[str, Any]) -> dict[str, Any]:
    assert result["stop_reason"] == "interrupt", result
    [interrupt] = result["interrupts"]
    assert interrupt["name"] == "tool_outcome_unknown", interrupt
    return interrupt


async def _kill_while_charging(
    cluster: Cluster, client: Client, procs: list[ServiceProcess], gates: Path, session: str
) -> tuple[dict[str, Any], dict[str, Any], ServiceProcess]:
    """Start a turn, kill its owner while ``charge`` runs; the next owner's answer and the
    command it answers."""
    victim = await _victim(cluster, procs, gates, "charge")
    command = invoke(session, "go", agent="ledger-sequential")
    await client.send(command)
    await wait_for(lambda: _calls(cluster, session)["charge"] == 1, 30, "charge running")
    victim.kill()
    fresh = _start(cluster, "fresh", gates)
    procs.append(fresh)
    paused = await client.result(command["command_id"], 60, alive=fresh)
    return command, paused, fresh


@pytest.mark.parametrize(
    ("answer", "charges"),
    [
        ({"result": {"content": [{"text": "charged by hand"}], "status": "success"}}, 1),
        ({"retry": True}, 2),
    ],
    ids=["supplied-result", "retry"],
)
async def test_a_once_tool_killed_while_it_ran_is_asked_about_not_run_again(
    cluster: Cluster, tmp_path: Path, answer: dict[str, Any], charges: int
) -> None:
    session = unique("s")
    with services() as procs:
        async with Client(cluster) as client:
            command, paused, fresh = await _kill_while_charging(
                cluster, client, procs, tmp_path, session
            )
            interrupt = _unknown(paused)
            reason = interrupt["reason"]
            assert reason["tool_name"] == "charge"
            assert reason["tool_use_id"] == "t1-charge"
            assert reason["idempotency_key"] == f"{session}:t1-charge"
            assert reason["input"] == {"step": 0}
            assert reason["instance"].endswith(f":{procs[0].pid}")
            assert isinstance(reason["started_at"], float)
            # The next owner did not run it: one call, the victim's.
            assert _calls(cluster, session)["charge"] == 1
            assert await metric_total(fresh, "cairn_tool_outcome_unknown") == 1
            (tmp_path / "charge").unlink()
            answered = resume(
                session,
                [{"interruptResponse": {"interruptId": interrupt["id"], "response": answer}}],
            )
            await client.send(answered)
            done = await client.result(answered["command_id"], 60, alive=fresh)
            assert done["stop_reason"] == "end_turn", done
            assert await fresh.terminate() == 0
            await client.caught_up()
    assert _calls(cluster, session)["charge"] == charges
    seen = await _result_of(cluster, session, "t1-charge")
    expected = "charged by hand" if "result" in answer else "charged 0"
    assert seen["content"] == [{"text": expected}]
    charge_pids = [c["pid"] for c in cluster.tool_calls() if c["tool"] == "charge"]
    assert charge_pids[0] == procs[0].pid
    for command_id in (command["command_id"], answered["command_id"]):
        assert len(client.results_for(command_id)) == 1


async def test_a_once_tool_that_finished_before_the_kill_is_not_asked_about(
    cluster: Cluster, tmp_path: Path
) -> None:
    session = unique("s")
    with services() as procs:
        victim = await _victim(cluster, procs, tmp_path, "fetch")
        async with Client(cluster) as client:
            command = invoke(session, "go", agent="ledger-sequential")
            await client.send(command)

            def fetch_started() -> bool:
                return any(
                    e.get("session_id") == session
                    and e.get("type") == "tool_started"
                    and e.get("tool_use_id") == "t1-fetch"
                    for e in client.events
                )

            # Committed after charge's recorded result: once visible, that result is durable.
            await wait_for(fetch_started, 30, "fetch started, visibly", alive=victim)
            victim.kill()
            (tmp_path / "fetch").unlink()
            fresh = _start(cluster, "fresh", tmp_path)
            procs.append(fresh)
            done = await client.result(command["command_id"], 60, alive=fresh)
            assert done["stop_reason"] == "end_turn", done
            assert await fresh.terminate() == 0
            await client.caught_up()
    assert len(client.results_for(command["command_id"])) == 1
    calls = [c for c in cluster.tool_calls() if c["session_id"] == session]
    assert [c["tool"] for c in calls if c["tool"] == "charge"] == ["charge"]
    fetches = [c for c in calls if c["tool"] == "fetch"]
    assert [c["pid"] for c in fetches] == [victim.pid, fresh.pid]
    assert {c["idempotency_key"] for c in fetches} == {f"{session}:t1-fetch"}
    assert (await _result_of(cluster, session, "t1-charge"))["content"] == [{"text": "charged 0"}]


async def test_the_idempotent_tool_of_the_batch_runs_again_without_asking(
    cluster: Cluster, tmp_path: Path
) -> None:
    session = unique("s")
    (tmp_path / "charge").touch()
    with services() as procs:
        victim = await _victim(cluster, procs, tmp_path, "fetch")
        async with Client(cluster) as client:
            command = invoke(session, "go", agent="ledger-concurrent")
            await client.send(command)
            await wait_for(
                lambda: _calls(cluster, session) == Counter({"charge": 1, "fetch": 1}),
                30,
                "both tools running",
                alive=victim,
            )
            victim.kill()
            (tmp_path / "fetch").unlink()
            fresh = _start(cluster, "fresh", tmp_path)
            procs.append(fresh)
            paused = await client.result(command["command_id"], 60, alive=fresh)
            interrupt = _unknown(paused)
            assert interrupt["reason"]["tool_use_id"] == "t1-charge"
            # Asked about charge only; fetch ran again on the next owner, unasked.
            assert _calls(cluster, session) == Counter({"charge": 1, "fetch": 2})
            answered = _answer(session, interrupt["id"], {"fail": "the charge was declined"})
            await client.send(answered)
            done = await client.result(answered["command_id"], 60, alive=fresh)
            assert done["stop_reason"] == "end_turn", done
            assert await fresh.terminate() == 0
            await client.caught_up()
    assert _calls(cluster, session) == Counter({"charge": 1, "fetch": 2})
    declined = await _result_of(cluster, session, "t1-charge")
    assert declined == {
        "toolUseId": "t1-charge",
        "status": "error",
        "content": [{"text": "the charge was declined"}],
    }


async def test_with_checkpointing_the_redelivered_resume_asks_too(
    cluster: Cluster, tmp_path: Path
) -> None:
    session = unique("s")
    with services() as procs:
        victim = await _victim(cluster, procs, tmp_path, "charge")
        async with Client(cluster) as client:
            command = invoke(session, "go", agent="ledger-sequential", checkpointing=True)
            await client.send(command)
            paused = await client.result(command["command_id"], 30, alive=victim)
            assert paused["stop_reason"] == "checkpoint", paused
            go_on = checkpoint_resume(session, paused["checkpoint"])
            await client.send(go_on)
            await wait_for(lambda: _calls(cluster, session)["charge"] == 1, 30, "charge running")
            victim.kill()
            fresh = _start(cluster, "fresh", tmp_path)
            procs.append(fresh)
            asked = await client.result(go_on["command_id"], 60, alive=fresh)
            interrupt = _unknown(asked)
            answered = resume(
                session,
                [
                    {
                        "interruptResponse": {
                            "interruptId": interrupt["id"],
                            "response": {"fail": "x"},
                        }
                    }
                ],
            )
            await client.send(answered)
            after = await client.result(answered["command_id"], 60, alive=fresh)
            # The turn goes on under checkpointing: it pauses after the batch.
            assert after["stop_reason"] == "checkpoint", after
            assert after["checkpoint"]["position"] == "after_tools"
            assert await fresh.terminate() == 0
            await client.caught_up()
    assert _calls(cluster, session) == Counter({"charge": 1, "fetch": 1})
