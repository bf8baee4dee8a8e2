"""An authenticated broker for tests: TLS certificates made here, SCRAM users with fresh passwords,
ACLs granted through the Admin API, and the settings a client or service process connects with.

Guarantee: every password is new per call of ``scram_users`` (so finding one in an output proves
a leak); ``grant`` returns only once the broker accepted every ACL, and raises on any refusal.
The ACLs of the service are read from the Strimzi KafkaUser, the set the deployment documents.
"""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import for_code
from aiokafka.protocol.admin import CreateAclsRequest

from service.runtime.clients import connection_options
from service.runtime.runtime import transactional_id_prefix
from service.settings import GroupSettings, KafkaSettings, TopicSettings
from tests.support.manifests import STRIMZI, folder_documents, only

MECHANISM = "SCRAM-SHA-512"


@dataclass(frozen=True)
class Certificates:
    ca_pem: Path
    """The authority the clients trust, and the broker trusts for client certificates."""
    ca_key: Path
    keystore_pem: Path
    """The broker's key (PKCS#8) and certificate, valid for 127.0.0.1 and localhost."""

    def client(self, name: str) -> tuple[Path, Path]:
        """(certificate, key) of a client whose principal is ``User:name``, made on first use."""
        folder = self.ca_pem.parent
        key, csr, cert = (folder / f"client-{name}{ext}" for ext in (".key", ".csr", ".pem"))
        if not cert.exists():
            extensions = folder / "client.ext"
            extensions.write_text("extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n")
            _new_key(key)
            # Subject written O first, so the name the broker reads starts with the CN.
            subject = f"/O=cairn-test/CN={name}"
            _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr))
            _sign(csr, self, extensions, cert)
        return cert, key


def _new_key(path: Path) -> None:
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(path))


def _openssl(*arguments: str) -> None:
    if shutil.which("openssl") is None:
        raise AssertionError("openssl not found: the certificates of the test broker need it")
    done = subprocess.run(["openssl", *arguments], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise AssertionError(f"openssl {arguments[0]} failed: {done.stderr}")


def make_certificates(folder: Path) -> Certificates:
    """A CA of its own and a broker certificate it signed (one day, RSA 2048)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca_pem = folder / "ca.key", folder / "ca.pem"
    key, csr, cert = folder / "broker.key", folder / "broker.csr", folder / "broker.pem"
    extensions = folder / "broker.ext"
    extensions.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "extendedKeyUsage=serverAuth\n"
        "basicConstraints=CA:FALSE\n"
    )
    _new_key(ca_key)
    _openssl(
        "req", "-x509", "-new", "-key", str(ca_key), "-days", "1",
        "-subj", "/CN=cairn-test-ca", "-out", str(ca_pem),
    )  # fmt: skip
    _new_key(key)
    _openssl("req", "-new", "-key", str(key), "-subj", "/CN=localhost", "-out", str(csr))
    keystore = folder / "broker-keystore.pem"
    made = Certificates(ca_pem=ca_pem, ca_key=ca_key, keystore_pem=keystore)
    _sign(csr, made, extensions, cert)
    keystore.write_text(key.read_text() + cert.read_text() + ca_pem.read_text())
    return made


def _sign(csr: Path, authority: Certificates, extensions: Path, cert: Path) -> None:
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(authority.ca_pem),
        "-CAkey", str(authority.ca_key), "-CAcreateserial", "-days", "1",
        "-extfile", str(extensions), "-out", str(cert),
    )  # fmt: skip


def scram_users(*names: str) -> dict[str, str]:
    """User name -> a password made now."""
    return {name: f"pw-{secrets.token_hex(12)}" for name in names}


def kafka_settings(
    bootstrap: str,
    user: str | None,
    password: str | None,
    *,
    tls: Certificates | None = None,
    protocol: str | None = None,
) -> KafkaSettings:
    """SCRAM over SASL_SSL when ``tls`` is given, else over SASL_PLAINTEXT; with ``protocol``
    ``SSL`` the user's client certificate instead of SCRAM (``user`` None: none)."""
    fields: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "security_protocol": protocol or ("SASL_SSL" if tls else "SASL_PLAINTEXT"),
        "request_timeout_ms": 10_000,
    }
    if tls is not None:
        fields["ssl_cafile"] = str(tls.ca_pem)
    if protocol == "SSL":
        if user is not None and tls is not None:
            cert, key = tls.client(user)
            fields.update(ssl_certfile=str(cert), ssl_keyfile=str(key))
    elif user is not None:
        fields.update(sasl_mechanism=MECHANISM, sasl_username=user, sasl_password=password)
    return KafkaSettings.model_validate(fields)


def service_env(settings: KafkaSettings) -> dict[str, str]:
    """The ``CAIRN_KAFKA__*`` variables of these settings (the bootstrap included)."""
    env = {
        "CAIRN_KAFKA__BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "CAIRN_KAFKA__SECURITY_PROTOCOL": settings.security_protocol,
    }
    if settings.sasl_mechanism is not None:
        env["CAIRN_KAFKA__SASL_MECHANISM"] = settings.sasl_mechanism
    if settings.sasl_username is not None:
        env["CAIRN_KAFKA__SASL_USERNAME"] = settings.sasl_username
    if settings.sasl_password is not None:
        env["CAIRN_KAFKA__SASL_PASSWORD"] = settings.sasl_password.get_secret_value()
    for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        value = getattr(settings, name)
        if value is not None:
            env[f"CAIRN_KAFKA__{name.upper()}"] = value
    return env


# ---- ACLs ------------------------------------------------------------------------------------

Acl = tuple[str, str, str, str]
"""(resource type, resource name, pattern type, operation), as a Strimzi KafkaUser names them."""

_RESOURCE_TYPES = {"topic": 2, "group": 3, "cluster": 4, "transactionalId": 5}
_PATTERN_TYPES = {"literal": 3, "prefix": 4}
_OPERATIONS = {
    "All": 2,
    "Read": 3,
    "Write": 4,
    "Create": 5,
    "Delete": 6,
    "Alter": 7,
    "Describe": 8,
    "ClusterAction": 9,
    "DescribeConfigs": 10,
    "AlterConfigs": 11,
    "IdempotentWrite": 12,
}
_ALLOW = 3


def documented_service_acls(topics: TopicSettings, group: GroupSettings) -> set[Acl]:
    """The ACLs of deploy/k8s/strimzi's KafkaUser, its default names replaced by these."""
    user = only(folder_documents(STRIMZI), "KafkaUser")
    defaults, default_group = TopicSettings(), GroupSettings()
    names = {
        **{getattr(defaults, t): getattr(topics, t) for t in _TOPIC_FIELDS},
        default_group.group_id: group.group_id,
        transactional_id_prefix(default_group): transactional_id_prefix(group),
    }
    acls: set[Acl] = set()
    for acl in user["spec"]["authorization"]["acls"]:
        resource = acl["resource"]
        assert acl.get("type", "allow") == "allow" and acl.get("host", "*") == "*", acl
        name = names[resource["name"]]
        pattern = resource.get("patternType", "literal")
        acls.update((resource["type"], name, pattern, op) for op in acl["operations"])
    return acls


_TOPIC_FIELDS = ("commands", "control", "results", "events", "sessions", "dlq")


async def grant(admin_settings: KafkaSettings, principal: str, acls: Iterable[Acl]) -> None:
    """Allow ``principal`` (``User:name``) each ACL, from any host."""
    admin = AIOKafkaAdminClient(**connection_options(admin_settings))
    await admin.start()
    try:
        for kind, name, pattern, operation in sorted(acls):
            request = CreateAclsRequest(
                _RESOURCE_TYPES[kind],
                name,
                _PATTERN_TYPES[pattern],
                principal,
                "*",
                _OPERATIONS[operation],
                _ALLOW,
            )
            response = await admin._send_request(request)
            for code, message in response.creation_responses:
                if code != 0:
                    raise for_code(code)(f"{kind} {name} {operation}: {message}")
    finally:
        await admin.close()


_DECISION = re.compile(
    r"Principal = (?P<principal>\S+) is (?P<decision>Allowed|Denied) "
    r"operation = (?P<operation>[A-Z_]+) .*? on resource = (?P<resource>\S+) "
    r"for request = (?P<request>\w+)"
    r"(?:.*? based on rule MatchingAcl\(acl=StandardAcl\[resourceType=(?P<rule_type>[A-Z_]+), "
    r"resourceName=(?P<rule_name>[^,]*), patternType=(?P<rule_pattern>[A-Z]+))?"
)
_RULE_TYPES = {"TOPIC": "topic", "GROUP": "group", "TRANSACTIONAL_ID": "transactionalId"}
_RULE_PATTERNS = {"LITERAL": "literal", "PREFIXED": "prefix"}


@dataclass(frozen=True)
class Decision:
    """One line of the broker's authorizer log."""

    principal: str
    allowed: bool
    operation: str
    """As the request needed it: ``Read``, ``Describe``..."""
    resource: str
    """As the broker prints it: ``Topic:LITERAL:name``."""
    request: str
    acl: tuple[str, str, str] | None
    """(type, name, pattern) of the ACL that allowed it, in the KafkaUser's terms."""

    @property
    def granted(self) -> Acl | None:
        """The grant this decision used: the allowing ACL's resource with the operation asked
        (one Read ACL also allows a Describe check, which counts as a use of Describe)."""
        if self.acl is None:
            return None
        return (*self.acl, self.operation)


def authorizations(broker_output: str, principal: str) -> list[Decision]:
    """Every decision the authorizer logged for ``principal`` (a broker started with
    ``log_authorizations``)."""
    found: list[Decision] = []
    for match in _DECISION.finditer(broker_output):
        if match["principal"] != principal:
            continue
        acl = None
        if match["rule_type"] is not None:
            acl = (
                _RULE_TYPES.get(match["rule_type"], match["rule_type"]),
                match["rule_name"],
                _RULE_PATTERNS.get(match["rule_pattern"], match["rule_pattern"]),
            )
        found.append(
            Decision(
                principal=match["principal"],
                allowed=match["decision"] == "Allowed",
                operation=_OPERATION_NAMES[match["operation"]],
                resource=match["resource"],
                request=match["request"],
                acl=acl,
            )
        )
    return found


_OPERATION_NAMES = {
    "".join(("_" + c if c.isupper() else c) for c in name).lstrip("_").upper(): name
    for name in _OPERATIONS
}
"""``DESCRIBE_CONFIGS`` -> ``DescribeConfigs``, as the authorizer log spells them."""
