"""Construction of every aiokafka client from the settings: one place for connection options.

Guarantees that consumers, producers and admin clients all get the same security options and
that the runtime's consumers read only committed data.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.helpers import create_ssl_context
from aiokafka.producer import sender as _sender

from service.settings import KafkaSettings


def connection_options(kafka: KafkaSettings) -> dict[str, Any]:
    """Keyword arguments shared by every aiokafka client (bootstrap, SASL, SSL)."""
    options: dict[str, Any] = {
        "bootstrap_servers": kafka.bootstrap_servers,
        "security_protocol": kafka.security_protocol,
        "request_timeout_ms": kafka.request_timeout_ms,
    }
    if kafka.sasl_mechanism is not None:
        options["sasl_mechanism"] = kafka.sasl_mechanism
        options["sasl_plain_username"] = kafka.sasl_username
        if kafka.sasl_password is not None:
            options["sasl_plain_password"] = kafka.sasl_password.get_secret_value()
    if kafka.security_protocol in ("SSL", "SASL_SSL"):
        options["ssl_context"] = create_ssl_context(
            cafile=kafka.ssl_cafile,
            certfile=kafka.ssl_certfile,
            keyfile=kafka.ssl_keyfile,
        )
    return options


Client = TypeVar("Client", AIOKafkaConsumer, AIOKafkaProducer)


async def started(client: Client) -> Client:
    """``client`` once its start succeeded; a client whose start failed is stopped before the
    error goes on. aiokafka reports a consumer or producer collected unstopped as an ERROR
    (``Unclosed AIOKafkaConsumer``), and while the broker is away every retried start (a
    partition owner's restore, every few seconds) would leave one."""
    try:
        await client.start()
    except BaseException:
        with contextlib.suppress(Exception):
            await client.stop()
        raise
    return client


async def stop_consumer(consumer: AIOKafkaConsumer) -> None:
    """``consumer.stop()``, carried to its end when aiokafka lets a fetch's cancellation out.

    aiokafka 0.14.0: a fetch that failed (the broker unreachable) waits out its retry backoff
    inside its error handler, where the cancellation ``stop()`` sends it is not caught; the
    fetcher's close then raises that ``CancelledError`` at whoever stopped the consumer, with the
    rest of the fetcher's tasks and the client's connections left behind. So a drain or a
    SIGTERM while the broker was away ended the process with status 1 and a traceback."""
    try:
        await consumer.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the caller itself is cancelled
        fetcher = consumer._fetcher
        for pending in list(fetcher._pending_tasks) if fetcher is not None else ():
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pending
        await consumer._client.close()


_NEXT_TXN_BACKOFF_S = 0.005
"""Wait before retrying the first ``AddPartitionsToTxn`` of a transaction answered with
CONCURRENT_TRANSACTIONS (the previous commit's markers are still being written, usually for a
millisecond or two). aiokafka hard-codes 20 ms for this case, which an idle partition that
commits again at once paid on about one commit in five."""


def transactional_producer(
    kafka: KafkaSettings, transactional_id: str, *, transaction_timeout_ms: int
) -> AIOKafkaProducer:
    if hasattr(_sender, "BACKOFF_OVERRIDE"):
        _sender.BACKOFF_OVERRIDE = _NEXT_TXN_BACKOFF_S
    return AIOKafkaProducer(
        **connection_options(kafka),
        client_id=f"{kafka.client_id}-{transactional_id}",
        transactional_id=transactional_id,
        transaction_timeout_ms=transaction_timeout_ms,
        linger_ms=0,
        # The broker answers CONCURRENT_TRANSACTIONS while the previous commit's markers are
        # being written; the default 100 ms backoff would add that to most commits.
        retry_backoff_ms=10,
        max_batch_size=256 * 1024,
        max_request_size=4 * 1024 * 1024,
    )


def plain_producer(kafka: KafkaSettings) -> AIOKafkaProducer:
    return AIOKafkaProducer(**connection_options(kafka), client_id=kafka.client_id, acks="all")


def reader(kafka: KafkaSettings, **extra: Any) -> AIOKafkaConsumer:
    """A group-less consumer reading committed data only unless ``extra`` says otherwise
    (restore, tools, tests)."""
    options: dict[str, Any] = {
        "client_id": f"{kafka.client_id}-reader",
        "group_id": None,
        "enable_auto_commit": False,
        "isolation_level": "read_committed",
        "auto_offset_reset": "earliest",
    }
    options.update(extra)
    return AIOKafkaConsumer(**connection_options(kafka), **options)


def admin(kafka: KafkaSettings) -> AIOKafkaAdminClient:
    options = connection_options(kafka)
    return AIOKafkaAdminClient(**options, client_id=f"{kafka.client_id}-admin")
