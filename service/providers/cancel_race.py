"""Reads an SDK stream chunk by chunk while watching the invocation's cancel signal.

Guarantee: an immediate cancel is honoured while waiting for the next chunk (not only between
chunks), and the pending read is cancelled so the SDK closes its HTTP response; a deferred cancel
lets the stream run on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from typing import TypeVar, cast

from service.agent.cancel import CancelSignal

T = TypeVar("T")

_END = object()


async def _next(source: AsyncIterator[T]) -> object:
    try:
        return await anext(source)
    except StopAsyncIteration:
        return _END


async def until_cancelled(
    source: AsyncIterator[T], cancel: CancelSignal
) -> AsyncGenerator[T, None]:
    """Yield ``source``'s items; stop early (without raising) once ``cancel`` is immediate.

    The caller tells an early stop from the end of the stream by checking ``cancel.immediate``.
    """
    waiter: asyncio.Future[None] | None = None
    try:
        while not cancel.immediate:
            step = asyncio.ensure_future(_next(source))
            try:
                if not cancel.is_set:
                    if waiter is None:
                        waiter = asyncio.ensure_future(cancel.wait())
                    await asyncio.wait((step, waiter), return_when=asyncio.FIRST_COMPLETED)
                if not step.done() and cancel.immediate:
                    return
                item = await step
            finally:
                if not step.done():
                    step.cancel()
                    await asyncio.wait((step,))
            if item is _END:
                return
            yield cast(T, item)
    finally:
        if waiter is not None:
            waiter.cancel()


async def unless_cancelled(awaitable: Awaitable[T], cancel: CancelSignal) -> T | None:
    """Await ``awaitable``; on an immediate cancel abandon it (cancelling it) and return None."""
    task = asyncio.ensure_future(awaitable)
    waiter: asyncio.Future[None] | None = None
    try:
        if not cancel.is_set:
            waiter = asyncio.ensure_future(cancel.wait())
            await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and cancel.immediate:
            return None
        return await task
    finally:
        if waiter is not None:
            waiter.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait((task,))
