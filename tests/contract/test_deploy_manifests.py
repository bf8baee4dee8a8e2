"""The Dockerfile, compose file and Kubernetes manifests agree with the service they deploy.

They cannot run here, so every invariant that matters is checked structurally: probe paths are
routes the service serves, every ``CAIRN_`` name is a real setting (and its value validates),
the image's entrypoint is the CLI, and the stop budget covers the drain.
"""

from __future__ import annotations

import shlex
import tomllib
from typing import Any

import pytest
import yaml

from service.observability.http import HealthServer
from service.observability.metrics import Metrics
from service.settings import Settings
from tests.support.manifests import (
    BASE,
    K8S,
    ROOT,
    SETTING_PATHS,
    base_container,
    configmap_data,
    dockerfile_stages,
    documents,
    folder_documents,
    kustomization,
    only,
    shell_commands,
    strimzi_env,
)

COMPOSE = ROOT / "deploy" / "compose.yaml"
KUBERNETES_DOC = ROOT / "docs" / "kubernetes.md"


def _k8s_documents() -> list[dict[str, Any]]:
    return folder_documents(BASE)


def _one(kind: str) -> dict[str, Any]:
    return only(_k8s_documents(), kind)


def _container() -> dict[str, Any]:
    return base_container("Deployment")


def _config_env() -> dict[str, str]:
    return configmap_data(BASE)


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _service_routes() -> set[str]:
    app = HealthServer(Metrics(), readiness=lambda: True).build_app()
    return {resource.canonical for resource in app.router.resources()}


def _dockerfile_final_stage() -> list[tuple[str, str]]:
    stages = dockerfile_stages()
    assert len(stages) >= 2, "the image must be built in more than one stage"
    return stages[-1]


def _exec_form(value: str) -> list[str]:
    parsed = yaml.safe_load(value)
    assert isinstance(parsed, list), f"use the exec (JSON) form, not {value!r}"
    return [str(v) for v in parsed]


def test_every_k8s_manifest_parses_and_kustomization_lists_them_all() -> None:
    listed = set(kustomization(BASE)["resources"])
    on_disk = {p.name for p in BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk
    assert kustomization(K8S)["resources"] == ["base"]
    kinds = {d["kind"] for d in _k8s_documents()}
    assert {"Deployment", "ConfigMap", "PodDisruptionBudget", "Job", "Service"} <= kinds


def test_no_secret_is_applied_with_the_manifests() -> None:
    # Credentials are made by the operator (docs/kubernetes.md), never kept as placeholders.
    for path in K8S.rglob("*.yaml"):
        assert all(d.get("kind") != "Secret" for d in documents(path)), path


def _secret_commands() -> dict[str, set[str]]:
    """Secret name -> the keys the documented `kubectl create secret generic` commands give it."""
    secrets: dict[str, set[str]] = {}
    for argv in shell_commands(KUBERNETES_DOC, "kubectl"):
        if argv[1:4] == ["create", "secret", "generic"]:
            keys = {a.split("=", 1)[1].split("=", 1)[0] for a in argv if a.startswith("--from-")}
            secrets.setdefault(argv[4], set()).update(keys)
    return secrets


def _secret_refs(kind: str) -> list[dict[str, Any]]:
    env_from = base_container(kind)["envFrom"]
    return [source["secretRef"] for source in env_from if "secretRef" in source]


def test_documented_secrets_carry_the_keys_the_pods_read() -> None:
    documented = _secret_commands()
    credentials = {"CAIRN_KAFKA__SASL_USERNAME", "CAIRN_KAFKA__SASL_PASSWORD"}
    assert credentials <= set(SETTING_PATHS)
    for kind in ("Deployment", "Job"):
        [ref] = _secret_refs(kind)
        # Optional: a broker without authentication needs no Secret at all.
        assert ref["optional"] is True
        keys = documented.get(ref["name"])
        assert keys, f"{kind}: no documented command creates Secret {ref['name']!r}"
        assert credentials <= keys, kind
        # Every CAIRN_ key is a setting; other keys (API keys of agents) pass through as they are.
        assert {k for k in keys if k.startswith("CAIRN_")} <= set(SETTING_PATHS)
    # The topics Job authenticates as its own principal, the only one allowed to create topics.
    assert _secret_refs("Job")[0]["name"] != _secret_refs("Deployment")[0]["name"]


def test_topics_job_runs_topics_create_with_the_service_settings_and_image() -> None:
    job = _one("Job")
    pod = job["spec"]["template"]["spec"]
    container = base_container("Job")
    assert container["args"] == ["topics", "create"]
    assert container["image"] == _container()["image"]
    assert pod["restartPolicy"] in ("OnFailure", "Never")
    assert job["spec"]["backoffLimit"] >= 3  # retried while the broker is still coming up
    config_refs = [s["configMapRef"]["name"] for s in container["envFrom"] if "configMapRef" in s]
    assert config_refs == [_one("ConfigMap")["metadata"]["name"]]
    users = [rest for keyword, rest in _dockerfile_final_stage() if keyword == "USER"]
    assert str(pod["securityContext"]["runAsUser"]) == users[-1]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_probe_and_prestop_paths_are_routes_of_the_service() -> None:
    routes = _service_routes()
    container = _container()
    probes = {name: container[name] for name in ("livenessProbe", "readinessProbe")}
    assert probes["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert probes["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for name in ("livenessProbe", "readinessProbe", "startupProbe"):
        if name in container:
            assert container[name]["httpGet"]["path"] in routes, name
    assert container["lifecycle"]["preStop"]["httpGet"]["path"] in routes


def test_probe_port_is_the_port_the_service_listens_on() -> None:
    container = _container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    health_port = int(_config_env().get("CAIRN_HEALTH_PORT", Settings().health_port or 0))
    for name in ("livenessProbe", "readinessProbe"):
        port = container[name]["httpGet"]["port"]
        assert ports.get(port, port) == health_port


def test_the_network_policy_keeps_the_pods_port_to_the_monitoring() -> None:
    """Only ingress is restricted, for the Deployment's pods, to their operator port: ``/drain``
    asks for no credentials."""
    policy = only(_k8s_documents(), "NetworkPolicy")
    deployment = only(_k8s_documents(), "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert selected.items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    [rule] = policy["spec"]["ingress"]
    assert rule["from"] and all("namespaceSelector" in peer for peer in rule["from"])
    container_ports = {p["name"] for p in _container()["ports"]}
    assert [p["port"] for p in rule["ports"]] == ["http"]
    assert "http" in container_ports


def _all_cairn_env() -> dict[str, dict[str, str]]:
    sources: dict[str, dict[str, str]] = {"k8s": _config_env(), "k8s:strimzi": strimzi_env()}
    for name, service in _compose()["services"].items():
        env = service.get("environment") or {}
        sources[f"compose:{name}"] = {k: str(v) for k, v in env.items()}
    for keyword, rest in _dockerfile_final_stage():
        if keyword == "ENV":
            sources["Dockerfile"] = dict(
                item.split("=", 1) for item in shlex.split(rest) if "=" in item
            )
    return {
        src: {k: v for k, v in env.items() if k.startswith("CAIRN_")}
        for src, env in sources.items()
    }


def test_every_cairn_env_name_is_a_real_setting_and_its_value_lands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sources = _all_cairn_env()
    assert sum(len(env) for env in sources.values()) > 5
    for source, env in sources.items():
        unknown = set(env) - set(SETTING_PATHS)
        assert not unknown, f"{source}: not settings: {sorted(unknown)}"
        with monkeypatch.context() as m:
            for key in list(SETTING_PATHS):
                m.delenv(key, raising=False)
            for key, value in env.items():
                m.setenv(key, value)
            settings = Settings()
        for key, value in env.items():
            landed: Any = settings
            for part in SETTING_PATHS[key]:
                landed = getattr(landed, part)
            if hasattr(landed, "get_secret_value"):
                landed = landed.get_secret_value()
            if isinstance(landed, bool):
                assert landed == (value.lower() in ("1", "true", "yes", "on")), f"{source}: {key}"
            elif isinstance(landed, int | float):
                assert landed == float(value), f"{source}: {key}"
            else:
                assert str(landed) == value, f"{source}: {key}"


def test_termination_grace_covers_the_revoke_grace() -> None:
    revoke = float(
        _config_env().get("CAIRN_RUNTIME__REVOKE_GRACE_S", Settings().runtime.revoke_grace_s)
    )
    pod = _one("Deployment")["spec"]["template"]["spec"]
    # The drain, one commit and leaving the group all have to fit.
    assert pod["terminationGracePeriodSeconds"] >= revoke + Settings().runtime.commit_timeout_s
    cairn = _compose()["services"]["cairn"]
    compose_revoke = float(cairn["environment"]["CAIRN_RUNTIME__REVOKE_GRACE_S"])
    assert int(str(cairn["stop_grace_period"]).rstrip("s")) > compose_revoke


def test_pod_runs_as_the_image_user_and_the_budget_selects_the_pods() -> None:
    pod = _one("Deployment")["spec"]["template"]
    security = pod["spec"]["securityContext"]
    assert security["runAsNonRoot"] is True
    users = [rest for keyword, rest in _dockerfile_final_stage() if keyword == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert str(security["runAsUser"]) == users[-1]
    pdb = _one("PodDisruptionBudget")
    selector = pdb["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert selector == _one("Deployment")["spec"]["selector"]["matchLabels"]


def test_image_entrypoint_is_the_cli_and_the_healthcheck_probes_livez() -> None:
    stage = _dockerfile_final_stage()
    assert stage[0][1].startswith("python:3.11-slim")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    entry = [_exec_form(rest) for keyword, rest in stage if keyword == "ENTRYPOINT"]
    assert entry and entry[-1] == ["cairn"]
    assert scripts["cairn"] == "service.console:main"
    cmd = [_exec_form(rest) for keyword, rest in stage if keyword == "CMD"]
    assert cmd and cmd[-1] == ["serve"]
    healthcheck = [rest for keyword, rest in stage if keyword == "HEALTHCHECK"]
    assert healthcheck and "/livez" in healthcheck[-1]
    assert "/livez" in _service_routes()
    assert _container()["args"] == ["serve"]


def test_compose_runs_topic_creation_once_before_the_service() -> None:
    services = _compose()["services"]
    assert services["topics"]["command"] == ["topics", "create"]
    assert services["topics"]["restart"] == "no"
    depends = services["cairn"]["depends_on"]["topics"]["condition"]
    assert depends == "service_completed_successfully"
    assert services["topics"]["build"]["dockerfile"] == "Dockerfile"
    assert (COMPOSE.parent / services["topics"]["build"]["context"] / "Dockerfile").is_file()
    kafka_env = services["kafka"]["environment"]
    assert kafka_env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    for key in ("OFFSETS_TOPIC_REPLICATION_FACTOR", "TRANSACTION_STATE_LOG_MIN_ISR"):
        assert kafka_env[f"KAFKA_{key}"] == "1"


def test_commands_the_deployment_runs_are_real_cli_commands() -> None:
    from service.cli import build_parser

    parser = build_parser()
    runs = [
        ["serve"],
        _compose()["services"]["topics"]["command"],
        _container()["args"],
        base_container("Job")["args"],
    ]
    for argv in runs:
        args = parser.parse_args(argv)
        assert callable(getattr(args, "handler", None)), argv


def test_the_agent_registries_named_by_the_deployment_load() -> None:
    from service.agent.registry import load_agent_registry

    paths = {env["CAIRN_AGENTS"] for env in _all_cairn_env().values() if "CAIRN_AGENTS" in env}
    assert paths
    for path in paths:
        assert load_agent_registry(path), path
