"""A stand-in for the CLI's results reader: hands out what a fake broker queued for it."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Protocol

from service.client.kafka_io import Seen


class Queued(Protocol):
    _unread: list[Seen]


class FakeReader:
    def __init__(self, kafka: Queued) -> None:
        self._kafka = kafka

    async def __aenter__(self) -> FakeReader:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    async def poll(self) -> list[Seen]:
        batch, self._kafka._unread = self._kafka._unread, []
        if not batch:
            await asyncio.sleep(0.01)  # as a real poll waits, so a timeout can fire
        return batch

    async def scan(self) -> list[Seen]:
        return []
