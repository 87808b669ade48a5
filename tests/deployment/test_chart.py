"""charts/inferencepool with the real helm (and kubectl for the kustomize side), offline:

- `helm lint` passes for kind's values and every provider;
- every render (kind's values per provider, active-active, the v1alpha2 API, every option on)
  validates: built-in kinds against the Kubernetes schemas, our kinds against our CRDs and the
  EPP's parser, third-party kinds for their required fields; the EPP's arguments are ones
  `epp serve` accepts;
- the chart renders the same objects as the kustomize manifests it stands beside (so the two
  never drift), for the plain EPP and active-active with the values manifests/render.sh renders
  them from, the sample pool and models, and each gateway provider;
- the LLMInferenceService controller's EPP Deployment, Service, ServiceAccount, Role and
  RoleBinding are the chart's for the values that describe them (image, ports, config file,
  adapter flags), less the controller's own names, labels and owner;
- bad values fail the render with a message that names the value to change.

helm and kubectl come from .ci/k8s_tools.sh (or PATH); without them these tests skip."""

from __future__ import annotations

import argparse
import base64
import copy
import json
import pathlib
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pytest
import yaml

from epp.errors import ConfigError
from epp.kube import leader
from epp.kube import watch as kube
from epp.operator.controller import render as controller
from epp.operator.controller.spec import parse_spec
from epp.picker.peers import PeerTlsFiles, load_peer_tls, peer_identity
from epp.picker.scheduling.picker_config import load_config
from epp.serve import settings as serve_config
from tests.deployment.tools import find, missing
from tests.support import gateway_access_log
from tests.support.kube_objects import validate

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "inferencepool"
KIND_VALUES = ROOT / "kind" / "values.yaml"
CONTROLLER_SAMPLE = ROOT / "manifests" / "controller" / "samples" / "legal-assistants.yaml"
RELEASE = "vllm-llama3-8b"
POOL_LABELS = {"inferencePool": {"modelServers": {"matchLabels": {"app": "vllm"}}}}
PROVIDERS = ("none", "istio", "kgateway", "envoy-gateway")

HELM = find("helm")
KUBECTL = find("kubectl")
pytestmark = pytest.mark.skipif(HELM is None, reason=missing("helm"))

PLUGINS = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: lora-affinity-scorer
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: lora-affinity-scorer, weight: 2}
  - {pluginRef: queue-scorer, weight: 1}
  - {pluginRef: max-score-picker}
"""


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _helm(args: Sequence[str], values: Mapping[str, Any] | None) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    command = [HELM, *args]
    if values is not None:
        command += ["--values", "-"]
    return subprocess.run(
        command,
        input=json.dumps(values) if values is not None else None,
        capture_output=True,
        text=True,
        timeout=60,
    )


def render(values: Mapping[str, Any], *extra: str, namespace: str = "default") -> list[dict[str, Any]]:
    result = _helm(["template", RELEASE, str(CHART), "--namespace", namespace, *extra], values)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render_error(values: Mapping[str, Any]) -> str:
    result = _helm(["template", RELEASE, str(CHART)], values)
    assert result.returncode != 0, f"rendered although it should not:\n{result.stdout[:2000]}"
    return result.stderr


def kind_values(**extra: Any) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(KIND_VALUES.read_text())
    return _merge(values, extra)


def provider_values(provider: str) -> dict[str, Any]:
    routes = provider != "none"
    return {"provider": {"name": provider}, "gateway": {"create": routes}, "httpRoute": {"enabled": routes}}


def one(objects: Sequence[Mapping[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return dict(found[0])


def container(objects: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    spec = one(objects, "Deployment")["spec"]["template"]["spec"]
    (epp,) = spec["containers"]
    return dict(epp)


def serve_settings(objects: Sequence[Mapping[str, Any]]) -> serve_config.ServeSettings:
    """Parse the rendered EPP arguments as `epp serve` would (the config file from the ConfigMap)."""
    args = [a.replace("$(POD_NAMESPACE)", "default") for a in container(objects)["args"]]
    assert args[0] == "serve"
    configs = [
        o for o in objects if o["kind"] == "ConfigMap" and not o["metadata"]["name"].endswith("-dashboard")
    ]
    for index, arg in enumerate(args):
        if arg.startswith("--config-file=/config/"):
            (config_map,) = configs
            args[index] = "--config-text=" + config_map["data"][arg.removeprefix("--config-file=/config/")]
    parser = argparse.ArgumentParser()
    serve_config.configure_parser(parser)
    return serve_config.settings_from_args(parser.parse_args(args[1:]))


# -- lint and render -----------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_chart_lints_with_kind_values_for_every_provider(provider: str) -> None:
    result = _helm(["lint", "--strict", str(CHART)], kind_values(**provider_values(provider)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


EVERYTHING = {
    **POOL_LABELS,
    "inferenceExtension": {
        "replicas": 2,
        "image": {"hub": "registry.example.com/lora", "tag": "0.1.0", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "registry"}],
        "secureServing": False,
        "flags": {"v": 3, "refresh-metrics-interval": "50ms"},
        "env": [{"name": "OTEL_SERVICE_NAME", "value": "lora-epp"}],
        "pluginsConfigFile": "lora.yaml",
        "pluginsCustomConfig": {"lora.yaml": PLUGINS},
        "extraContainerPorts": [{"name": "debug", "containerPort": 9100, "protocol": "TCP"}],
        "extraServicePorts": [{"name": "debug", "port": 9100, "targetPort": "debug", "protocol": "TCP"}],
        "podAnnotations": {"example.com/team": "inference"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "epp", "effect": "NoSchedule"}],
        "priorityClassName": "system-cluster-critical",
        "tracing": {"enabled": True, "otelExporterEndpoint": "http://otel-collector:4317"},
        "monitoring": {
            "prometheus": {"enabled": True, "labels": {"release": "prometheus"}},
            "grafanaDashboard": {"enabled": True},
        },
    },
    "inferenceObjectives": [{"name": "batch-jobs", "priority": -1}],
}

CASES: dict[str, dict[str, Any]] = {
    **{f"kind-{p}": kind_values(**provider_values(p)) for p in PROVIDERS},
    "minimal": POOL_LABELS,
    "active-active": _merge(
        POOL_LABELS,
        {"inferenceExtension": {"replicas": 3, "activeActive": {"enabled": True, "peerInterval": "250ms"}}},
    ),
    "v1alpha2": _merge(
        POOL_LABELS,
        {
            "inferencePool": {"apiVersion": "inference.networking.x-k8s.io/v1alpha2"},
            "inferenceModels": [{"name": "sql-lora"}],
        },
    ),
    "everything": EVERYTHING,
}


@pytest.mark.parametrize("case", CASES)
def test_every_rendered_object_validates_and_the_epp_accepts_its_arguments(case: str) -> None:
    objects = render(CASES[case])
    for obj in objects:
        validate(obj)
        assert obj["metadata"].get("namespace", "default") == "default", obj["metadata"]
    settings = serve_settings(objects)
    assert settings.pool.name == RELEASE


def test_crds_come_with_the_chart_unless_skipped() -> None:
    with_crds = render(POOL_LABELS, "--include-crds")
    names = {o["metadata"]["name"] for o in with_crds if o["kind"] == "CustomResourceDefinition"}
    assert {
        "inferencepools.inference.networking.k8s.io",
        "inferencepools.inference.networking.x-k8s.io",
        "inferencemodels.inference.networking.x-k8s.io",
        "inferenceobjectives.inference.networking.x-k8s.io",
    } <= names
    assert not any(o["kind"] == "CustomResourceDefinition" for o in render(POOL_LABELS))


def test_packaged_chart_holds_the_crds_and_renders_the_same(tmp_path: pathlib.Path) -> None:
    """`helm package` resolves crds/ (a link to manifests/crds, kept in one place) into the archive."""
    packaged = _helm(["package", str(CHART), "--destination", str(tmp_path)], None)
    assert packaged.returncode == 0, packaged.stderr
    (archive,) = tmp_path.glob("inferencepool-*.tgz")
    result = _helm(["template", RELEASE, str(archive), "--include-crds"], kind_values())
    assert result.returncode == 0, result.stderr
    from_archive = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    assert from_archive == render(kind_values(), "--include-crds")
    assert sum(o["kind"] == "CustomResourceDefinition" for o in from_archive) == 4


# -- what the values do ----------------------------------------------------------------------------


def test_one_replica_runs_alone_without_a_disruption_budget() -> None:
    objects = render(POOL_LABELS)
    assert "--ha-enable-leader-election" not in container(objects)["args"]
    assert not any(o["kind"] == "PodDisruptionBudget" for o in objects)
    assert serve_settings(objects).peers.addresses == ""


def test_more_replicas_run_active_passive_with_a_disruption_budget() -> None:
    objects = render(_merge(POOL_LABELS, {"inferenceExtension": {"replicas": 2}}))
    assert "--ha-enable-leader-election" in container(objects)["args"]
    assert one(objects, "Deployment")["spec"]["strategy"]["rollingUpdate"] == {
        "maxUnavailable": 1,
        "maxSurge": 1,
    }
    assert one(objects, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1


def test_active_active_replicas_find_each_other_by_their_pod_labels() -> None:
    """Each replica lists the Pods its own Deployment selects (through the API: no Service, no
    cluster DNS, no grant beyond the pods list the Role has anyway)."""
    objects = render(CASES["active-active"])
    settings = serve_settings(objects)
    deployment = one(objects, "Deployment")
    selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
    assert (settings.peers.selector, settings.peers.addresses, settings.peers.port) == (selector, "", 9004)
    assert (
        deployment["spec"]["selector"]["matchLabels"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    assert "--ha-enable-leader-election" not in container(objects)["args"]
    policy = one(objects, "NetworkPolicy")
    (peer_rule,) = [r for r in policy["spec"]["ingress"] if "from" in r]
    assert peer_rule["ports"] == [{"port": "grpc-peers", "protocol": "TCP"}]


def _peer_tls_mount(objects: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    """(the Secret mounted for the peer exchange, where), or None."""
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    mounts = [
        (volumes[m["name"]], m["mountPath"])
        for m in container(objects)["volumeMounts"]
        if m["name"] in volumes
    ]
    assert len(mounts) <= 1
    return mounts[0] if mounts else None


def test_active_active_peers_use_mutual_tls_with_a_ca_the_chart_makes_once(tmp_path: pathlib.Path) -> None:
    objects = render(CASES["active-active"])
    settings = serve_settings(objects)
    secret = one(objects, "Secret", f"{RELEASE}-epp-peer-tls")
    assert secret["type"] == "kubernetes.io/tls"
    mounted = _peer_tls_mount(objects)
    assert mounted is not None and mounted[0] == secret["metadata"]["name"]
    assert (settings.peers.tls_ca, settings.peers.tls_cert, settings.peers.tls_key) == tuple(
        pathlib.Path(mounted[1]) / key for key in ("ca.crt", "tls.crt", "tls.key")
    )
    assert not settings.peers.insecure
    for key, value in secret["data"].items():
        (tmp_path / key).write_bytes(base64.b64decode(value))
    files = PeerTlsFiles(tmp_path / "ca.crt", tmp_path / "tls.crt", tmp_path / "tls.key")
    # What `epp serve` checks at start: the CA signed it, the key is its key, it names this pool.
    loaded = load_peer_tls(files, peer_identity(settings.pool.namespace, settings.pool.name))
    loaded.server_context()
    # A release in another namespace gets a CA and a certificate for its own pool's name.
    other = one(render(CASES["active-active"], namespace="team-b"), "Secret")
    for key, value in other["data"].items():
        (tmp_path / key).write_bytes(base64.b64decode(value))
    load_peer_tls(files, peer_identity("team-b", settings.pool.name))
    with pytest.raises(ConfigError, match="peers of this pool expect"):
        load_peer_tls(files, peer_identity(settings.pool.namespace, settings.pool.name))


@pytest.mark.parametrize(
    ("tls", "secret", "flag"),
    [
        ({"existingSecret": "pool-peers"}, "pool-peers", "--peer-tls-ca=/etc/lora-epp/peer-tls/ca.crt"),
        ({"insecure": True}, None, "--peer-insecure"),
    ],
    ids=["existing-secret", "insecure"],
)
def test_active_active_peer_tls_options(tls: dict[str, Any], secret: str | None, flag: str) -> None:
    objects = render(_merge(CASES["active-active"], {"inferenceExtension": {"activeActive": {"tls": tls}}}))
    assert not any(o["kind"] == "Secret" for o in objects), "the chart makes no Secret then"
    assert flag in container(objects)["args"]
    mounted = _peer_tls_mount(objects)
    assert (mounted[0] if mounted else None) == secret
    serve_settings(objects)  # `epp serve` accepts the flags


def test_plugin_config_is_mounted_and_read_by_the_epp() -> None:
    objects = render(EVERYTHING)
    config_map = one(objects, "ConfigMap", f"{RELEASE}-epp")
    assert "--config-file=/config/lora.yaml" in container(objects)["args"]
    assert {"name": "config", "mountPath": "/config", "readOnly": True} in container(objects)["volumeMounts"]
    profile = load_config(config_map["data"]["lora.yaml"]).profiles[0]
    assert [e.plugin_ref for e in profile.plugins][:2] == ["lora-affinity-scorer", "queue-scorer"]
    annotations = one(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    changed = render(
        _merge(EVERYTHING, {"inferenceExtension": {"pluginsCustomConfig": {"lora.yaml": PLUGINS + "# v2\n"}}})
    )
    assert (
        one(changed, "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        != annotations["checksum/config"]
    )


def test_monitoring_scrapes_the_epp_service_and_ships_the_dashboard() -> None:
    objects = render(EVERYTHING)
    monitor = one(objects, "ServiceMonitor")
    service = one(objects, "Service", f"{RELEASE}-epp")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    dashboard = one(objects, "ConfigMap", f"{RELEASE}-epp-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((CHART / "dashboards" / "epp-dashboard.json").read_text())
    assert json.loads(dashboard["data"]["lora-epp.json"]) == shipped


def test_options_reach_the_pod() -> None:
    objects = render(EVERYTHING)
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    epp = container(objects)
    settings = serve_settings(objects)
    assert epp["image"] == "registry.example.com/lora/lora-epp:0.1.0" and epp["imagePullPolicy"] == "Always"
    assert settings.listen.secure_serving is False and settings.observability.tracing is True
    assert {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://otel-collector:4317"} in epp["env"]
    assert {"name": "OTEL_SERVICE_NAME", "value": "lora-epp"} in epp["env"]
    assert "--v=3" in epp["args"] and "--refresh-metrics-interval=50ms" in epp["args"]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert 9100 in {p["port"] for p in one(objects, "Service", f"{RELEASE}-epp")["spec"]["ports"]}


def test_role_grants_exactly_the_calls_the_code_makes() -> None:
    role = one(render(POOL_LABELS), "Role")
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == kube.API_CALLS | leader.API_CALLS


def test_older_pool_api_points_the_epp_and_models_at_its_group() -> None:
    objects = render(CASES["v1alpha2"])
    assert serve_settings(objects).pool.group == "inference.networking.x-k8s.io"
    pool = one(objects, "InferencePool")
    assert pool["spec"]["extensionRef"] == {
        "name": f"{RELEASE}-epp",
        "portNumber": 9002,
        "failureMode": "FailClose",
    }
    assert one(objects, "InferenceModel")["spec"]["poolRef"]["group"] == "inference.networking.x-k8s.io"


@pytest.mark.parametrize("provider", ["istio", "kgateway", "envoy-gateway"])
def test_provider_gateway_routes_to_the_pool(provider: str) -> None:
    objects = render(_merge(POOL_LABELS, provider_values(provider)))
    gateway = one(objects, "Gateway")
    route = one(objects, "HTTPRoute")
    assert gateway["spec"]["gatewayClassName"] == provider
    assert route["spec"]["parentRefs"][0]["name"] == gateway["metadata"]["name"]
    (backend,) = route["spec"]["rules"][0]["backendRefs"]
    assert backend == {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": RELEASE}
    rules = [o for o in objects if o["kind"] == "DestinationRule"]
    assert [r["spec"]["host"] for r in rules] == ([f"{RELEASE}-epp"] if provider == "istio" else [])


@pytest.mark.parametrize("secure", [True, False], ids=["tls", "plaintext"])
@pytest.mark.parametrize("provider", ["istio", "kgateway", "envoy-gateway"])
def test_provider_gateway_sends_its_access_log_to_the_epp(provider: str, secure: bool) -> None:
    values = _merge(
        _merge(POOL_LABELS, provider_values(provider)), {"inferenceExtension": {"secureServing": secure}}
    )
    objects = render(values, namespace="models")
    mesh = yaml.safe_load((ROOT / "manifests/gateway/istio/values.yaml").read_text())["meshConfig"]
    mesh["extensionProviders"][0]["envoyHttpAls"]["service"] = f"{RELEASE}-epp.models.svc.cluster.local"
    found = gateway_access_log.plans(objects, istio_mesh_config=mesh)
    assert [(p.provider, p.gateway) for p in found] == [(provider, "inference-gateway")]
    assert gateway_access_log.reference_errors(found, objects, namespace="models", epp_tls=secure) == []


@pytest.mark.parametrize("provider", ["istio", "kgateway", "envoy-gateway"])
def test_gateway_access_log_can_be_switched_off(provider: str) -> None:
    values = _merge(_merge(POOL_LABELS, provider_values(provider)), {"gatewayAccessLog": {"enabled": False}})
    objects = render(values)
    kinds = {"HTTPListenerPolicy", "BackendConfigPolicy", "Telemetry", "EnvoyProxy", "Backend"}
    assert not [o for o in objects if o["kind"] in kinds]
    assert "infrastructure" not in one(objects, "Gateway")["spec"]


def test_kind_values_give_the_e2e_suite_what_it_relies_on() -> None:
    objects = render(kind_values(**provider_values("kgateway")))
    epp = container(objects)
    assert one(objects, "Deployment")["spec"]["replicas"] == 2
    assert "--ha-enable-leader-election" in epp["args"] and "--v=4" in epp["args"]
    assert epp["image"] == "lora-epp:dev"
    assert one(objects, "InferencePool")["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"
    ports = {p["name"] for p in one(objects, "Service", f"{RELEASE}-epp")["spec"]["ports"]}
    assert "grpc-health" in ports, "the plain Envoy gateway health-checks each EPP replica"
    (sim,) = yaml.safe_load_all((ROOT / "manifests" / "sim" / "deployment.yaml").read_text())
    sim_args = " ".join(sim["spec"]["template"]["spec"]["containers"][0]["args"])
    models = {o["spec"]["modelName"] for o in objects if o["kind"] == "InferenceModel"}
    for adapter in ("legal-lora-v1", "legal-lora-v2", "medical-lora", "sql-lora"):
        assert adapter in sim_args and adapter in models, adapter


# -- bad values --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "inferencePool.modelServers.matchLabels is required"),
        (_merge(POOL_LABELS, {"provider": {"name": "nginx"}}), "/provider/name"),
        (
            _merge(POOL_LABELS, {"inferenceExtension": {"failureMode": "Open"}}),
            "/inferenceExtension/failureMode",
        ),
        (_merge(POOL_LABELS, {"inferenceExtension": {"replicaz": 2}}), "replicaz"),
        (
            _merge(POOL_LABELS, {"inferenceExtension": {"activeActive": {"enabled": True}}}),
            "needs inferenceExtension.replicas of 2",
        ),
        (
            _merge(POOL_LABELS, {"inferenceExtension": {"flags": {"peers": "x:1"}}}),
            "inferenceExtension.flags.peers is set by the chart",
        ),
        (
            _merge(POOL_LABELS, {"inferenceExtension": {"pluginsConfigFile": "a.yaml"}}),
            '"a.yaml" is not a key',
        ),
        (_merge(POOL_LABELS, {"httpRoute": {"enabled": True}}), "need provider.name"),
        (_merge(POOL_LABELS, {"inferenceModels": [{"name": "m", "criticality": "High"}]}), "criticality"),
    ],
    ids=[
        "no-pool-labels",
        "unknown-provider",
        "bad-failure-mode",
        "typo",
        "active-active-alone",
        "chart-owned-flag",
        "missing-plugin-file",
        "route-without-provider",
        "bad-criticality",
    ],
)
def test_bad_values_fail_with_a_message_that_names_them(values: dict[str, Any], message: str) -> None:
    assert message in render_error(values)


# -- the same objects as the kustomize manifests ----------------------------------------------------------


def _kustomize(*paths: str) -> list[dict[str, Any]]:
    if KUBECTL is None:
        pytest.skip(missing("kubectl"))
    objects: list[dict[str, Any]] = []
    for path in paths:
        target = ROOT / path
        if target.is_dir():
            result = subprocess.run(
                [KUBECTL, "kustomize", str(target)], capture_output=True, text=True, timeout=60
            )
            assert result.returncode == 0, result.stderr
            text = result.stdout
        else:
            text = target.read_text()
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


def _comparable(obj: Mapping[str, Any]) -> dict[str, Any]:
    """obj without its namespace (a kustomize build leaves it to `kubectl apply -n`), its labels
    and its pod template's labels pulled out into one set under "labels": the chart may add
    labels of its own (Helm's bookkeeping), so the test compares those as a subset."""
    normal = copy.deepcopy(dict(obj))
    labels: set[tuple[str, str, str]] = set()
    template = normal.get("spec", {}).get("template")
    places = {
        "object": normal["metadata"],
        "template": template["metadata"] if isinstance(template, dict) else {},
    }
    for where, metadata in places.items():
        metadata.pop("namespace", None)
        labels |= {(where, key, value) for key, value in metadata.pop("labels", {}).items()}
    normal["labels"] = labels
    return normal


def _by_name(objects: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): _comparable(o) for o in objects}


def _assert_same_objects(chart: Iterable[Mapping[str, Any]], kustomize: Iterable[Mapping[str, Any]]) -> None:
    """The same (kind, name)s, each field for field, the chart's labels a superset of the other's."""
    rendered, expected = _by_name(chart), _by_name(kustomize)
    assert sorted(rendered) == sorted(expected)
    for key, twin in expected.items():
        ours = rendered[key]
        assert twin.pop("labels") <= ours.pop("labels"), f"{key[0]}/{key[1]} lost labels"
        assert ours == twin, f"{key[0]}/{key[1]} differs from its kustomize twin"


def _sample_models_as_values() -> dict[str, Any]:
    models = _kustomize("manifests/samples/inferencemodels.yaml")
    (objective,) = _kustomize("manifests/samples/inferenceobjective.yaml")
    return {
        "inferenceModels": [
            {
                "name": m["metadata"]["name"],
                "modelName": m["spec"]["modelName"],
                "criticality": m["spec"]["criticality"],
            }
            | ({"targetModels": m["spec"]["targetModels"]} if "targetModels" in m["spec"] else {})
            for m in models
        ],
        "inferenceObjectives": [
            {"name": objective["metadata"]["name"], "priority": objective["spec"]["priority"]}
        ],
    }


POOL = "manifests/samples/inferencepool.yaml"


def rendered_from(directory: str) -> dict[str, Any]:
    """The values manifests/render.sh renders manifests/<directory> from."""
    values: dict[str, Any] = yaml.safe_load((ROOT / "manifests" / directory / "values.yaml").read_text())
    return values


KUSTOMIZE_CASES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "epp": (rendered_from("epp"), ("manifests/epp", POOL)),
    "epp-active-active": (rendered_from("epp-active-active"), ("manifests/epp-active-active", POOL)),
    **{
        f"gateway-{p}": (
            _merge(rendered_from("epp"), provider_values(p)),
            ("manifests/epp", POOL, f"manifests/gateway/{p}"),
        )
        for p in ("istio", "kgateway", "envoy-gateway")
    },
}


@pytest.mark.parametrize("case", KUSTOMIZE_CASES)
def test_chart_renders_what_the_kustomize_manifests_hold(case: str) -> None:
    values, paths = KUSTOMIZE_CASES[case]
    _assert_same_objects(render(values), _kustomize(*paths))


def test_chart_renders_the_sample_models_as_the_manifests_hold_them() -> None:
    values = _merge(POOL_LABELS, _sample_models_as_values())
    chart = [o for o in render(values) if o["kind"] in ("InferenceModel", "InferenceObjective")]
    samples = _kustomize(
        "manifests/samples/inferencemodels.yaml", "manifests/samples/inferenceobjective.yaml"
    )
    _assert_same_objects(chart, samples)


# -- the same EPP Deployment as the LLMInferenceService controller renders ---------------------------------


def _image_values(image: str) -> dict[str, str]:
    """The chart's image.hub/name/tag for an image reference `hub/name:tag` (hub optional)."""
    path, _, tag = image.rpartition(":")
    hub, _, name = path.rpartition("/")
    return {"hub": hub, "name": name, "tag": tag}


def _controller_values(owner: controller.Owner, settings: controller.RenderSettings) -> dict[str, Any]:
    """The chart values that describe the EPP the controller runs for `owner`: its image and
    ext_proc port, the ConfigMap's scheduler.yaml as the config file, and the adapter flags."""
    spec = parse_spec(yaml.safe_load(CONTROLLER_SAMPLE.read_text())["spec"])
    config = controller.epp_config_map(owner, spec)
    return {
        "inferencePool": {"modelServers": {"matchLabels": {controller.SERVICE_LABEL: owner.name}}},
        "inferenceExtension": {
            "image": _image_values(settings.epp_image),
            "extProcPort": settings.epp_port,
            "pluginsConfigFile": "scheduler.yaml",
            "pluginsCustomConfig": config["data"],
            "flags": {
                "adapter-catalog": f"{controller.CONFIG_DIR}/adapters.yaml",
                "adapter-state-port": settings.sidecar_port,
            },
        },
    }


def _without_owner(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object less what legitimately differs between the chart and the controller: labels
    and selectors (each has its own scheme; the controller's name the owning object) and the
    owner reference; of a Deployment also the pod's annotations (the chart rolls the pods when the
    config changes; the controller keeps adapter edits from touching the pod template) and the
    rollout strategy (the controller states maxUnavailable 0, what Kubernetes' default gives one
    replica)."""
    normal = copy.deepcopy(dict(obj))
    normal["metadata"] = {"name": normal["metadata"]["name"], "namespace": normal["metadata"]["namespace"]}
    spec = normal.get("spec", {})
    spec.pop("selector", None)
    if normal["kind"] == "Deployment":
        spec.pop("strategy", None)
        spec["template"].pop("metadata")
    return normal


CONTROLLER_SETTINGS = {
    "defaults": controller.RenderSettings(),
    "other ports and image": controller.RenderSettings(
        epp_image="registry.example:5000/team/lora-epp:v1.2.3", epp_port=9100, sidecar_port=0
    ),
}


@pytest.mark.parametrize("case", CONTROLLER_SETTINGS)
def test_controller_renders_the_charts_epp_deployment(case: str) -> None:
    settings = CONTROLLER_SETTINGS[case]
    owner = controller.Owner(RELEASE, "team-a", "uid-1")
    ours = controller.epp_deployment(owner, settings)
    chart = one(render(_controller_values(owner, settings), namespace=owner.namespace), "Deployment")
    assert ours["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert _without_owner(ours) == _without_owner(chart)


@pytest.mark.parametrize("case", CONTROLLER_SETTINGS)
def test_controller_renders_the_charts_epp_service_and_rbac(case: str) -> None:
    settings = CONTROLLER_SETTINGS[case]
    owner = controller.Owner(RELEASE, "team-a", "uid-1")
    chart = render(_controller_values(owner, settings), namespace=owner.namespace)
    ours = [controller.epp_service(owner, settings), *controller.epp_rbac(owner)]
    assert [o["kind"] for o in ours] == ["Service", "ServiceAccount", "Role", "RoleBinding"]
    for obj in ours:
        twin = one(chart, obj["kind"], obj["metadata"]["name"])
        assert _without_owner(obj) == _without_owner(twin), f"{obj['kind']} differs from the chart's"
    service = ours[0]
    pod = controller.epp_deployment(owner, settings)["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
