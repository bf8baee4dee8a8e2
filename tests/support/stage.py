"""A shared stage for runtime tests: one real service process, its topics and an upstream client.

Waits poll conditions with deadlines; nothing here sleeps in place of a condition.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.runtime_harness import (
    Client,
    Cluster,
    ServiceProcess,
    cancel,
    services,
    wait_for,
)


@dataclass
class Stage:
    """One service process with its topics; the client reads results, events and dead letters."""

    cluster: Cluster
    service: ServiceProcess
    client: Client

    async def cancel(self, session_id: str, **fields: Any) -> str:
        body = cancel(session_id, **fields)
        await self.client.send(body, topic=self.cluster.topics.control)
        return str(body["command_id"])

    async def result(self, command_id: str, timeout: float = 30.0) -> dict[str, Any]:
        return await self.client.result(command_id, timeout, alive=self.service)

    def events(self, session_id: str, kind: str) -> list[dict[str, Any]]:
        return [
            e for e in self.client.events if e["session_id"] == session_id and e["type"] == kind
        ]

    async def tool_running(self, session_id: str, timeout: float = 30.0) -> None:
        """Wait until a tool of the session has started (its call is logged as it begins)."""
        await wait_for(
            lambda: any(
                c["session_id"] == session_id and "outcome" not in c
                for c in self.cluster.tool_calls()
            ),
            timeout,
            f"a tool of {session_id} running",
            alive=self.service,
        )

    def model_calls(self, session_id: str) -> list[dict[str, Any]]:
        return [
            m
            for m in self.cluster.model_calls()
            if m["session_id"] == session_id and "complete" not in m
        ]

    def tool_outcomes(self, session_id: str) -> list[str]:
        return [
            c["outcome"]
            for c in self.cluster.tool_calls()
            if c["session_id"] == session_id and "outcome" in c
        ]

    async def exactly_once(self, *command_ids: str) -> None:
        await self.client.caught_up()
        for command_id in command_ids:
            assert len(self.client.results_for(command_id)) == 1, command_id


@contextlib.asynccontextmanager
async def staged(
    bootstrap: str, workdir: Path, partitions: int = 2, **env: str
) -> AsyncIterator[Stage]:
    """Fresh topics, one service process with the cancel test agents, and a client."""
    cluster = Cluster(bootstrap, workdir, partitions=partitions)
    await cluster.create_topics()
    try:
        with services() as procs:
            proc = cluster.start(CAIRN_AGENTS="tests.support.cancel_agents:registry", **env)
            procs.append(proc)
            await proc.wait_ready()
            async with Client(cluster) as client:
                yield Stage(cluster, proc, client)
            assert proc.alive, proc.text()[-3000:]
    finally:
        await cluster.delete_topics()
