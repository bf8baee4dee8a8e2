"""The operator endpoint answers real HTTP requests on a loopback port."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.observability.http import HealthServer
from service.observability.metrics import Metrics
from service.observability.readiness import RestoreTracker


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


async def _get(port: int, path: str) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as client, client.get(f"http://127.0.0.1:{port}{path}") as r:
        return r.status, r.headers.get("Content-Type", ""), await r.text()


async def test_readyz_follows_restore_of_every_assigned_partition() -> None:
    metrics = Metrics()
    tracker = RestoreTracker(metrics)
    server = HealthServer(metrics, readiness=tracker, detail=tracker.describe, port=0)
    async with server:
        status, _, body = await _get(server.port, "/readyz")
        assert status == 503, body
        assert '"joined":false' in body

        tracker.assigned([0, 1])
        assert (await _get(server.port, "/readyz"))[0] == 503
        tracker.restored(0)
        status, _, body = await _get(server.port, "/readyz")
        assert status == 503
        assert '"restoring":["1"]' in body
        tracker.restored(1)
        status, _, body = await _get(server.port, "/readyz")
        assert status == 200, body
        assert '"status":"ready"' in body

        tracker.assigned([2])
        assert (await _get(server.port, "/readyz"))[0] == 503
        tracker.revoked([2])
        assert (await _get(server.port, "/readyz"))[0] == 200
        tracker.stopping()
        assert (await _get(server.port, "/readyz"))[0] == 503

    samples = _samples(metrics.render().decode())
    assert samples[("cairn_restore_seconds_count", ())] == 2
    assert samples[("cairn_rebalances_total", (("kind", "assigned"),))] == 2
    assert samples[("cairn_rebalances_total", (("kind", "revoked"),))] == 1
    assert samples[("cairn_assigned_partitions", ())] == 2


async def test_only_changes_of_the_partitions_are_counted_as_rebalances() -> None:
    """A start revokes nothing before its first assignment; a member beyond the partition count
    is given nothing: neither changes what the instance holds."""
    metrics = Metrics()
    tracker = RestoreTracker(metrics)
    tracker.revoked([])
    tracker.assigned([])
    tracker.revoked([], lost=True)
    samples = _samples(metrics.render().decode())
    assert not any(name == "cairn_rebalances_total" for name, _ in samples)
    tracker.assigned([0])
    tracker.revoked([0], lost=True)
    samples = _samples(metrics.render().decode())
    assert samples[("cairn_rebalances_total", (("kind", "assigned"),))] == 1
    assert samples[("cairn_rebalances_total", (("kind", "lost"),))] == 1


async def test_empty_assignment_after_join_is_ready() -> None:
    tracker = RestoreTracker()
    assert not tracker()
    tracker.assigned([])
    assert tracker()


async def test_a_rebalance_is_not_ready_until_its_partitions_are_given_and_restored() -> None:
    tracker = RestoreTracker()
    tracker.assigned([0, 1])
    tracker.restored(0)
    tracker.restored(1)
    assert tracker()
    # An eager rebalance takes every partition back before the group hands out new ones.
    tracker.revoked([0, 1])
    tracker.rebalancing()
    assert not tracker()
    assert tracker.describe() == {
        "joined": True,
        "rebalancing": True,
        "stopping": False,
        "assigned": [],
        "restoring": [],
    }
    tracker.assigned([1])
    assert not tracker()
    tracker.restored(1)
    assert tracker()
    # A rebalance that leaves the instance nothing still ends in ready: more members than
    # partitions.
    tracker.revoked([1])
    tracker.rebalancing()
    tracker.assigned([])
    assert tracker()
    assert tracker.describe()["rebalancing"] is False


async def test_an_instance_that_left_its_group_says_so() -> None:
    metrics = Metrics()
    tracker = RestoreTracker(metrics)
    tracker.assigned([0, 1])
    tracker.restored(0)
    tracker.stopping()
    tracker.left()
    assert not tracker()
    assert tracker.describe() == {
        "joined": False,
        "rebalancing": False,
        "stopping": True,
        "assigned": [],
        "restoring": [],
    }
    samples = _samples(metrics.render().decode())
    assert samples[("cairn_assigned_partitions", ())] == 0


async def test_livez_reports_a_stalled_loop_and_a_broken_check_as_unavailable() -> None:
    alive = {"value": True}

    def broken() -> bool:
        raise RuntimeError("boom")

    server = HealthServer(Metrics(), readiness=broken, liveness=lambda: alive["value"], port=0)
    async with server:
        assert (await _get(server.port, "/livez"))[0] == 200
        alive["value"] = False
        status, _, body = await _get(server.port, "/livez")
        assert status == 503
        assert "stalled" in body
        assert (await _get(server.port, "/readyz"))[0] == 503


async def test_metrics_endpoint_serves_prometheus_text_that_moves() -> None:
    metrics = Metrics()
    server = HealthServer(metrics, readiness=lambda: True, port=0)
    async with server:
        metrics.command("invoke", "ok")
        metrics.command("invoke", "ok")
        metrics.command("resume", "error")
        metrics.command("made-up-type", "ok")
        metrics.result("end_turn")
        metrics.result("error", error_code="unknown_agent")
        metrics.dlq("undecodable")
        metrics.cancel("running")
        metrics.observe_step(0.2)
        with metrics.time_commit():
            pass
        status, content_type, text = await _get(server.port, "/metrics")
        assert status == 200
        assert content_type.startswith("text/plain")
        samples = _samples(text)
        commands = "cairn_commands_total"
        assert samples[(commands, (("outcome", "ok"), ("type", "invoke")))] == 2
        assert samples[(commands, (("outcome", "error"), ("type", "resume")))] == 1
        assert samples[(commands, (("outcome", "ok"), ("type", "other")))] == 1
        assert samples[("cairn_results_total", (("stop_reason", "end_turn"),))] == 1
        assert samples[("cairn_results_total", (("stop_reason", "error"),))] == 1
        assert samples[("cairn_result_errors_total", (("code", "unknown_agent"),))] == 1
        assert samples[("cairn_dlq_records_total", (("reason", "undecodable"),))] == 1
        assert samples[("cairn_cancels_total", (("outcome", "running"),))] == 1
        assert samples[("cairn_step_seconds_count", ())] == 1
        assert samples[("cairn_step_seconds_bucket", (("le", "0.25"),))] == 1
        assert samples[("cairn_step_seconds_bucket", (("le", "0.1"),))] == 0
        assert samples[("cairn_commit_seconds_count", ())] == 1


async def test_inflight_gauge_drops_back_when_the_body_raises() -> None:
    metrics = Metrics()

    def inflight() -> float:
        return _samples(metrics.render().decode())[("cairn_inflight_invocations", ())]

    with metrics.inflight():
        assert inflight() == 1
        with pytest.raises(ValueError), metrics.inflight():
            assert inflight() == 2
            raise ValueError
    assert inflight() == 0


async def test_drain_route_awaits_the_drain_callable() -> None:
    drained = asyncio.Event()

    async def drain() -> None:
        drained.set()

    server = HealthServer(Metrics(), readiness=lambda: True, drain=drain, port=0)
    async with server:
        status, _, body = await _get(server.port, "/drain")
        assert status == 200
        assert "drained" in body
        assert drained.is_set()


async def test_drain_is_taken_by_get_and_post_only() -> None:
    drains: list[str] = []

    async def drain() -> None:
        drains.append("drained")

    server = HealthServer(Metrics(), readiness=lambda: True, drain=drain, port=0)
    async with server, aiohttp.ClientSession() as client:
        url = f"http://127.0.0.1:{server.port}/drain"
        for method in ("HEAD", "PUT", "DELETE", "OPTIONS"):
            async with client.request(method, url) as response:
                assert response.status == 405, method
        assert drains == []
        async with client.post(url) as response:
            assert response.status == 200
        assert drains == ["drained"]


async def test_serve_task_closes_the_socket_when_cancelled() -> None:
    server = HealthServer(Metrics(), readiness=lambda: True, port=0)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(server.serve())
        async with asyncio.timeout(5):
            while True:
                try:
                    port = server.port
                    break
                except RuntimeError:
                    await asyncio.sleep(0.01)
        assert (await _get(port, "/livez"))[0] == 200
        task.cancel()
    with pytest.raises(aiohttp.ClientConnectionError):
        await _get(port, "/livez")


async def test_a_busy_port_fails_start_loudly() -> None:
    first = HealthServer(Metrics(), readiness=lambda: True, port=0)
    async with first:
        second = HealthServer(Metrics(), readiness=lambda: True, port=first.port)
        with pytest.raises(OSError):
            await second.start()
        with pytest.raises(RuntimeError):
            _ = second.port


async def test_operability_bundle_serves_what_the_runtime_reports() -> None:
    from service.observability.operability import Operability

    drained = asyncio.Event()

    async def drain() -> None:
        drained.set()

    ops = Operability(port=0, host="127.0.0.1", liveness_stale_after_s=0.05)
    ops.set_drain(drain)
    async with ops:
        port = ops.port
        assert port is not None
        assert (await _get(port, "/readyz"))[0] == 503
        ops.readiness.assigned(["commands-0"])
        ops.readiness.restored("commands-0")
        assert (await _get(port, "/readyz"))[0] == 200
        assert (await _get(port, "/livez"))[0] == 200
        ops.heartbeat.beat()
        loop = asyncio.get_running_loop()
        stale_at = loop.time() + 0.05
        while loop.time() < stale_at:
            await asyncio.sleep(0.01)
        assert (await _get(port, "/livez"))[0] == 503
        ops.heartbeat.beat()
        assert (await _get(port, "/livez"))[0] == 200
        ops.metrics.command("invoke", "ok")
        _, _, text = await _get(port, "/metrics")
        samples = _samples(text)
        assert samples[("cairn_commands_total", (("outcome", "ok"), ("type", "invoke")))] == 1
        # The process's own, as docs/runtime.md ("Metrics") lists them.
        assert samples[("process_resident_memory_bytes", ())] > 0
        assert samples[("process_cpu_seconds_total", ())] > 0
        assert any(name == "python_info" for name, _ in samples)
        assert any(name == "python_gc_collections_total" for name, _ in samples)
        assert (await _get(port, "/drain"))[0] == 200
        assert drained.is_set()
    assert ops.port is None
    assert not ops.readiness()
    with pytest.raises(aiohttp.ClientConnectionError):
        await _get(port, "/livez")


async def test_operability_without_a_port_listens_nowhere() -> None:
    from service.observability.operability import Operability

    async with Operability(port=None) as ops:
        assert ops.port is None
        ops.metrics.result("end_turn")
    assert b"cairn_results_total" in ops.metrics.render()
