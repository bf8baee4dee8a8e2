"""The Kafka side of the deployment agrees with the code: topics, ACLs, autoscaling.

The Strimzi overlay (deploy/k8s/strimzi), the KEDA component (deploy/k8s/keda) and the ACL set of
docs/runtime.md are checked against what the service does: the topics and configs of
``topic_specs``, the consumer group and transactional ids of the runtime, the settings the pods
get. The ACL set itself is written out here, each grant with the code that needs it.
"""

from __future__ import annotations

import inspect
import itertools
from pathlib import PurePosixPath
from typing import Any

import pytest
import yaml

from service.runtime.runtime import (
    Runtime,
    instance_transactional_id,
    partition_transactional_id,
    transactional_id_prefix,
)
from service.runtime.topics import topic_specs
from service.settings import GroupSettings, Settings
from tests.support.manifests import (
    BASE,
    KEDA,
    ROOT,
    SETTING_PATHS,
    STRIMZI,
    base_container,
    configmap_data,
    folder_documents,
    kustomization,
    only,
    patches_for,
    settings_from,
    shell_commands,
    strimzi_env,
)

RUNTIME_DOC = ROOT / "docs" / "runtime.md"

Acl = tuple[str, str, str, frozenset[str]]
"""(resource type, resource name, pattern type, operations)."""


def service_acls(settings: Settings) -> set[Acl]:
    """What the service's principal needs, and nothing more (Describe is implied by Read and
    Write; it is granted explicitly for metadata, offset and coordinator look-ups)."""
    topics = settings.topics
    read, write, both = (
        frozenset({"Read", "Describe"}),
        frozenset({"Write", "Describe"}),
        frozenset({"Read", "Write", "Describe"}),
    )
    return {
        # The group's consumer subscribes to commands and control (runtime.Runtime.run).
        ("topic", topics.commands, "literal", read),
        ("topic", topics.control, "literal", read),
        # Written in every transaction; read by restores (restore.SessionsReader), standby.
        ("topic", topics.sessions, "literal", both),
        # Written in transactions; a transaction left open there is read back before it is
        # aborted (transactions.resolve_open_transactions: its records may be published again).
        ("topic", topics.results, "literal", both),
        ("topic", topics.events, "literal", both),
        # Dead letters are only written.
        ("topic", topics.dlq, "literal", write),
        # Membership, stable offset fetches, TxnOffsetCommit / AddOffsetsToTxn.
        ("group", settings.group.group_id, "literal", read),
        # Every producer's transactional id, the previous owner's fenced one included.
        ("transactionalId", transactional_id_prefix(settings.group), "prefix", write),
    }


def topics_job_acls(settings: Settings) -> set[Acl]:
    """`cairn topics create`: CreateTopics, then describes them (leaders, partition counts)."""
    return {
        ("topic", spec.name, "literal", frozenset({"Create", "Describe"}))
        for spec in topic_specs(settings.topics)
    }


def _strimzi_docs() -> list[dict[str, Any]]:
    return folder_documents(STRIMZI)


def _kafka_user() -> dict[str, Any]:
    return only(_strimzi_docs(), "KafkaUser")


def _strimzi_acls(user: dict[str, Any]) -> set[Acl]:
    acls: set[Acl] = set()
    for acl in user["spec"]["authorization"]["acls"]:
        resource = acl["resource"]
        assert acl.get("type", "allow") == "allow"
        assert acl.get("host", "*") == "*"
        acls.add(
            (
                resource["type"],
                resource["name"],
                resource.get("patternType", "literal"),
                frozenset(acl["operations"]),
            )
        )
    return acls


def _cluster_name() -> str:
    labels = {
        d["metadata"]["labels"]["strimzi.io/cluster"]
        for d in _strimzi_docs()
        if d["kind"] in ("KafkaTopic", "KafkaUser")
    }
    assert len(labels) == 1, labels
    return labels.pop()


# ---- ACLs -------------------------------------------------------------------------------------


def test_every_transactional_id_the_runtime_uses_has_the_granted_prefix() -> None:
    group = GroupSettings()
    prefix = transactional_id_prefix(group)
    ids = [partition_transactional_id(group, p) for p in range(64)]
    ids.append(instance_transactional_id(Settings()))
    ids.append(instance_transactional_id(Settings(group=GroupSettings(instance_id="pod-0"))))
    assert all(i.startswith(prefix) for i in ids), ids
    # And the runtime names its streams with these functions, not on its own.
    source = inspect.getsource(Runtime._serve)
    assert "partition_transactional_id(" in source
    assert "instance_transactional_id(" in source


def test_kafka_user_grants_exactly_the_service_acl_set() -> None:
    user = _kafka_user()
    settings = settings_from(strimzi_env())
    assert _strimzi_acls(user) == service_acls(settings)
    assert user["spec"]["authentication"]["type"] == "scram-sha-512"
    assert user["spec"]["authorization"]["type"] == "simple"
    # The mechanism the service uses is the one the user is made for.
    assert settings.kafka.sasl_mechanism == "SCRAM-SHA-512"
    assert settings.kafka.security_protocol == "SASL_SSL"


def _kafka_acls_commands() -> dict[str, set[Acl]]:
    """Principal -> the ACLs the kafka-acls.sh commands of docs/runtime.md add."""
    flags = {"--topic": "topic", "--group": "group", "--transactional-id": "transactionalId"}
    patterns = {"literal": "literal", "prefixed": "prefix"}
    found: dict[str, set[Acl]] = {}
    for argv in shell_commands(RUNTIME_DOC, "kafka-acls.sh"):
        assert "--add" in argv, argv
        pairs = list(itertools.pairwise(argv))
        options = dict(pairs)
        principal = options["--allow-principal"]
        operations = frozenset(v for k, v in pairs if k == "--operation")
        pattern = patterns[options.get("--resource-pattern-type", "literal")]
        resources = [(flags[k], v) for k, v in pairs if k in flags]
        assert resources, argv
        for kind, name in resources:
            found.setdefault(principal, set()).add((kind, name, pattern, operations))
    return found


def test_runtime_doc_lists_the_acl_set_as_kafka_acls_commands() -> None:
    settings = Settings()
    documented = _kafka_acls_commands()
    user = _kafka_user()["metadata"]["name"]
    assert documented.pop(f"User:{user}") == service_acls(settings)
    # The topics Job's own principal: create and describe the six topics, nothing else.
    assert list(documented.values()) == [topics_job_acls(settings)]


def test_runtime_doc_shows_the_strimzi_kafka_user_equivalent() -> None:
    blocks = [
        d
        for block in RUNTIME_DOC.read_text().split("```yaml\n")[1:]
        for d in yaml.safe_load_all(block.split("```", 1)[0])
        if isinstance(d, dict) and d.get("kind") == "KafkaUser"
    ]
    assert len(blocks) == 1
    assert _strimzi_acls(blocks[0]) == _strimzi_acls(_kafka_user())


# ---- Strimzi overlay ---------------------------------------------------------------------------


def test_kafka_topics_are_the_topics_the_code_creates() -> None:
    settings = settings_from(strimzi_env())
    topics = {
        d["spec"].get("topicName", d["metadata"]["name"]): d["spec"]
        for d in _strimzi_docs()
        if d["kind"] == "KafkaTopic"
    }
    specs = topic_specs(settings.topics)
    assert set(topics) == {spec.name for spec in specs}
    for spec in specs:
        topic = topics[spec.name]
        assert topic["partitions"] == spec.partitions, spec.name
        assert topic["replicas"] == settings.topics.replication_factor, spec.name
        config = {k: str(v) for k, v in (topic.get("config") or {}).items()}
        assert config == spec.configs, spec.name
    assert topics[settings.topics.sessions]["config"]["cleanup.policy"] == "compact"


def test_strimzi_overlay_builds_on_the_base_and_replaces_the_topics_job() -> None:
    overlay = kustomization(STRIMZI)
    assert "../base" in overlay["resources"]
    assert "../keda" in overlay["components"]
    listed = {r for r in overlay["resources"] if r.endswith(".yaml")}
    patched = {p["path"] for p in overlay["patches"] if "path" in p}
    assert listed | patched == {p.name for p in STRIMZI.glob("*.yaml")} - {"kustomization.yaml"}
    [(target, content)] = list(patches_for(STRIMZI, "Job"))
    assert content["$patch"] == "delete"
    assert target["name"] == only(folder_documents(BASE), "Job")["metadata"]["name"]


def test_strimzi_settings_are_real_and_connect_with_the_users_credentials() -> None:
    env = strimzi_env()
    settings = settings_from(env)
    cluster = _cluster_name()
    assert settings.kafka.bootstrap_servers.startswith(f"{cluster}-kafka-bootstrap:")
    [(_, patch)] = list(patches_for(STRIMZI, "Deployment"))
    [container] = patch["spec"]["template"]["spec"]["containers"]
    assert container["name"] == base_container()["name"]
    env_vars = {e["name"]: e for e in container["env"]}
    assert set(env_vars) <= set(SETTING_PATHS)
    user = _kafka_user()["metadata"]["name"]
    assert env_vars["CAIRN_KAFKA__SASL_USERNAME"]["value"] == user
    password = env_vars["CAIRN_KAFKA__SASL_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert password == {"name": user, "key": "password"}  # the User Operator's Secret
    # The CA file the settings name is the cluster CA, mounted where they look for it.
    cafile = PurePosixPath(str(settings.kafka.ssl_cafile))
    [mount] = container["volumeMounts"]
    assert PurePosixPath(mount["mountPath"]) == cafile.parent
    [volume] = patch["spec"]["template"]["spec"]["volumes"]
    assert volume["name"] == mount["name"]
    assert volume["secret"]["secretName"] == f"{cluster}-cluster-ca-cert"
    assert volume["secret"]["items"] == [{"key": "ca.crt", "path": cafile.name}]


# ---- KEDA --------------------------------------------------------------------------------------


def _scaled_object() -> dict[str, Any]:
    return only(folder_documents(KEDA), "ScaledObject")


def _trigger_metadata() -> dict[str, str]:
    [trigger] = _scaled_object()["spec"]["triggers"]
    assert trigger["type"] == "kafka"
    return {k: str(v) for k, v in trigger["metadata"].items()}


def test_scaled_object_scales_the_deployment_on_the_commands_lag_of_the_group() -> None:
    settings = settings_from(configmap_data(BASE))
    scaled = _scaled_object()["spec"]
    assert (
        scaled["scaleTargetRef"]["name"]
        == only(folder_documents(BASE), "Deployment")["metadata"]["name"]
    )
    assert scaled.get("scaleTargetRef", {}).get("kind", "Deployment") == "Deployment"
    # Beyond the partition count an instance is assigned nothing.
    assert scaled["maxReplicaCount"] == settings.topics.partitions
    assert 1 <= scaled["minReplicaCount"] <= scaled["maxReplicaCount"]
    metadata = _trigger_metadata()
    assert metadata["consumerGroup"] == settings.group.group_id == Settings().group.group_id
    assert metadata["topic"] == settings.topics.commands == Settings().topics.commands
    assert metadata["bootstrapServers"] == settings.kafka.bootstrap_servers
    assert metadata["allowIdleConsumers"] == "false"
    assert int(metadata["lagThreshold"]) > 0
    # A partition without committed offsets is read from its start by the service, so all of
    # it is lag.
    assert 'auto_offset_reset="earliest"' in inspect.getsource(Runtime._serve)
    assert metadata["offsetResetPolicy"] == "earliest"


def test_keda_component_hands_the_replica_count_to_the_scaler() -> None:
    component = kustomization(KEDA)
    assert component["kind"] == "Component"
    assert component["resources"] == ["scaledobject.yaml"]
    [(target, ops)] = list(patches_for(KEDA, "Deployment"))
    assert target["name"] == _scaled_object()["spec"]["scaleTargetRef"]["name"]
    assert ops == [{"op": "remove", "path": "/spec/replicas"}]
    assert "replicas" in only(folder_documents(BASE), "Deployment")["spec"]


def _apply_ops(document: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON 6902 add/replace operations kustomize applies (paths of keys and indexes)."""
    for op in ops:
        assert op["op"] in ("add", "replace"), op
        *parents, leaf = op["path"].strip("/").split("/")
        target: Any = document
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if op["op"] == "replace":
            assert leaf in target, op["path"]
        target[leaf] = op["value"]
    return document


@pytest.fixture
def strimzi_trigger() -> dict[str, Any]:
    [(target, ops)] = list(patches_for(STRIMZI, "ScaledObject"))
    assert target["name"] == _scaled_object()["metadata"]["name"]
    [trigger] = _apply_ops(_scaled_object(), ops)["spec"]["triggers"]
    return dict(trigger)


def test_strimzi_scaler_reads_the_lag_over_the_services_listener_as_its_user(
    strimzi_trigger: dict[str, Any],
) -> None:
    settings = settings_from(strimzi_env())
    metadata = strimzi_trigger["metadata"]
    assert metadata["bootstrapServers"] == settings.kafka.bootstrap_servers
    keda_sasl = {"PLAIN": "plaintext", "SCRAM-SHA-256": "scram_sha256"}
    keda_sasl["SCRAM-SHA-512"] = "scram_sha512"
    assert metadata["sasl"] == keda_sasl[str(settings.kafka.sasl_mechanism)]
    assert settings.kafka.security_protocol == "SASL_SSL"
    assert metadata["tls"] == "enable"
    auth = only(
        _strimzi_docs(), "TriggerAuthentication", strimzi_trigger["authenticationRef"]["name"]
    )
    params = {ref["parameter"]: ref for ref in auth["spec"].get("secretTargetRef", [])}
    params.update({ref["parameter"]: ref for ref in auth["spec"].get("env", [])})
    user = _kafka_user()["metadata"]["name"]
    assert params["password"]["name"] == user and params["password"]["key"] == "password"
    assert params["username"]["name"] == "CAIRN_KAFKA__SASL_USERNAME"
    assert params["username"]["containerName"] == base_container()["name"]
    assert params["ca"] == {
        "parameter": "ca",
        "name": f"{_cluster_name()}-cluster-ca-cert",
        "key": "ca.crt",
    }
    # The service's user may describe the group and the topic, which is all the scaler does.
    acls = _strimzi_acls(_kafka_user())
    assert any(
        a[0] == "group" and a[1] == metadata["consumerGroup"] and "Describe" in a[3] for a in acls
    )
    assert any(a[0] == "topic" and a[1] == metadata["topic"] and "Describe" in a[3] for a in acls)
