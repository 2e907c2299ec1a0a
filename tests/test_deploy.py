"""The container image and the Kubernetes manifests, checked without a container engine or a
cluster: hadolint on the Dockerfile; every kustomize overlay rendered by `kubectl kustomize` and
validated by kubernetes-validate (offline schemas); the rendered manifests against the code they
run (CLI commands, settings, the MCP configuration) and against what production needs."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from antwort_grpc.cli import main
from antwort_grpc.config import ExecutorSettings, GatewaySettings
from antwort_grpc.tool_services.mcp import McpBridgeSettings
from antwort_grpc.tool_services.sandbox import SandboxSettings
from antwort_grpc.tool_services.security import ExecutorSecurity

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
OVERLAYS = sorted(p.name for p in (ROOT / "deploy" / "overlays").iterdir() if p.is_dir())
UID = 10001


def render(directory: Path) -> str:
    result = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


@functools.cache
def _rendered(overlay: str) -> str:
    return render(ROOT / "deploy" / "overlays" / overlay)


def _documents(overlay: str = "prod") -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(_rendered(overlay)) if doc]


def _of_kind(kind: str, overlay: str = "prod") -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in _documents(overlay) if d["kind"] == kind}


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def _env_names(container: dict[str, Any]) -> list[str]:
    return [e["name"] for e in container.get("env", [])]


ROLES = {
    "antwort-gateway": ["serve"],
    "antwort-sandbox": ["executor", "sandbox"],
    "antwort-mcp-bridge": ["executor", "mcp"],
}


def test_the_dockerfile_passes_hadolint() -> None:
    result = subprocess.run([BIN / "hadolint", ROOT / "Dockerfile"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_there_is_a_dev_and_a_prod_overlay() -> None:
    assert OVERLAYS == ["dev", "prod"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_renders_and_passes_kubernetes_validate_with_offline_schemas(
    overlay: str, tmp_path: Path
) -> None:
    manifest = tmp_path / f"{overlay}.yaml"
    manifest.write_text(_rendered(overlay))
    cmd = [BIN / "kubernetes-validate", "--strict", manifest]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    passed = [line for line in (result.stdout + result.stderr).splitlines() if " passed for resource " in line]
    assert len(passed) == len(_documents(overlay)), result.stdout + result.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_three_roles_are_separate_deployments_with_services_of_their_own(overlay: str) -> None:
    deployments, services = _of_kind("Deployment", overlay), _of_kind("Service", overlay)
    assert set(deployments) == set(ROLES)
    for name, args in ROLES.items():
        deployment = deployments[name]
        container = _container(deployment)
        assert container["args"] == args
        assert container["image"] == "antwort-grpc:0.1.0", "one image runs every role"
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        service = services[name]
        assert service["spec"]["selector"].items() <= labels.items()
        port = container["ports"][0]
        assert service["spec"]["ports"][0]["targetPort"] == port["name"] == "grpc"


def _tls_executor(container: dict[str, Any]) -> bool:
    """Whether the role's own port speaks TLS (an executor's, or the gateway's)."""
    return bool({"ANTWORT_EXECUTOR_TLS_CERT", "ANTWORT_TLS_CERT"} & set(_env_names(container)))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_role_is_probed_on_the_grpc_health_service_or_its_port_under_tls(overlay: str) -> None:
    readiness = {
        "antwort-gateway": "antwort.v1.ResponsesService",
        "antwort-sandbox": "antwort.v1.ToolExecutorService",
        "antwort-mcp-bridge": "antwort.v1.ToolExecutorService",
    }
    for name, deployment in _of_kind("Deployment", overlay).items():
        container = _container(deployment)
        port = container["ports"][0]["containerPort"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if _tls_executor(container):
                # The kubelet's gRPC probes cannot speak TLS: the port is checked instead.
                assert container[probe] == {**container[probe], "tcpSocket": {"port": port}}, (name, probe)
                assert "grpc" not in container[probe]
            else:
                assert container[probe]["grpc"]["port"] == port, (name, probe)
        if not _tls_executor(container):
            assert container["readinessProbe"]["grpc"]["service"] == readiness[name]
        listen = _env(container).get("ANTWORT_LISTEN") or _env(container)["ANTWORT_EXECUTOR_LISTEN"]
        assert listen == f"0.0.0.0:{port}"


def test_the_sandbox_pod_is_locked_down() -> None:
    spec = _of_kind("Deployment")["antwort-sandbox"]["spec"]["template"]["spec"]
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] == UID
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    container = _container(_of_kind("Deployment")["antwort-sandbox"])
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert context.get("privileged", False) is False
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]], "the only writable place is an emptyDir at /tmp"
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/tmp"}
    assert all("secret" in volumes[name] for path, name in mounts.items() if path != "/tmp")
    assert _env(container)["ANTWORT_SANDBOX_WORKDIR_ROOT"] == "/tmp"


def test_the_sandbox_may_be_called_by_the_gateway_only_and_may_call_no_one() -> None:
    policy = _of_kind("NetworkPolicy")["antwort-sandbox"]["spec"]
    assert policy["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "antwort-sandbox"}
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    assert "egress" not in policy, "no egress rule: all egress denied"
    [rule] = policy["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "antwort-gateway"}}}]


def test_every_pod_runs_as_the_images_non_root_user() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    users = re.findall(r"^USER (\S+)$", dockerfile, re.M)
    assert users[-1] == f"{UID}:{UID}", "a numeric user lets Kubernetes verify runAsNonRoot"
    for name, deployment in _of_kind("Deployment").items():
        pod = deployment["spec"]["template"]["spec"]["securityContext"]
        assert (pod["runAsNonRoot"], pod["runAsUser"]) == (True, UID), name
        context = _container(deployment)["securityContext"]
        assert context["allowPrivilegeEscalation"] is False and context["capabilities"] == {"drop": ["ALL"]}


def test_the_gateway_reaches_each_executor_through_its_service() -> None:
    services = _of_kind("Service")
    gateway = _container(_of_kind("Deployment")["antwort-gateway"])
    targets = GatewaySettings(executors=_env(gateway)["ANTWORT_EXECUTORS"]).executors
    assert len(targets) == 2
    for target in targets:
        host, port = target.removeprefix("dns:///").rsplit(":", 1)
        service = services[host]
        assert service["spec"]["ports"][0]["port"] == int(port)
        # Headless: every pod's address resolves, so calls spread over the executor's replicas.
        assert service["spec"]["clusterIP"] == "None"


@pytest.mark.parametrize("args", list(ROLES.values()), ids=list(ROLES))
def test_every_container_runs_a_command_the_cli_has(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main([*args, "--help"])
    assert raised.value.code == 0
    assert "usage: antwort-grpc" in capsys.readouterr().out


def _settings_for(name: str, role: str = "") -> type[Any]:
    if role == "antwort-gateway" and name.startswith("ANTWORT_"):
        # The gateway's own settings include its side of the executors (ANTWORT_EXECUTOR_CA, …).
        return GatewaySettings
    for prefix, settings in (
        ("ANTWORT_EXECUTOR_", ExecutorSettings),
        ("ANTWORT_SANDBOX_", SandboxSettings),
        ("ANTWORT_MCP_", McpBridgeSettings),
        ("ANTWORT_", GatewaySettings),
    ):
        if name.startswith(prefix):
            return settings
    raise AssertionError(f"{name} is not an antwort-grpc setting")


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in list(os.environ):
        if name.startswith("ANTWORT_"):
            monkeypatch.delenv(name)
    yield monkeypatch


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_environment_variable_of_the_manifests_is_a_setting_with_a_valid_value(
    overlay: str, clean_environment: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name, deployment in _of_kind("Deployment", overlay).items():
        container = _container(deployment)
        for variable in _env_names(container):
            settings = _settings_for(variable, name)
            prefix = settings.model_config["env_prefix"]
            field = variable.removeprefix(prefix).lower()
            assert field in settings.model_fields, f"{name}: {variable} is not a field of {settings.__name__}"
        values = _env(container)
        if "ANTWORT_MCP_CONFIG" in values:
            # Checked on its own below; the file exists only in the pod.
            values["ANTWORT_MCP_CONFIG"] = str(tmp_path / "servers.json")
        for variable, value in values.items():
            clean_environment.setenv(variable, value)
        for settings in {_settings_for(v, name) for v in values}:
            settings()  # raises on a value the role would refuse
        for variable in values:
            clean_environment.delenv(variable)


def test_the_mcp_servers_configmap_is_a_valid_bridge_configuration(tmp_path: Path) -> None:
    configmap = _of_kind("ConfigMap")["antwort-mcp-servers"]
    deployment = _of_kind("Deployment")["antwort-mcp-bridge"]
    container = _container(deployment)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    [config_volume] = [n for n, v in volumes.items() if v.get("configMap", {}).get("name") == "antwort-mcp-servers"]
    [key] = configmap["data"]
    assert _env(container)["ANTWORT_MCP_CONFIG"] == f"{mounts[config_volume]}/{key}"
    path = tmp_path / key
    path.write_text(configmap["data"][key])
    servers = McpBridgeSettings(config=path).load_servers()
    assert [s.label for s in servers] == ["docs", "tickets"]
    secret_mounts = [mounts[n] for n, v in volumes.items() if "secret" in v]
    for server in servers:
        # Tokens come from files of the mounted Secret, never inline from the ConfigMap.
        assert server.headers == {}
        for header in server.header_files.values():
            assert any(str(header.path).startswith(m + "/") for m in secret_mounts), header.path


def test_the_image_is_built_from_the_package_only_without_the_local_model() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    included = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert "*" in ignore, "the build context starts empty; what the image needs is listed"
    for sources in re.findall(r"^COPY (?!--from)(.+) \S+$", dockerfile, re.M):
        for source in sources.split():
            assert (ROOT / source).exists(), source
            assert source.rstrip("/") in included, f"{source} is excluded by .dockerignore"
    installs = re.findall(r"pip install [^\n]*", dockerfile)
    assert installs and all("[" not in line and "local-model" not in line for line in installs)
    assert re.search(r'^ENTRYPOINT \["antwort-grpc"\]$', dockerfile, re.M)
    assert re.search(r'^CMD \["serve"\]$', dockerfile, re.M)


def _replicas(overlay: str, name: str) -> int:
    replicas: int = _of_kind("Deployment", overlay)[name]["spec"]["replicas"]
    return replicas


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_more_than_one_gateway_needs_the_postgresql_url_and_never_falls_back_to_a_file(overlay: str) -> None:
    container = _container(_of_kind("Deployment", overlay)["antwort-gateway"])
    store = [e for e in container.get("env", []) if e["name"] == "ANTWORT_STORE"]
    if _replicas(overlay, "antwort-gateway") > 1:
        [variable] = store
        ref = variable["valueFrom"]["secretKeyRef"]
        assert ref["optional"] is False, "a missing store Secret must stop the pod, not leave it on SQLite"
    else:
        assert store == [], "one gateway keeps its responses in its SQLite file"


def test_dev_is_one_gateway_on_sqlite_without_authentication() -> None:
    container = _container(_of_kind("Deployment", "dev")["antwort-gateway"])
    assert _replicas("dev", "antwort-gateway") == 1
    env = _env(container)
    assert env["ANTWORT_AUTH"] == "none" and env["ANTWORT_ALLOW_UNAUTHENTICATED"] == "true"
    assert "ANTWORT_STORE" not in _env_names(container)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_executor_may_listen_on_its_pod_address(overlay: str, clean_environment: pytest.MonkeyPatch) -> None:
    """An executor without a token or mutual TLS refuses a non-loopback address unless told that
    something else (here a NetworkPolicy) guards it: the dev overlay says so, prod needs neither."""
    for name, deployment in _of_kind("Deployment", overlay).items():
        if ROLES[name][0] != "executor":
            continue
        for variable, value in _env(_container(deployment)).items():
            clean_environment.setenv(variable, value)
        settings = ExecutorSettings()
        security = ExecutorSecurity(
            token="set" if settings.token or settings.token_file else None,
            mutual_tls=settings.tls_client_ca is not None,
            allow_unauthenticated=settings.allow_unauthenticated,
        )
        security.refuse_open_listen(settings.listen)  # a StartupError fails the test
        if overlay == "prod":
            assert security.admits_only_the_gateway and not settings.allow_unauthenticated, name
        for variable in _env(_container(deployment)):
            clean_environment.delenv(variable)


def _mounted(container: dict[str, Any], path: str, deployment: dict[str, Any]) -> dict[str, Any]:
    """The Secret volume a file path of the container lies in."""
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    for mount in container["volumeMounts"]:
        if path.startswith(mount["mountPath"] + "/"):
            volume: dict[str, Any] = volumes[mount["name"]]
            assert "secret" in volume and mount.get("readOnly") is True, path
            return volume
    raise AssertionError(f"{path} is not on a mounted volume")


def test_prod_runs_several_gateways_with_authentication_and_mutual_tls_to_the_executors() -> None:
    deployments = _of_kind("Deployment", "prod")
    assert _replicas("prod", "antwort-gateway") >= 2
    gateway = deployments["antwort-gateway"]
    container = _container(gateway)
    env = _env(container)
    assert env["ANTWORT_AUTH"] in ("api_key", "jwt")
    for variable in ("ANTWORT_API_KEYS_FILE", "ANTWORT_EXECUTOR_CA", "ANTWORT_EXECUTOR_CLIENT_CERT"):
        _mounted(container, env[variable], gateway)
    _mounted(container, env["ANTWORT_EXECUTOR_CLIENT_KEY"], gateway)
    gateway_token = _mounted(container, env["ANTWORT_EXECUTOR_TOKEN_FILE"], gateway)["secret"]["secretName"]
    for name in ("antwort-sandbox", "antwort-mcp-bridge"):
        executor = deployments[name]
        executor_env = _env(_container(executor))
        for variable in ("ANTWORT_EXECUTOR_TLS_CERT", "ANTWORT_EXECUTOR_TLS_KEY", "ANTWORT_EXECUTOR_TLS_CLIENT_CA"):
            _mounted(_container(executor), executor_env[variable], executor)
        token = _mounted(_container(executor), executor_env["ANTWORT_EXECUTOR_TOKEN_FILE"], executor)
        assert token["secret"]["secretName"] == gateway_token, "the gateway and the executors share one token"


def test_prod_serves_its_clients_over_tls_with_a_certificate_from_a_secret() -> None:
    gateway = _of_kind("Deployment", "prod")["antwort-gateway"]
    container = _container(gateway)
    env = _env(container)
    cert = _mounted(container, env["ANTWORT_TLS_CERT"], gateway)
    assert _mounted(container, env["ANTWORT_TLS_KEY"], gateway) == cert
    assert cert["secret"]["secretName"] == "antwort-gateway-tls"
    assert "optional" not in cert["secret"], "without its certificate the gateway must not start in plaintext"
    services = _of_kind("Service", "prod")
    for name in ("antwort-gateway", "antwort-gateway-headless"):
        grpc_port = next(p for p in services[name]["spec"]["ports"] if p["name"] == "grpc")
        assert grpc_port["appProtocol"] == "https", (name, "HTTP/2 over TLS, not h2c")
    # The operator is told which Secret to make, and for which names.
    kustomization = (ROOT / "deploy/overlays/prod/kustomization.yaml").read_text()
    assert "antwort-gateway-tls" in kustomization and "antwort-gateway-headless" in kustomization


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_gateways_are_reachable_per_connection_and_per_call_and_connections_are_rebalanced(overlay: str) -> None:
    deployment = _of_kind("Deployment", overlay)["antwort-gateway"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    services = _of_kind("Service", overlay)
    # kube-proxy's ClusterIP balances connections; the headless Service gives round_robin every pod.
    assert services["antwort-gateway"]["spec"].get("clusterIP") != "None"
    headless = services["antwort-gateway-headless"]["spec"]
    assert headless["clusterIP"] == "None" and headless["selector"].items() <= labels.items()
    assert [p["targetPort"] for p in headless["ports"]] == ["grpc"]
    assert not headless.get("publishNotReadyAddresses"), "a draining gateway must leave the DNS answer"
    # Connections through the ClusterIP are moved now and then, without cutting their streams.
    env = _env(_container(deployment))
    settings = GatewaySettings(max_connection_age=env["ANTWORT_MAX_CONNECTION_AGE"])
    assert settings.max_connection_age > 0 and settings.max_connection_age_grace is None
    assert "ANTWORT_MAX_CONNECTION_AGE_GRACE" not in env


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_deployment_has_a_disruption_budget_and_spreads_over_nodes(overlay: str) -> None:
    budgets = _of_kind("PodDisruptionBudget", overlay)
    for name, deployment in _of_kind("Deployment", overlay).items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert budgets[name]["spec"]["selector"]["matchLabels"].items() <= labels.items()
        spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
        assert "kubernetes.io/hostname" in {c["topologyKey"] for c in spread}
        assert all(c["labelSelector"]["matchLabels"].items() <= labels.items() for c in spread)
    assert budgets["antwort-gateway"]["spec"].get("minAvailable", 0) < max(_replicas(overlay, "antwort-gateway"), 2)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_gateway_exposes_metrics_on_their_own_port_with_scrape_annotations(overlay: str) -> None:
    deployment = _of_kind("Deployment", overlay)["antwort-gateway"]
    container = _container(deployment)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/path"] == "/metrics"
    assert int(annotations["prometheus.io/port"]) == ports["metrics"] != ports["grpc"]
    assert _env(container)["ANTWORT_METRICS_LISTEN"] == f"0.0.0.0:{ports['metrics']}"
    service = _of_kind("Service", overlay)["antwort-gateway"]
    assert {p["name"] for p in service["spec"]["ports"]} == {"grpc", "http", "metrics"}
    # The Open Responses HTTP door, on a port of its own.
    assert _env(container)["ANTWORT_HTTP_LISTEN"] == f"0.0.0.0:{ports['http']}"


def _rule_sources(rule: dict[str, Any]) -> list[dict[str, Any]]:
    sources: list[dict[str, Any]] = rule.get("from", [])
    return sources


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_let_only_the_gateway_call_the_executors(overlay: str) -> None:
    policies = _of_kind("NetworkPolicy", overlay)
    assert set(policies) == {"antwort-gateway", "antwort-sandbox", "antwort-mcp-bridge"}
    only_gateway = [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "antwort-gateway"}}}]
    for name in ("antwort-sandbox", "antwort-mcp-bridge"):
        [rule] = policies[name]["spec"]["ingress"]
        assert _rule_sources(rule) == only_gateway
    gateway = policies["antwort-gateway"]["spec"]
    assert set(gateway["policyTypes"]) == {"Ingress", "Egress"}
    ports = {p["port"] for rule in gateway["ingress"] for p in rule["ports"]}
    assert ports == {50051, 8080, 9464}
    executor_rule = next(r for r in gateway["egress"] if any("podSelector" in t for t in r.get("to", [])))
    assert {p["port"] for p in executor_rule["ports"]} == {50061}


def test_the_image_can_be_pinned_by_digest(tmp_path: Path) -> None:
    digest = "sha256:" + "0123456789abcdef" * 4
    prod = os.path.relpath(ROOT / "deploy" / "overlays" / "prod", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [prod],
                "images": [{"name": "antwort-grpc", "newName": "registry.example/antwort-grpc", "digest": digest}],
            }
        )
    )
    pinned = [d for d in yaml.safe_load_all(render(tmp_path)) if d and d["kind"] == "Deployment"]
    assert len(pinned) == 3
    assert {_container(d)["image"] for d in pinned} == {f"registry.example/antwort-grpc@{digest}"}
