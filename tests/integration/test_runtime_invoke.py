"""The runtime against a real broker: invoke, checkpoint pauses and resumes on different
instances, interrupts, duplicates. Every service instance is a real OS process."""

from __future__ import annotations

import base64
import os

import pytest

from tests.support.runtime_harness import (
    Client,
    Cluster,
    ServiceProcess,
    checkpoint_resume,
    committed_records,
    invoke,
    last_session_state,
    resume,
    services,
    unique,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]


async def _one_command(
    cluster: Cluster, client: Client, command: dict, procs: list[ServiceProcess]
) -> tuple[dict, ServiceProcess]:
    """A fresh instance handles exactly this command, then drains and exits cleanly."""
    proc = cluster.start()
    procs.append(proc)
    await proc.wait_ready()
    await client.send(command)
    result = await client.result(command["command_id"], alive=proc)
    assert await proc.terminate() == 0, proc.text()[-3000:]
    return result, proc


async def test_invoke_without_checkpointing_runs_to_end_turn(cluster: Cluster) -> None:
    with services() as procs:
        proc = cluster.start()
        procs.append(proc)
        await proc.wait_ready()
        async with Client(cluster) as client:
            session = unique("s")
            command = invoke(session, "go", agent="cycles")
            await client.send(command)
            result = await client.result(command["command_id"], alive=proc)
            assert result["stop_reason"] == "end_turn"
            assert result["error"] is None
            assert result["message"]["content"] == [{"text": "done turn 1"}]
            assert result["metrics"]["invocation"]["cycles"] == 3
            calls = cluster.tool_calls()
            assert [c["tool_use_id"] for c in calls] == ["t1c0", "t1c1"]
            assert {c["idempotency_key"] for c in calls} == {f"{session}:t1c0", f"{session}:t1c1"}
            kinds = [e["type"] for e in client.events if e["session_id"] == session]
            assert kinds.count("tool_started") == 2
            seqs = [e["seq"] for e in client.events if e["session_id"] == session]
            assert seqs == list(range(1, len(seqs) + 1))
        assert await proc.terminate() == 0
    assert len(client.results_for(command["command_id"])) == 1


async def test_checkpointing_pauses_at_every_boundary_and_resumes_on_another_instance(
    cluster: Cluster,
) -> None:
    session = unique("s")
    expected = [
        ("checkpoint", "after_model", 0),
        ("checkpoint", "after_tools", 0),
        ("checkpoint", "after_model", 1),
        ("checkpoint", "after_tools", 1),
        ("end_turn", None, None),
    ]
    seen: list[tuple[str, str | None, int | None]] = []
    handlers: list[int] = []
    with services() as procs:
        async with Client(cluster) as client:
            command = invoke(session, "go", agent="cycles", checkpointing=True)
            for step in range(len(expected)):
                result, proc = await _one_command(cluster, client, command, procs)
                handlers.append(proc.pid)
                checkpoint = result["checkpoint"]
                seen.append(
                    (
                        result["stop_reason"],
                        checkpoint["position"] if checkpoint else None,
                        checkpoint["cycle_index"] if checkpoint else None,
                    )
                )
                if step < len(expected) - 1:
                    assert checkpoint is not None, result
                    command = checkpoint_resume(session, checkpoint)
    assert seen == expected
    assert len(set(handlers)) == len(expected)
    calls = cluster.tool_calls()
    assert [c["tool_use_id"] for c in calls] == ["t1c0", "t1c1"]
    # Tools ran only in the invocations resumed from after_model (the 2nd and the 4th).
    assert [c["pid"] for c in calls] == [handlers[1], handlers[3]]
    # Each model call happened once: after_model pauses are never re-asked.
    assert [m["index"] for m in cluster.model_calls()] == [0, 1, 2]


async def test_interrupt_raised_and_answered_on_another_instance(cluster: Cluster) -> None:
    session = unique("s")
    with services() as procs:
        async with Client(cluster) as client:
            first, _ = await _one_command(
                cluster, client, invoke(session, "go", agent="approval"), procs
            )
            assert first["stop_reason"] == "interrupt"
            assert first["checkpoint"] is None
            [interrupt] = first["interrupts"]
            assert interrupt["name"] == "approval"
            assert interrupt["reason"] == {"step": 0}
            answer = resume(
                session,
                [{"interruptResponse": {"interruptId": interrupt["id"], "response": "yes"}}],
            )
            second, _ = await _one_command(cluster, client, answer, procs)
    assert second["stop_reason"] == "end_turn", second
    assert second["message"]["content"] == [{"text": "done turn 1"}]
    calls = cluster.tool_calls()
    assert [c["tool"] for c in calls] == ["approve", "approve"]
    assert len({c["idempotency_key"] for c in calls}) == 1


async def test_duplicate_command_id_is_answered_once_also_across_a_restart(
    cluster: Cluster,
) -> None:
    session = unique("s")
    duplicate = invoke(session, "go", agent="simple")
    with services() as procs:
        async with Client(cluster) as client:
            proc = cluster.start()
            procs.append(proc)
            await proc.wait_ready()
            marker = invoke(session, "after", agent="simple")
            await client.send(duplicate, duplicate, marker)
            await client.result(marker["command_id"], alive=proc)
            assert await proc.terminate() == 0

            restarted = cluster.start()
            procs.append(restarted)
            await restarted.wait_ready()
            marker2 = invoke(session, "after restart", agent="simple")
            await client.send(duplicate, marker2)
            await client.result(marker2["command_id"], alive=restarted)
            # A duplicate of a failed (rejected) command is not answered twice either.
            bad = invoke(session, "x", agent="no-such-agent")
            marker3 = invoke(session, "last", agent="simple")
            await client.send(bad, bad, marker3)
            await client.result(marker3["command_id"], alive=restarted)
            assert await restarted.terminate() == 0
    assert len(client.results_for(duplicate["command_id"])) == 1
    [rejected] = client.results_for(bad["command_id"])
    assert rejected["stop_reason"] == "error"
    assert rejected["error"]["code"] == "unknown_agent"
    order = [r["command_id"] for r in client.session_results(session)]
    assert order == [
        duplicate["command_id"],
        marker["command_id"],
        marker2["command_id"],
        bad["command_id"],
        marker3["command_id"],
    ]


async def test_invalid_command_gets_an_error_result_and_garbage_goes_to_the_dlq(
    cluster: Cluster,
) -> None:
    session = unique("s")
    with services() as procs:
        proc = cluster.start()
        procs.append(proc)
        await proc.wait_ready()
        async with Client(cluster) as client:
            invalid = invoke(session, "go", agent="simple", checkpointing="maybe")
            await client.send(invalid)
            await client.send_raw(b"k", b"\x00not json")
            after = invoke(session, "fine", agent="simple")
            await client.send(after)
            await client.result(after["command_id"], alive=proc)
            [error] = client.results_for(invalid["command_id"])
            assert error["stop_reason"] == "error"
            assert error["error"]["code"] == "invalid_command"
            await wait_for(lambda: len(client.dead_letters) == 1, 20, "dlq record")
            [dead] = client.dead_letters
            assert (dead["key"], dead["value"]) == (b"k", b"\x00not json")
            assert dead["headers"]["cairn.dlq.source.topic"] == cluster.topics.commands.encode()
        assert await proc.terminate() == 0


async def test_messages_larger_than_a_record_are_split_and_read_back(cluster: Cluster) -> None:
    """With a record limit of 4,000 bytes each prompt spans several history records; a new
    process, restoring the session from the topic alone, continues the conversation."""
    session = unique("s")
    # Random text does not compress.
    prompts = [base64.b64encode(os.urandom(2_400)).decode() for _ in range(2)]
    with services() as procs:
        proc = cluster.start(CAIRN_RUNTIME__STATE_RECORD_MAX_BYTES="4000")
        procs.append(proc)
        await proc.wait_ready()
        async with Client(cluster) as client:
            commands = [invoke(session, prompt, agent="simple") for prompt in prompts]
            await client.send(*commands)
            for command in commands:
                result = await client.result(command["command_id"], alive=proc)
                assert result["stop_reason"] == "end_turn", result
        assert await proc.terminate() == 0
        state, _ = await last_session_state(cluster, session)
        assert [m["content"][0]["text"] for m in state.messages[::2]] == prompts
        proc = cluster.start(CAIRN_RUNTIME__STATE_RECORD_MAX_BYTES="4000")
        procs.append(proc)
        await proc.wait_ready()
        async with Client(cluster) as client:
            after = invoke(session, "hi", agent="simple")
            await client.send(after)
            result = await client.result(after["command_id"], alive=proc)
        assert await proc.terminate() == 0
    assert result["message"]["content"] == [{"text": "done turn 3"}]
    records = await committed_records(cluster.bootstrap, cluster.topics.sessions, 4)
    assert max(len(r.value or b"") for r in records) <= 4000
    assert sum(1 for r in records if b"\x00m0000000000." in r.key) >= 2


async def test_the_in_flight_bound_pauses_fetching_and_loses_nothing(cluster: Cluster) -> None:
    sessions = [unique("s") for _ in range(24)]
    commands = [invoke(s, "go", agent="slowtools") for s in sessions]
    with services() as procs:
        proc = cluster.start(
            CAIRN_RUNTIME__MAX_IN_FLIGHT="4",
            CAIRN_RUNTIME__FETCH_MAX_RECORDS="1",
            CAIRN_TEST_TOOL_SLEEP="0.2",
        )
        procs.append(proc)
        await proc.wait_ready()
        async with Client(cluster) as client:
            await client.send(*commands)
            await client.wait_results(len(commands), timeout=90, alive=proc)
        assert await proc.terminate() == 0
    assert "in-flight bound reached, fetching paused" in proc.text()
    assert sorted(r["command_id"] for r in client.results) == sorted(
        c["command_id"] for c in commands
    )
    # Tools of at most 4 sessions (the bound) ever ran at the same time, and several did.
    edges = sorted(
        [(c["time"], 1) for c in cluster.tool_calls()]
        + [(c["time"] + 0.2, -1) for c in cluster.tool_calls()]
    )
    running, most = 0, 0
    for _, change in edges:
        running += change
        most = max(most, running)
    assert 2 <= most <= 4
