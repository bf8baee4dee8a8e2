"""Writes records that aiokafka's consumer cannot read: a header key that is not UTF-8.

Kafka's header keys are byte strings on the wire, and clients such as franz-go or sarama write
any. aiokafka's producer encodes a key with ``str.encode``, so its pure-Python record builder
(``AIOKAFKA_NO_EXTENSIONS=1``, set before aiokafka is imported: hence a process of its own)
writes whatever bytes a ``str`` subclass's ``encode`` returns.

Run as ``python -m tests.support.unreadable_writer SPEC``: SPEC is JSON with ``bootstrap``,
``topic``, ``partition`` and ``groups``, a list of lists of records (``{"key", "value",
"unreadable"}``, strings and a bool); each group is sent as one batch, in one transaction of its
own when ``transactional`` is set. It prints the records' offsets as a JSON list.
:func:`write` runs it from a test.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import orjson

BAD_HEADER_KEY = b"\xff\xfebad-key"


class BadKey(str):
    """A header key whose bytes are :data:`BAD_HEADER_KEY` for aiokafka's pure-Python builder."""

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return BAD_HEADER_KEY


async def write(
    bootstrap: str,
    topic: str,
    partition: int,
    groups: list[list[dict[str, Any]]],
    *,
    transactional: bool = False,
) -> list[int]:
    """Write ``groups`` (see the module) from a process of its own; their offsets, in order."""
    spec = {
        "bootstrap": bootstrap,
        "topic": topic,
        "partition": partition,
        "groups": groups,
        "transactional": transactional,
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.unreadable_writer",
        orjson.dumps(spec).decode(),
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "AIOKAFKA_NO_EXTENSIONS": "1"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    offsets: list[int] = orjson.loads(out)
    return offsets


async def _main(spec: dict[str, Any]) -> list[int]:
    from aiokafka import AIOKafkaProducer
    from aiokafka.util import NO_EXTENSIONS

    assert NO_EXTENSIONS, "the C record builder encodes header keys itself"
    transactional = bool(spec.get("transactional"))
    producer = AIOKafkaProducer(
        bootstrap_servers=spec["bootstrap"],
        transactional_id=f"unreadable-writer-{os.getpid()}" if transactional else None,
        enable_idempotence=True,
        linger_ms=50,
    )
    await producer.start()
    offsets: list[int] = []
    try:
        for group in spec["groups"]:
            if transactional:
                await producer.begin_transaction()
            sent = [
                await producer.send(
                    spec["topic"],
                    key=record["key"].encode(),
                    value=record["value"].encode(),
                    partition=spec["partition"],
                    headers=[(BadKey("k") if record.get("unreadable") else "ok", b"v")],
                )
                for record in group
            ]
            if transactional:
                await producer.commit_transaction()
            offsets.extend([(await future).offset for future in sent])
    finally:
        await producer.stop()
    return offsets


if __name__ == "__main__":
    print(orjson.dumps(asyncio.run(_main(orjson.loads(sys.argv[1])))).decode())
