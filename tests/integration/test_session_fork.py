"""Versions, history and fork against a real broker: a fork at an after_model pause resumed on
another instance ends as the source resumed there does; the source's later steps are its own;
history lists every committed version. Every service instance is a real OS process."""

from __future__ import annotations

from typing import Any

import pytest

from service.client.kafka_io import partition_for
from tests.support.runtime_harness import (
    Client,
    Cluster,
    ServiceProcess,
    cancel,
    checkpoint_resume,
    invoke,
    last_session_state,
    last_stored_session,
    services,
    unique,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]


def history(session_id: str, *, limit: int = 100, before: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": "history",
        "command_id": unique("h"),
        "session_id": session_id,
        "limit": limit,
    }
    if before is not None:
        body["before"] = before
    return body


def fork(source: str, version: int, target: str) -> dict[str, Any]:
    return {
        "type": "fork",
        "command_id": unique("f"),
        "session_id": target,
        "source_session_id": source,
        "version": version,
    }


def _shape(result: dict[str, Any]) -> tuple[Any, ...]:
    """What a result says about the conversation, without its ids."""
    return (result["stop_reason"], result["checkpoint"], result["message"], result["interrupts"])


async def _ask(client: Client, command: dict[str, Any], proc: ServiceProcess) -> dict[str, Any]:
    await client.send(command)
    return await client.result(command["command_id"], alive=proc)


async def _run_to_end(
    client: Client, session: str, result: dict[str, Any], proc: ServiceProcess
) -> list[dict[str, Any]]:
    """Resume ``session`` from each pause until its turn ends; the results, in order."""
    results = [result]
    while result["stop_reason"] == "checkpoint":
        result = await _ask(client, checkpoint_resume(session, result["checkpoint"]), proc)
        results.append(result)
    assert result["stop_reason"] == "end_turn", result
    return results


async def test_a_fork_at_an_after_model_pause_resumes_on_another_instance_like_its_source(
    cluster: Cluster,
) -> None:
    source = unique("src")
    target = unique("fork")
    while partition_for(target, cluster.partitions) == partition_for(source, cluster.partitions):
        target = unique("fork")  # the fork's partition is not its source's
    with services() as procs:
        async with Client(cluster) as client:
            first = cluster.start()
            procs.append(first)
            await first.wait_ready()
            paused = await _ask(client, invoke(source, "go", checkpointing=True), first)
            assert paused["checkpoint"]["position"] == "after_model"
            assert paused["version"] == 1
            fork_command = fork(source, 1, target)
            forked = await _ask(client, fork_command, first)
            assert forked["forked_from"] == {"session_id": source, "version": 1}
            assert forked["version"] == 1
            assert forked["stop_reason"] == "checkpoint"
            assert forked["checkpoint"] == paused["checkpoint"]
            assert await first.terminate() == 0, first.text()[-3000:]

            second = cluster.start()
            procs.append(second)
            await second.wait_ready()
            # The fork first, on the new instance: the source is still at its pause.
            fork_results = await _run_to_end(client, target, forked, second)
            source_results = await _run_to_end(client, source, paused, second)
            # Forking a session into an existing one, or from a version not there, is refused.
            again = await _ask(client, fork(source, 2, target), second)
            assert again["error"]["code"] == "session_exists"
            missing = await _ask(client, fork(source, 99, unique("fork")), second)
            assert missing["error"]["code"] == "version_unavailable"
            listed = await _ask(client, history(source), second)
            fork_listed = await _ask(client, history(target), second)
            paged = await _ask(client, history(source, limit=2), second)
            older = await _ask(
                client, history(source, limit=2, before=paged["history"]["next_before"]), second
            )
            assert await second.terminate() == 0, second.text()[-3000:]
        events = list(client.events)

    # Same outcome from the same point.
    assert [_shape(r) for r in fork_results[1:]] == [_shape(r) for r in source_results[1:]]
    fork_state, _ = await last_session_state(cluster, target)
    source_stored = await last_stored_session(cluster, source)
    assert fork_state.messages == source_stored.state.messages
    # The source never saw the fork (it was answered on the fork's partition).
    assert not source_stored.delivery.answered(fork_command["command_id"])
    assert len(source_results) == 5  # after_model, after_tools twice each, then end_turn

    # The source's versions are its own five steps, in order, each carried by its result.
    versions = listed["history"]["versions"]
    assert [v["version"] for v in versions] == [5, 4, 3, 2, 1]
    assert [r["version"] for r in source_results] == [1, 2, 3, 4, 5]
    assert [v["command_id"] for v in reversed(versions)] == [
        r["command_id"] for r in source_results
    ]
    assert [v.get("position") for v in reversed(versions)] == [
        r["checkpoint"]["position"] if r["checkpoint"] else None for r in source_results
    ]
    assert [v["stop_reason"] for v in reversed(versions)] == [
        r["stop_reason"] for r in source_results
    ]
    assert all("forked_from" not in v for v in versions)
    assert listed["history"]["next_before"] is None
    assert listed["history"]["oldest_kept"] == 1
    assert listed["version"] == 5
    # Paged: the newest two, then the two before them.
    assert [v["version"] for v in paged["history"]["versions"]] == [5, 4]
    assert [v["version"] for v in older["history"]["versions"]] == [3, 2]
    assert older["history"]["next_before"] == 2

    # The fork's versions: where it came from, then its own four steps.
    fork_versions = list(reversed(fork_listed["history"]["versions"]))
    assert [v["version"] for v in fork_versions] == [1, 2, 3, 4, 5]
    assert fork_versions[0]["forked_from"] == {"session_id": source, "version": 1}
    assert [r["version"] for r in fork_results] == [1, 2, 3, 4, 5]

    # Every event carries the version of the step it belongs to, the one its result commits.
    by_command = {r["command_id"]: r["version"] for r in source_results}
    source_events = [e for e in events if e["session_id"] == source]
    assert source_events
    assert all(e["version"] == by_command[e["command_id"]] for e in source_events)


async def test_histories_and_refused_forks_published_twice_are_answered_once(
    cluster: Cluster,
) -> None:
    """Their command ids are remembered as any command's: a history of a session with state or a
    refused fork published again is not answered again, and a cancel naming an answered history
    leaves it alone."""
    session, unknown, target = unique("s"), unique("u"), unique("t")
    with services() as procs:
        proc = cluster.start()
        procs.append(proc)
        await proc.wait_ready()
        async with Client(cluster) as client:
            await _ask(client, invoke(session, "hi", agent="simple"), proc)
            listed, nothing, refused = history(session), history(unknown), fork(session, 99, target)
            for command in (listed, nothing, refused):
                await client.send(command, command)
            late = cancel(session, target_command_id=listed["command_id"])
            await client.send(late, topic=cluster.topics.control)
            answer = await client.result(late["command_id"], alive=proc)
            assert answer["cancel"] == {"stopped": None, "skipped": [], "resolved": None}
            # Each session's commands are answered in order: these come after the repeats.
            for then in (history(session), history(unknown), history(target)):
                await _ask(client, then, proc)
            assert refused_code(client.results_for(refused["command_id"])) == [
                "version_unavailable"
            ]
            (only,) = client.results_for(listed["command_id"])
            assert only["stop_reason"] == "end_turn" and "history" in only
            # A session without state stays without (a read makes none): each one is answered.
            pages = client.results_for(nothing["command_id"])
            assert [page["history"]["versions"] for page in pages] == [[], []]
        assert await proc.terminate() == 0


def refused_code(results: list[dict[str, Any]]) -> list[str]:
    return [result["error"]["code"] for result in results]
