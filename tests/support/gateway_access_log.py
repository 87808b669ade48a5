"""What each gateway's access-log objects make its Envoy do, read offline from the objects we ship.

kgateway (HTTPListenerPolicy, BackendConfigPolicy), Istio (Telemetry, the envoyHttpAls provider
in istiod's meshConfig, DestinationRule) and Envoy Gateway (EnvoyProxy, Backend) each turn their
objects into one Envoy `envoy.access_loggers.http_grpc` logger: a log name, a CEL filter, the
request headers it records and the cluster it streams to. `plans` reads that back per Gateway,
`reference_errors` checks that everything it names exists and that an entry will carry a
completion key the EPP reads, and `envoy_access_log` renders the logger itself, so a real Envoy
in the integration tests runs exactly what the manifests configure.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from epp.picker import wire

_T = "type.googleapis.com/"
CLUSTER_DOMAIN = "svc.cluster.local"


@dataclasses.dataclass(frozen=True, slots=True)
class AccessLogPlan:
    """One gateway's gRPC access log to the EPP, as its Envoy will run it."""

    provider: str  # kgateway | istio | envoy-gateway
    gateway: str  # the Gateway whose Envoy logs
    log_name: str
    cel_filter: str  # only entries it admits are sent
    request_headers: tuple[str, ...]  # recorded in each entry's request_headers
    service: str  # the EPP Service it streams to
    namespace: str | None  # where the gateway names the Service fully qualified
    port: int
    tls: bool  # TLS to the EPP (without verification)
    http2: bool


def _by_kind(objects: Sequence[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    return [o for o in objects if o.get("kind") == kind]


def _split_fqdn(host: str) -> tuple[str, str | None]:
    """`name.namespace.svc.cluster.local` → (name, namespace); a short name → (name, None)."""
    if host.endswith("." + CLUSTER_DOMAIN):
        name, _, namespace = host.removesuffix("." + CLUSTER_DOMAIN).partition(".")
        return name, namespace
    return host, None


def _gateway_targets(policy: Mapping[str, Any]) -> list[str]:
    return [r["name"] for r in policy["spec"].get("targetRefs", []) if r.get("kind") == "Gateway"]


def _kgateway(objects: Sequence[Mapping[str, Any]]) -> list[AccessLogPlan]:
    backend_policies = {
        ref["name"]: policy["spec"]
        for policy in _by_kind(objects, "BackendConfigPolicy")
        for ref in policy["spec"]["targetRefs"]
        if ref.get("kind") == "Service"
    }
    plans = []
    for policy in _by_kind(objects, "HTTPListenerPolicy"):
        for log in policy["spec"].get("accessLog", []):
            grpc = log.get("grpcService")
            if grpc is None:
                continue
            service = grpc["backendRef"]["name"]
            settings = backend_policies.get(service, {})
            for gateway in _gateway_targets(policy):
                plans.append(
                    AccessLogPlan(
                        provider="kgateway",
                        gateway=gateway,
                        log_name=grpc["logName"],
                        cel_filter=log.get("filter", {}).get("celFilter", {}).get("match", "true"),
                        request_headers=tuple(grpc.get("additionalRequestHeadersToLog", ())),
                        service=service,
                        namespace=None,
                        port=int(grpc["backendRef"]["port"]),
                        tls=bool(settings.get("tls", {}).get("insecureSkipVerify")),
                        http2="http2ProtocolOptions" in settings,
                    )
                )
    return plans


def _istio(objects: Sequence[Mapping[str, Any]], mesh_config: Mapping[str, Any]) -> list[AccessLogPlan]:
    providers = {p["name"]: p for p in mesh_config.get("extensionProviders", [])}
    services = {s["metadata"]["name"]: s for s in _by_kind(objects, "Service")}
    tls_hosts = {
        rule["spec"]["host"]
        for rule in _by_kind(objects, "DestinationRule")
        if rule["spec"].get("trafficPolicy", {}).get("tls", {}).get("mode") == "SIMPLE"
    }
    plans = []
    for telemetry in _by_kind(objects, "Telemetry"):
        for logging in telemetry["spec"].get("accessLogging", []):
            for named in logging.get("providers", []):
                als = providers.get(named["name"], {}).get("envoyHttpAls")
                if als is None:
                    continue
                service, namespace = _split_fqdn(als["service"])
                port = int(als["port"])
                ports = services.get(service, {}).get("spec", {}).get("ports", [])
                # Istio speaks HTTP/2 to a port whose name (or appProtocol) says gRPC.
                http2 = any(
                    p["port"] == port
                    and (p.get("name", "").startswith("grpc") or p.get("appProtocol") == "grpc")
                    for p in ports
                )
                for gateway in _gateway_targets(telemetry):
                    plans.append(
                        AccessLogPlan(
                            provider="istio",
                            gateway=gateway,
                            log_name=als.get("logName", ""),
                            cel_filter=logging.get("filter", {}).get("expression", "true"),
                            request_headers=tuple(als.get("additionalRequestHeadersToLog", ())),
                            service=service,
                            namespace=namespace,
                            port=port,
                            tls=service in tls_hosts or als["service"] in tls_hosts,
                            http2=http2,
                        )
                    )
    return plans


def _envoy_gateway(objects: Sequence[Mapping[str, Any]]) -> list[AccessLogPlan]:
    proxies = {p["metadata"]["name"]: p for p in _by_kind(objects, "EnvoyProxy")}
    backends = {b["metadata"]["name"]: b for b in _by_kind(objects, "Backend")}
    plans = []
    for gateway in _by_kind(objects, "Gateway"):
        ref = gateway["spec"].get("infrastructure", {}).get("parametersRef", {})
        proxy = proxies.get(ref.get("name", "")) if ref.get("kind") == "EnvoyProxy" else None
        if proxy is None:
            continue
        for setting in proxy["spec"].get("telemetry", {}).get("accessLog", {}).get("settings", []):
            cel = " && ".join(f"({m})" for m in setting.get("matches", [])) or "true"
            for sink in setting.get("sinks", []):
                als = sink.get("als")
                if sink.get("type") != "ALS" or als is None or als.get("type") != "HTTP":
                    continue
                (backend_ref,) = als["backendRefs"]
                backend = backends.get(backend_ref["name"], {}).get("spec", {})
                (endpoint,) = backend.get("endpoints", [{"fqdn": {"hostname": "", "port": 0}}])
                service, namespace = _split_fqdn(endpoint["fqdn"]["hostname"])
                plans.append(
                    AccessLogPlan(
                        provider="envoy-gateway",
                        gateway=gateway["metadata"]["name"],
                        log_name=als.get("logName", ""),
                        cel_filter=cel,
                        request_headers=tuple(als.get("http", {}).get("requestHeaders", ())),
                        service=service,
                        namespace=namespace,
                        port=int(endpoint["fqdn"]["port"]),
                        tls=bool(backend.get("tls", {}).get("insecureSkipVerify")),
                        http2=True,  # Envoy Gateway always speaks gRPC (HTTP/2) to an ALS sink
                    )
                )
    return plans


def plans(
    objects: Sequence[Mapping[str, Any]], *, istio_mesh_config: Mapping[str, Any] | None = None
) -> list[AccessLogPlan]:
    """Every gateway access log to the EPP that `objects` configure."""
    return _kgateway(objects) + _istio(objects, istio_mesh_config or {}) + _envoy_gateway(objects)


def reference_errors(
    found: Sequence[AccessLogPlan],
    objects: Sequence[Mapping[str, Any]],
    *,
    namespace: str,
    epp_tls: bool,
) -> list[str]:
    """What would keep an access log from reaching the EPP, or its entries from being matched."""
    gateways = {g["metadata"]["name"] for g in _by_kind(objects, "Gateway")}
    services = {s["metadata"]["name"]: s for s in _by_kind(objects, "Service")}
    errors = []
    for plan in found:
        where = f"{plan.provider} access log of Gateway {plan.gateway}"
        if plan.gateway not in gateways:
            errors.append(f"{where}: no such Gateway")
        service = services.get(plan.service)
        if service is None:
            errors.append(f"{where}: no Service {plan.service}")
        else:
            ports = {p["port"]: p.get("name", "") for p in service["spec"]["ports"]}
            if ports.get(plan.port) != "grpc-ext-proc":
                errors.append(f"{where}: {plan.service}:{plan.port} is not the EPP's ext_proc port")
        if plan.namespace not in (None, namespace):
            errors.append(f"{where}: names namespace {plan.namespace}, not {namespace}")
        if plan.tls != epp_tls:
            errors.append(f"{where}: TLS {plan.tls}, but the EPP serves TLS: {epp_tls}")
        if not plan.http2:
            errors.append(f"{where}: gRPC needs HTTP/2")
        if not plan.log_name:
            errors.append(f"{where}: no log name")
        keyed_by_header = wire.COMPLETION_KEY_HEADER in plan.cel_filter
        if keyed_by_header and wire.COMPLETION_KEY_HEADER not in plan.request_headers:
            errors.append(f"{where}: filters on {wire.COMPLETION_KEY_HEADER} but does not record it")
        if not keyed_by_header and wire.COMPLETION_KEY not in plan.cel_filter:
            errors.append(f"{where}: its filter admits requests the EPP did not route: {plan.cel_filter}")
    return errors


def envoy_access_log(plan: AccessLogPlan, cluster: str) -> dict[str, Any]:
    """The `access_log` entry of the HTTP connection manager that the gateway generates from
    `plan` (Envoy's default batching: 16 KiB or 1 s), streaming to `cluster`."""
    return {
        "name": "envoy.access_loggers.http_grpc",
        "filter": {
            "extension_filter": {
                "name": "envoy.access_loggers.extension_filters.cel",
                "typed_config": {
                    "@type": _T + "envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter",
                    "expression": plan.cel_filter,
                },
            }
        },
        "typed_config": {
            "@type": _T + "envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig",
            "common_config": {
                "log_name": plan.log_name,
                "transport_api_version": "V3",
                "grpc_service": {"envoy_grpc": {"cluster_name": cluster}},
            },
            "additional_request_headers_to_log": list(plan.request_headers),
        },
    }


# What a user applies for each gateway, read from the repository's manifests.
ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository
GATEWAYS = ("kgateway", "istio", "envoy-gateway")


def _resources(path: pathlib.Path) -> list[dict[str, Any]]:
    """The objects a kustomization (or a file) holds, its resources followed the way kustomize does."""
    if path.is_dir():
        kustomization = yaml.safe_load((path / "kustomization.yaml").read_text())
        return [obj for resource in kustomization["resources"] for obj in _resources(path / resource)]
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def stack_objects(gateway: str) -> list[dict[str, Any]]:
    """What a user applies for `gateway`: the EPP, the pool and the gateway's directory."""
    return [
        *_resources(ROOT / "manifests" / "epp"),
        *_resources(ROOT / "manifests" / "samples" / "inferencepool.yaml"),
        *_resources(ROOT / "manifests" / "gateway" / gateway),
    ]


def istio_mesh_config() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((ROOT / "manifests/gateway/istio/values.yaml").read_text())
    return dict(values["meshConfig"])
