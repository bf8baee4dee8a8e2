"""The settings root: CAIRN_ environment, nested groups, refusals of unsafe combinations."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import ValidationError

from service.app import warn_unknown_settings
from service.serve_cli import describe_invalid_settings
from service.settings import (
    KafkaSettings,
    Settings,
    TopicSettings,
    setting_names,
    tls_files_problem,
    unknown_settings,
)
from tests.support.secure_kafka import make_certificates


def test_nested_environment_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_KAFKA__BOOTSTRAP_SERVERS", "broker:9093")
    monkeypatch.setenv("CAIRN_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("CAIRN_KAFKA__SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("CAIRN_KAFKA__SASL_USERNAME", "cairn")
    monkeypatch.setenv("CAIRN_KAFKA__SASL_PASSWORD", "s3cret")
    monkeypatch.setenv("CAIRN_TOPICS__PARTITIONS", "24")
    monkeypatch.setenv("CAIRN_GROUP__INSTANCE_ID", "cairn-0")
    monkeypatch.setenv("CAIRN_RUNTIME__MAX_IN_FLIGHT", "64")
    settings = Settings()
    assert settings.kafka.bootstrap_servers == "broker:9093"
    assert settings.kafka.sasl_password is not None
    assert settings.kafka.sasl_password.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(settings)
    assert settings.topics.partitions == 24
    assert settings.group.instance_id == "cairn-0"
    assert settings.runtime.max_in_flight == 64


def test_grace_longer_than_the_rebalance_timeout_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CAIRN_GROUP__REBALANCE_TIMEOUT_MS", "6000")
    monkeypatch.setenv("CAIRN_RUNTIME__REVOKE_GRACE_S", "8")
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert (
        "CAIRN_RUNTIME__REVOKE_GRACE_S (8 s) must be shorter than the group's rebalance timeout "
        "(CAIRN_GROUP__REBALANCE_TIMEOUT_MS: 6000 ms)"
    ) in str(refused.value)


def test_a_heartbeat_not_below_the_session_timeout_is_refused_naming_both_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CAIRN_GROUP__HEARTBEAT_INTERVAL_MS", "6000")
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert (
        "CAIRN_GROUP__HEARTBEAT_INTERVAL_MS (6000 ms) must be lower than "
        "CAIRN_GROUP__SESSION_TIMEOUT_MS (6000 ms)"
    ) in str(refused.value)


def test_defaults_keep_takeover_short_and_leave_room_for_a_drain() -> None:
    settings = Settings()
    # Takeover after a crash is about the session timeout plus a heartbeat plus the restore.
    assert settings.group.session_timeout_ms + settings.group.heartbeat_interval_ms < 10_000
    rebalance_ms = settings.group.rebalance_timeout_ms
    assert rebalance_ms is not None
    assert settings.runtime.revoke_grace_s * 1000 < rebalance_ms


def test_every_setting_name_is_read_and_no_other_is_taken_for_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    names = setting_names()
    assert {"CAIRN_AGENTS", "CAIRN_KAFKA", "CAIRN_RUNTIME__MAX_IN_FLIGHT"} <= set(names)
    assert unknown_settings(dict.fromkeys(names, "x")) == []
    # Every name listed really sets something (a name that did not would be silently ignored).
    monkeypatch.setenv("CAIRN_RUNTIME__MAX_IN_FLIGHT", "7")
    assert Settings().runtime.max_in_flight == 7
    assert unknown_settings(
        {
            "cairn_runtime__max_inflight": "7",
            "CAIRN_METRICS_PORT_8080_TCP_ADDR": "10.0.0.1",
            "CAIRN_METRICS_SERVICE_PORT": "8080",
            "OTHER": "x",
        }
    ) == [("cairn_runtime__max_inflight", "CAIRN_RUNTIME__MAX_IN_FLIGHT")]


def test_a_field_named_without_its_group_is_told_with_the_group() -> None:
    """``CAIRN_GROUP_ID`` is close to the group ``CAIRN_GROUP`` (a JSON object), but meant its
    field ``group_id``; a field's own name is taken only where one group has it."""
    assert unknown_settings(
        {
            "CAIRN_GROUP_ID": "cairn",
            "CAIRN_COMMANDS": "in",
            "CAIRN_IDLE_TTL_S": "60",
            "CAIRN_SESSION_TIMEOUT_MS": "6000",
            "CAIRN_GROUPS": "{}",
        }
    ) == [
        ("CAIRN_COMMANDS", "CAIRN_TOPICS__COMMANDS"),
        ("CAIRN_GROUPS", "CAIRN_GROUP"),
        ("CAIRN_GROUP_ID", "CAIRN_GROUP__GROUP_ID"),
        ("CAIRN_IDLE_TTL_S", "CAIRN_SESSIONS__IDLE_TTL_S"),
        ("CAIRN_SESSION_TIMEOUT_MS", "CAIRN_GROUP__SESSION_TIMEOUT_MS"),
    ]


def test_a_group_setting_misspelt_is_told_with_the_setting_it_likely_meant() -> None:
    """A ``__`` name ending like a Kubernetes service link is no service link, and a field no
    group has is not taken for its group."""
    assert unknown_settings(
        {"CAIRN_HEALTH__PORT": "1", "CAIRN_RUNTIME__NOPE": "1", "CAIRN_RUNTIM": "1"}
    ) == [
        ("CAIRN_HEALTH__PORT", "CAIRN_HEALTH_PORT"),
        ("CAIRN_RUNTIM", "CAIRN_RUNTIME"),
        ("CAIRN_RUNTIME__NOPE", None),
    ]


@pytest.mark.parametrize(
    "servers",
    [
        "broker:9093",
        "a:1,b:65535",
        " a:1 , b:2 ",
        "broker",  # aiokafka connects to 9092
        "[::1]:9092",
        "[::1]",
        "kafka-0.kafka.svc.cluster.local:9094",
        "kafka_1:9092",
        "10.0.0.7",
    ],
)
def test_bootstrap_servers_aiokafka_reads_are_taken(servers: str) -> None:
    assert KafkaSettings(bootstrap_servers=servers).bootstrap_servers == servers


@pytest.mark.parametrize(
    ("servers", "says"),
    [
        ("127.0.0.1:99999", "the server is not HOST:PORT: the port is not a number from 1"),
        ("127.0.0.1:abc", "the port is not a number"),
        ("127.0.0.1:0", "the port is not a number"),
        ("127.0.0.1:", "the port is not a number"),
        (":9092", "the host is empty"),
        ("", "it is empty"),
        ("a:1,,b:2", "server 2 of 3 is not HOST:PORT: it is empty"),
        ("[::1]:x", "the port is not a number"),
        ("[nohost]:9092", "not an IPv6 address"),
        ("[::1:9092", "bracket"),
        ("::1]:9092", "bracket"),
        ("http://broker:9092", "the host is not a name or an IPv4 address"),
        ("bad:host:1", "the host is not a name or an IPv4 address"),
        ("ho_st!:9092", "the host is not a name or an IPv4 address"),
        ("a b:9092", "the host is not a name"),
        ("user@broker:9092", "the host is not a name"),
        ("::1", "an IPv6 address goes in brackets"),
        ("::1:9092", "an IPv6 address goes in brackets"),
    ],
)
def test_a_bootstrap_list_aiokafka_would_choke_on_is_refused(servers: str, says: str) -> None:
    """aiokafka parses the list only when it connects, and a bad port then ends the process with
    a traceback (``OverflowError``, ``ValueError``) instead of a settings error."""
    with pytest.raises(ValidationError, match="bootstrap_servers") as refused:
        KafkaSettings(bootstrap_servers=servers)
    assert says in str(refused.value)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({}, "CAIRN_KAFKA__SASL_MECHANISM, CAIRN_KAFKA__SASL_USERNAME, CAIRN_KAFKA__SASL_PASSWORD"),
        ({"sasl_mechanism": "PLAIN", "sasl_username": "u"}, "CAIRN_KAFKA__SASL_PASSWORD must"),
        ({"sasl_mechanism": "SCRAM-SHA-512", "sasl_password": "hunter2"}, "SASL_USERNAME must"),
        ({"sasl_mechanism": "OAUTHBEARER", "sasl_username": "u", "sasl_password": "p"}, "'PLAIN'"),
    ],
)
@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_sasl_without_what_it_needs_is_refused(
    protocol: str, fields: dict[str, str], says: str
) -> None:
    """aiokafka refused these only as the first client was made, in a traceback (PLAIN without
    a password, OAUTHBEARER without a token provider, which no setting gives), or at the
    broker's handshake (SCRAM without a user)."""
    with pytest.raises(ValidationError) as refused:
        KafkaSettings(security_protocol=protocol, **fields)  # type: ignore[arg-type]
    told = describe_invalid_settings(refused.value)
    assert says in told
    assert "hunter2" not in told


def test_sasl_with_its_mechanism_user_and_password_is_taken() -> None:
    kafka = KafkaSettings(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="u",
        sasl_password="p",  # type: ignore[arg-type]
    )
    assert kafka.sasl_username == "u"


def test_tls_files_that_cannot_load_are_refused_naming_the_variable(tmp_path: Path) -> None:
    """Taken, a missing or unreadable file failed every connection, reported as an unreachable
    broker while the service waited for it."""
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    cases = [
        ({"ssl_cafile": str(tmp_path / "absent.pem")}, "CAIRN_KAFKA__SSL_CAFILE: no file at"),
        ({"ssl_cafile": str(tmp_path)}, "CAIRN_KAFKA__SSL_CAFILE: no file at"),
        ({"ssl_cafile": str(junk)}, "CAIRN_KAFKA__SSL_CAFILE: " + str(junk) + " does not load"),
        ({"ssl_certfile": str(junk)}, "CAIRN_KAFKA__SSL_CERTFILE and CAIRN_KAFKA__SSL_KEYFILE"),
        ({"ssl_keyfile": str(junk)}, "CAIRN_KAFKA__SSL_KEYFILE is set without"),
    ]
    sasl = {"sasl_mechanism": "PLAIN", "sasl_username": "u", "sasl_password": "p"}
    for fields, says in cases:
        for protocol in ("SSL", "SASL_SSL"):
            extra = sasl if protocol == "SASL_SSL" else {}
            kafka = KafkaSettings.model_validate({"security_protocol": protocol, **fields, **extra})
            problem = tls_files_problem(kafka)
            assert problem is not None and says in problem, (fields, protocol, problem)
        # Without TLS the files are not used, so not read.
        assert tls_files_problem(KafkaSettings.model_validate(fields)) is None


def test_tls_files_that_load_are_taken(tmp_path: Path) -> None:
    certificates = make_certificates(tmp_path)
    cert, key = certificates.client("cairn")
    kafka = KafkaSettings(
        security_protocol="SSL",
        ssl_cafile=str(certificates.ca_pem),
        ssl_certfile=str(cert),
        ssl_keyfile=str(key),
    )
    assert tls_files_problem(kafka) is None


@pytest.mark.parametrize("name", ["cairn.commands", "a", "A-b_c.9", "x" * 249, "..."])
def test_topic_names_kafka_takes_are_taken(name: str) -> None:
    assert TopicSettings(commands=name).commands == name


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("", "cannot be empty"),
        (".", "cannot be '.' or '..'"),
        ("..", "cannot be '.' or '..'"),
        ("x" * 250, "at most 249 characters"),
        ("cairn commands", "only ASCII letters, digits"),
        ("cairn/commands", "only ASCII letters, digits"),
        ("caírn", "only ASCII letters, digits"),
    ],
)
def test_a_topic_name_kafka_refuses_is_refused(name: str, says: str) -> None:
    with pytest.raises(ValidationError, match="commands") as refused:
        TopicSettings(commands=name)
    assert says in str(refused.value)


def test_two_roles_on_one_topic_are_refused_naming_both_variables() -> None:
    with pytest.raises(ValidationError) as refused:
        TopicSettings(events="cairn.results")
    assert "CAIRN_TOPICS__RESULTS and CAIRN_TOPICS__EVENTS name the same topic" in str(
        refused.value
    )
    with pytest.raises(ValidationError) as refused:
        TopicSettings(events="cairn.results", dlq="cairn.results")
    assert (
        "CAIRN_TOPICS__RESULTS, CAIRN_TOPICS__EVENTS and CAIRN_TOPICS__DLQ name the same topic"
        in str(refused.value)
    )


def test_the_service_names_every_unknown_variable_in_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One line for them all: the repeat limit (5 by default) cannot drop the later ones."""
    environ = {f"CAIRN_A{i}": "1" for i in range(6)} | {"CAIRN_SESIONS__STORE_DIR": "/d"}
    with caplog.at_level(logging.WARNING, logger="service.app"):
        warn_unknown_settings(environ)
    [record] = caplog.records
    line = record.getMessage()
    assert all(f"CAIRN_A{i}" in line for i in range(6))
    assert "CAIRN_SESIONS__STORE_DIR (meant CAIRN_SESSIONS__STORE_DIR)" in line
