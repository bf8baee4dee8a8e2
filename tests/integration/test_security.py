"""Cairn against an authenticated broker with ACLs, as a SCRAM user holding only the documented
ACL set.

One broker of this module's own: SASL_PLAINTEXT and SASL_SSL listeners (SCRAM-SHA-512), an SSL
listener requiring client certificates (their CN is the user), a CA and the certificates made
here, the StandardAuthorizer with ``allow.everyone.if.no.acl.found=false``.
The service's user ``cairn`` is granted exactly the ACLs of deploy/k8s/strimzi's KafkaUser (the
set docs/runtime.md lists), renamed to each test's topics and group; the test's own client is the
admin user.

Proven: over each listener, a session pauses at an interrupt on one instance, is answered on
another that restored it, a cancel and a dead letter are handled, and both instances stop cleanly;
the broker's authorizer log (every decision, allowed ones too) shows nothing of the service's
denied and each grant used, the reads of results and events by the repair of a transaction left
open, which one test provokes; another user, or no user, can neither read sessions nor write
results; wrong credentials make ``cairn serve`` say so in one line, without a traceback; no
password shows in a service's log, its ``/metrics`` or anything it publishes.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaError,
    TopicAuthorizationFailedError,
)

from service.runtime.clients import connection_options
from service.settings import GroupSettings, KafkaSettings
from tests.support.own_broker import LOCAL_KAFKA_DIR, OwnBroker, own_broker
from tests.support.runtime_harness import (
    Client,
    Cluster,
    ServiceProcess,
    health_port,
    invoke,
    resume,
    services,
    unique,
    wait_for,
)
from tests.support.secure_kafka import (
    Certificates,
    authorizations,
    documented_service_acls,
    grant,
    kafka_settings,
    make_certificates,
    scram_users,
    service_env,
)
from tests.support.txn_probe import VERIFICATION_OFF, fabricate_hanging_transaction

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.timeout(300),
    pytest.mark.asyncio(loop_scope="module"),
]

SERVICE_USER = "cairn"
OTHER_USER = "upstream"


@dataclass(frozen=True)
class Secured:
    broker: OwnBroker
    certificates: Certificates
    passwords: dict[str, str]

    def settings(
        self, user: str | None, listener: str = "sasl_plaintext", *, password: str | None = None
    ) -> KafkaSettings:
        """How ``user`` connects to a listener: SCRAM (``password``, else the user's own) on the
        SASL ones, the user's client certificate on ``ssl``."""
        given = password or (self.passwords[user] if user is not None else None)
        if listener == "ssl":
            return kafka_settings(
                self.broker.mtls_bootstrap, user, None, tls=self.certificates, protocol="SSL"
            )
        if listener == "sasl_ssl":
            return kafka_settings(self.broker.ssl_bootstrap, user, given, tls=self.certificates)
        return kafka_settings(self.broker.bootstrap, user, given)

    @property
    def admin(self) -> KafkaSettings:
        return self.settings("admin")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    if str(LOCAL_KAFKA_DIR) not in sys.path:
        sys.path.insert(0, str(LOCAL_KAFKA_DIR))
    from kafka_local_config import BrokerSecurity

    base = tmp_path_factory.mktemp("secure")
    certificates = make_certificates(base / "certs")
    passwords = scram_users("admin", "broker", SERVICE_USER, OTHER_USER)
    security = BrokerSecurity(
        ssl_port=0,
        mtls_port=0,
        keystore_pem=certificates.keystore_pem,
        truststore_pem=certificates.ca_pem,
        users=passwords,
        log_authorizations=True,
    )
    # Without verification of transactional produces a test can leave a batch open on purpose.
    with own_broker(base / "kafka", VERIFICATION_OFF, security=security) as broker:
        yield Secured(broker, certificates, passwords)


@pytest_asyncio.fixture(loop_scope="module")
async def cluster(secured: Secured, tmp_path: Path) -> AsyncIterator[Cluster]:
    """This test's topics (made by the admin) and the service user's documented ACLs on them."""
    made = Cluster(secured.broker.bootstrap, tmp_path, partitions=2, client=secured.admin)
    await made.create_topics()
    group = GroupSettings(group_id=made.group)
    await grant(secured.admin, f"User:{SERVICE_USER}", documented_service_acls(made.topics, group))
    yield made


def _service(secured: Secured, cluster: Cluster, name: str, listener: str) -> ServiceProcess:
    env = service_env(secured.settings(SERVICE_USER, listener))
    return cluster.start(name, **env)


async def _offsets_writer(options: dict[str, Any], cluster: Cluster, partition: int) -> str:
    """The transactional id the group's committed offsets of ``partition`` name."""
    admin = AIOKafkaAdminClient(**options)
    await admin.start()
    try:
        committed = await admin.list_consumer_group_offsets(cluster.group)
    finally:
        await admin.close()
    return committed[TopicPartition(cluster.topics.commands, partition)].metadata


async def _metrics(proc: ServiceProcess) -> str:
    port = await health_port(proc)
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        return await response.text()


def _leaks(secured: Secured, **outputs: str) -> list[str]:
    return [
        f"{where}: password of {user}"
        for where, text in outputs.items()
        for user, password in secured.passwords.items()
        if password in text
    ]


@pytest.mark.parametrize("listener", ["sasl_plaintext", "sasl_ssl", "ssl"])
async def test_the_service_runs_end_to_end_with_only_the_documented_acls(
    secured: Secured, cluster: Cluster, listener: str
) -> None:
    with services() as procs:
        first = _service(secured, cluster, "first", listener)
        procs.append(first)
        await first.wait_ready()
        async with Client(cluster) as client:
            # Paused at an interrupt on the first instance.
            asked = unique("s")
            ask = invoke(asked, "go", agent="approval")
            await client.send(ask)
            paused = await client.result(ask["command_id"], alive=first)
            assert paused["stop_reason"] == "interrupt", paused
            first_metrics = await _metrics(first)
            assert await first.terminate() == 0, first.text()[-3000:]

            # Answered on a second instance, which restored the session from the topic.
            second = _service(secured, cluster, "second", listener)
            procs.append(second)
            await second.wait_ready()
            answer = resume(
                asked,
                [
                    {
                        "interruptResponse": {
                            "interruptId": paused["interrupts"][0]["id"],
                            "response": True,
                        }
                    }
                ],
            )
            await client.send(answer)
            done = await client.result(answer["command_id"], alive=second)
            assert done["stop_reason"] == "end_turn", done

            # A cancel on the control topic resolves another pause.
            stopped = unique("s")
            held = invoke(stopped, "go", agent="approval")
            await client.send(held)
            assert (await client.result(held["command_id"], alive=second))[
                "stop_reason"
            ] == "interrupt"
            cancel = {
                "type": "cancel",
                "schema_version": 1,
                "command_id": unique("x"),
                "session_id": stopped,
            }
            await client.send(cancel, topic=cluster.topics.control)
            own = await client.result(cancel["command_id"], alive=second)
            assert own["stop_reason"] == "cancelled", own

            # A record no session can be read from goes to the dead-letter topic.
            key = unique("bad").encode()
            await client.send_raw(key, b"{not json")
            await wait_for(
                lambda: any(d["key"] == key for d in client.dead_letters),
                30,
                "the dead letter",
                alive=second,
            )
            await client.caught_up()
            published = repr([client.results, client.events, client.dead_letters])
            second_metrics = await _metrics(second)
            assert await second.terminate() == 0, second.text()[-3000:]

    for proc in (first, second):
        assert "Traceback" not in proc.text(), proc.text()[-3000:]
        assert "AuthorizationFailed" not in proc.text(), proc.text()[-3000:]
    # The broker's account: nothing the service asked for was denied, and every documented
    # grant was used but the reads of a transaction left open, which this run never finds.
    decisions = [
        d
        for d in authorizations(secured.broker.output.read_text(), f"User:{SERVICE_USER}")
        if cluster.prefix in d.resource or cluster.group in d.resource
    ]
    assert decisions, "no authorization logged"
    assert [d for d in decisions if not d.allowed] == []
    documented = documented_service_acls(cluster.topics, GroupSettings(group_id=cluster.group))
    repair_only = {
        ("topic", cluster.topics.results, "literal", "Read"),
        ("topic", cluster.topics.events, "literal", "Read"),
    }
    assert {d.granted for d in decisions} == documented - repair_only
    assert not _leaks(
        secured,
        first_log=first.text(),
        second_log=second.text(),
        first_metrics=first_metrics,
        second_metrics=second_metrics,
        published=published,
    )


async def test_a_transaction_left_open_is_repaired_with_the_documented_acls(
    secured: Secured, cluster: Cluster
) -> None:
    """The grants the run above never uses: a new owner reads back what a transaction left open
    on results and events holds before it aborts it (docs/runtime.md, "Across broker
    restarts")."""
    session = unique("s")
    with services() as procs:
        first = _service(secured, cluster, "first", "sasl_plaintext")
        procs.append(first)
        await first.wait_ready()
        async with Client(cluster) as client:
            hello = invoke(session, "hello", agent="simple")
            await client.send(hello)
            partition = (await client.result(hello["command_id"], alive=first))["_partition"]
        assert await first.terminate() == 0, first.text()[-3000:]

        # Batches of the previous owner's producer (the one its committed offsets name: the
        # partition's, or the instance's with one stream per instance) that no marker will
        # end, as a lost commit leaves.
        admin = connection_options(secured.admin)
        writer = await _offsets_writer(admin, cluster, partition)
        assert writer, "the committed offsets name no producer"
        for topic, body in (
            (cluster.topics.results, {"session_id": session, "command_id": unique("lost")}),
            (cluster.topics.events, {"session_id": session, "seq": 1_000_000}),
        ):
            await fabricate_hanging_transaction(
                secured.broker.bootstrap,
                writer,
                TopicPartition(topic, partition),
                key=session.encode(),
                value=orjson.dumps(body),
                options=admin,
            )

        second = _service(secured, cluster, "second", "sasl_plaintext")
        procs.append(second)
        await second.wait_log("transaction left open found", count=2)
        await second.wait_ready()
        async with Client(cluster) as client:
            again = invoke(session, "still there?", agent="simple")
            await client.send(again)
            done = await client.result(again["command_id"], alive=second)
            assert done["stop_reason"] == "end_turn", done
        assert await second.terminate() == 0, second.text()[-3000:]

    decisions = [
        d
        for d in authorizations(secured.broker.output.read_text(), f"User:{SERVICE_USER}")
        if cluster.prefix in d.resource or cluster.group in d.resource
    ]
    assert [d for d in decisions if not d.allowed] == []
    used = {d.granted for d in decisions}
    assert ("topic", cluster.topics.results, "literal", "Read") in used
    assert ("topic", cluster.topics.events, "literal", "Read") in used
    assert used <= documented_service_acls(cluster.topics, GroupSettings(group_id=cluster.group))


async def _refused(action: Any, timeout: float = 20.0) -> BaseException:
    try:
        await asyncio.wait_for(action(), timeout)
    except KafkaError as error:
        return error
    raise AssertionError("the broker allowed it")


async def _read(settings: KafkaSettings, topic: str, within: float = 5.0) -> tuple[int, bool]:
    """(records read from ``topic`` within the time, whether its metadata was refused)."""
    consumer = AIOKafkaConsumer(
        **connection_options(settings),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    found = 0
    try:
        await consumer.start()
        partitions = [TopicPartition(topic, p) for p in range(2)]
        consumer.assign(partitions)
        deadline = time.monotonic() + within
        while not found and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=200)
            found += sum(len(records) for records in batches.values())
        return found, topic in consumer._client.cluster.unauthorized_topics
    finally:
        await consumer.stop()


async def _write(settings: KafkaSettings, topic: str) -> None:
    producer = AIOKafkaProducer(**connection_options(settings), acks="all")
    try:
        await producer.start()
        await producer.send_and_wait(topic, key=b"s", value=b"{}")
    finally:
        await producer.stop()


async def test_other_users_and_anonymous_clients_cannot_read_sessions_or_write_results(
    secured: Secured, cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    sessions, results = cluster.topics.sessions, cluster.topics.results
    # Something to read: the admin writes a record and reads it back the same way.
    await _write(secured.admin, sessions)
    assert await _read(secured.admin, sessions) == (1, False)
    # The other user is an upstream service: it may publish commands and nothing else.
    await grant(
        secured.admin,
        f"User:{OTHER_USER}",
        {("topic", cluster.topics.commands, "literal", op) for op in ("Write", "Describe")},
    )
    for listener in ("sasl_plaintext", "sasl_ssl", "ssl"):
        other = secured.settings(OTHER_USER, listener)
        await _write(other, cluster.topics.commands)
        assert await _read(other, sessions) == (0, True)
        denied = await _refused(lambda other=other: _write(other, results))
        assert isinstance(denied, TopicAuthorizationFailedError), repr(denied)
    # The broker says the same: it denied that user both topics, and allowed only commands.
    decisions = [
        d
        for d in authorizations(secured.broker.output.read_text(), f"User:{OTHER_USER}")
        if cluster.prefix in d.resource
    ]
    assert {d.resource for d in decisions if not d.allowed} == {
        f"Topic:LITERAL:{sessions}",
        f"Topic:LITERAL:{results}",
    }
    assert {d.resource for d in decisions if d.allowed} == {
        f"Topic:LITERAL:{cluster.topics.commands}"
    }

    # The service's user name with another password, and no credentials at all (no SASL; TLS
    # without a client certificate), get nowhere.
    wrong = secured.settings(SERVICE_USER, password=f"pw-{secrets.token_hex(12)}")
    anonymous = kafka_settings(secured.broker.bootstrap, None, None, protocol="PLAINTEXT")
    no_certificate = secured.settings(None, "ssl")
    for settings in (wrong, anonymous, no_certificate):
        attempts = (
            lambda settings=settings: _read(settings, sessions),
            lambda settings=settings: _write(settings, results),
        )
        for attempt in attempts:
            caplog.clear()
            refused = await _refused(attempt)
            assert isinstance(refused, KafkaConnectionError), repr(refused)
            if settings is wrong:
                assert "SaslAuthenticationFailed" in caplog.text, caplog.text


async def test_wrong_credentials_make_serve_say_so_in_one_line(
    secured: Secured, cluster: Cluster
) -> None:
    """The refusal is one line per attempt naming the mechanism, with no traceback and no
    password; ``serve`` keeps retrying with backoff (not ready meanwhile) instead of exiting,
    and stops cleanly on SIGTERM."""
    wrong = f"pw-{secrets.token_hex(12)}"
    env = service_env(secured.settings(SERVICE_USER, password=wrong))
    refusal = "SaslAuthenticationFailed"
    with services() as procs:
        proc = cluster.start("wrong", **env)
        procs.append(proc)
        await wait_for(
            lambda: proc.text().count(refusal) >= 2 or not proc.alive,
            60,
            "a second refusal",
            on_timeout=proc.text,
        )
        assert proc.alive, proc.text()
        assert "not serving yet" in proc.text(), proc.text()
        code = await proc.terminate()
    text = proc.text()
    assert code == 0, text
    lines = [line for line in text.splitlines() if refusal in line]
    assert lines, text
    assert all("SCRAM-SHA-512" in line for line in lines), lines
    assert "Traceback" not in text, text
    assert not _leaks(secured, log=text) and wrong not in text, text
