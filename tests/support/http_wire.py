"""A local HTTP/1.1 server that plays scripted provider responses (SSE or JSON) to the SDKs.

It records every request body and notices when a client closes a connection while a response
is still streaming, so tests can assert that a cancel really closed the HTTP stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Reply:
    """One scripted response.

    ``events`` are stream frames (SSE, or AWS event-stream messages with ``content_type`` set to
    theirs) sent with chunked encoding; ``drop_after`` closes the socket after
    that many frames without ending the body; ``hang_after`` sends that many frames and then
    waits for the client to go away.
    """

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    json_body: Any = None
    events: list[bytes] = field(default_factory=list)
    drop_after: int | None = None
    hang_after: int | None = None
    event_delay_s: float = 0.0
    content_type: str = "text/event-stream; charset=utf-8"


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


class WireServer:
    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Seen] = []
        self.closed_mid_stream = asyncio.Event()
        self.hanging = asyncio.Event()
        self.unexpected: list[str] = []
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    def script(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    async def start(self, port: int = 0) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", port)

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(writer)
        try:
            while await self._serve_one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._handlers.discard(task)
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
        self.requests.append(Seen(method, path, headers, json.loads(raw) if raw else None))
        if not self.replies:
            self.unexpected.append(f"{method} {path}")
            reply = Reply(status=500, json_body={"error": {"message": "script exhausted"}})
        else:
            reply = self.replies.popleft()
        if not reply.events:
            return await self._send_json(writer, reply)
        return await self._send_stream(reader, writer, reply)

    async def _send_json(self, writer: asyncio.StreamWriter, reply: Reply) -> bool:
        body = json.dumps(reply.json_body).encode()
        head = [
            f"HTTP/1.1 {reply.status} X",
            "content-type: application/json",
            f"content-length: {len(body)}",
            *(f"{k}: {v}" for k, v in reply.headers.items()),
        ]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await writer.drain()
        return True

    async def _send_stream(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reply: Reply
    ) -> bool:
        head = [
            f"HTTP/1.1 {reply.status} OK",
            f"content-type: {reply.content_type}",
            "transfer-encoding: chunked",
            "cache-control: no-cache",
            *(f"{k}: {v}" for k, v in reply.headers.items()),
        ]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        for sent, frame in enumerate(reply.events):
            if reply.drop_after is not None and sent == reply.drop_after:
                await writer.drain()
                writer.transport.abort()
                return False
            if reply.hang_after is not None and sent == reply.hang_after:
                await writer.drain()
                self.hanging.set()
                if await reader.read(1) == b"":
                    self.closed_mid_stream.set()
                return False
            writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))
            await writer.drain()
            if reply.event_delay_s:
                await asyncio.sleep(reply.event_delay_s)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


def sse(data: Any, event: str | None = None) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    prefix = f"event: {event}\n" if event else ""
    return f"{prefix}data: {payload}\n\n".encode()
