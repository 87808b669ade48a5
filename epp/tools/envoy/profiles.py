"""The ext_proc filter each gateway builds for an InferencePool, reproduced on our Envoy bootstrap.

kgateway, Istio and Envoy Gateway + Envoy AI Gateway write the ext_proc filter themselves; a user
cannot change its processing mode. `apply_profile` rewrites the ext_proc filter of a bootstrap
from `build_bootstrap` to one gateway's settings, so the EPP can be tested against what that
gateway really sends it (the listener, clusters and access log stay ours).

What every one of them sets (read from their source): request headers SEND, request body
FULL_DUPLEX_STREAMED, request trailers SEND, response headers SEND, response body
FULL_DUPLEX_STREAMED, response trailers SEND; no `allow_mode_override`, no
`route_cache_action` (DEFAULT: the route is recomputed when the EPP asks, which it does on
its headers reply). The rest differs per gateway:

- kgateway: `message_timeout` 5 s, `failure_mode_allow` from the pool's failureMode, metadata
  forwarded in `envoy.lb.subset_hint` and received in `envoy.lb`.
- Istio: the same processing mode and `envoy.lb` metadata; `failure_mode_allow` from the pool.
- Envoy AI Gateway: the same processing mode; its filter names no receiving namespace, so the
  EPP's pick reaches Envoy as the destination header only, which its pool cluster reads
  (override_host with a header source). `apply_profile` points our override-host cluster at the
  header the same way.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from epp.picker import wire

EXT_PROC_FILTER = "envoy.filters.http.ext_proc"
OVERRIDE_HOST_POLICY = "envoy.load_balancing_policies.override_host"


class Gateway(enum.Enum):
    KGATEWAY = "kgateway"
    ISTIO = "istio"
    ENVOY_AI_GATEWAY = "envoy-ai-gateway"


@dataclasses.dataclass(frozen=True, slots=True)
class GatewayProfile:
    """One gateway's ext_proc filter settings for an InferencePool."""

    gateway: Gateway
    message_timeout_s: float | None
    forwarding_namespaces: tuple[str, ...]
    receiving_namespaces: tuple[str, ...]

    @property
    def routes_by_metadata(self) -> bool:
        """Whether the EPP's pick reaches Envoy as `envoy.lb` metadata; otherwise as the header only."""
        return "envoy.lb" in self.receiving_namespaces


# The processing mode every gateway builds; none of them lets the EPP or a user change it.
GATEWAY_PROCESSING_MODE: dict[str, str] = {
    "request_header_mode": "SEND",
    "request_body_mode": "FULL_DUPLEX_STREAMED",
    "request_trailer_mode": "SEND",
    "response_header_mode": "SEND",
    "response_body_mode": "FULL_DUPLEX_STREAMED",
    "response_trailer_mode": "SEND",
}

PROFILES: dict[Gateway, GatewayProfile] = {
    Gateway.KGATEWAY: GatewayProfile(Gateway.KGATEWAY, 5.0, ("envoy.lb.subset_hint",), ("envoy.lb",)),
    Gateway.ISTIO: GatewayProfile(Gateway.ISTIO, None, (), ("envoy.lb",)),
    Gateway.ENVOY_AI_GATEWAY: GatewayProfile(Gateway.ENVOY_AI_GATEWAY, None, (), ()),
}


def _connection_managers(bootstrap: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        network_filter["typed_config"]
        for listener in bootstrap["static_resources"]["listeners"]
        for chain in listener["filter_chains"]
        for network_filter in chain["filters"]
        if "http_filters" in network_filter["typed_config"]
    ]


def _ext_proc_filters(bootstrap: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        http_filter["typed_config"]
        for manager in _connection_managers(bootstrap)
        for http_filter in manager["http_filters"]
        if http_filter["name"] == EXT_PROC_FILTER
    ]


def _override_host_policies(bootstrap: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for cluster in bootstrap["static_resources"]["clusters"]:
        for policy in cluster.get("load_balancing_policy", {}).get("policies", []):
            extension = policy["typed_extension_config"]
            if extension["name"] == OVERRIDE_HOST_POLICY:
                found.append(extension["typed_config"])
    return found


def _route_by_header(bootstrap: dict[str, Any]) -> None:
    """What a gateway that receives no metadata from the EPP reads instead: the headers it set.

    The pool cluster picks the host named in the destination header; a FailClose route that
    needed the pick in metadata needs it in the header; the access log keeps the requests that
    carry the completion key header, and logs that header so the EPP can match the entry.
    """
    policies = _override_host_policies(bootstrap)
    if not policies:
        raise ValueError("a gateway that routes by header needs the override-host upstream")
    for policy in policies:
        policy["override_host_sources"] = [{"header": wire.DESTINATION_ENDPOINT_HEADER}]
    for manager in _connection_managers(bootstrap):
        for host in manager.get("route_config", {}).get("virtual_hosts", []):
            for route in host["routes"]:
                match = route["match"]
                if match.pop("dynamic_metadata", None) is not None:
                    match["headers"] = [{"name": wire.DESTINATION_ENDPOINT_HEADER, "present_match": True}]
        for log in manager.get("access_log", []):
            log["filter"] = {
                "header_filter": {"header": {"name": wire.COMPLETION_KEY_HEADER, "present_match": True}}
            }
            log["typed_config"]["additional_request_headers_to_log"] = [wire.COMPLETION_KEY_HEADER]


def apply_profile(bootstrap: dict[str, Any], profile: GatewayProfile) -> None:
    """Rewrite every ext_proc filter of `bootstrap` (from `build_bootstrap`) to `profile`'s settings.

    `failure_mode_allow` and the gRPC service stay as built (the pool's failure mode, our EPP
    cluster). Settings the gateway does not write are removed, so Envoy's defaults apply. Where
    the gateway receives no metadata, routing and the access log read the EPP's headers instead.
    """
    if not profile.routes_by_metadata:
        _route_by_header(bootstrap)
    filters = _ext_proc_filters(bootstrap)
    if not filters:
        raise ValueError("the bootstrap has no ext_proc filter")
    for config in filters:
        for name in ("route_cache_action", "max_message_timeout", "status_on_error", "allow_mode_override"):
            config.pop(name, None)
        config["processing_mode"] = dict(GATEWAY_PROCESSING_MODE)
        if profile.message_timeout_s is None:
            config.pop("message_timeout", None)
        else:
            config["message_timeout"] = f"{profile.message_timeout_s:.3f}s"
        metadata: dict[str, Any] = {}
        if profile.forwarding_namespaces:
            metadata["forwarding_namespaces"] = {"untyped": list(profile.forwarding_namespaces)}
        if profile.receiving_namespaces:
            metadata["receiving_namespaces"] = {"untyped": list(profile.receiving_namespaces)}
        if metadata:
            config["metadata_options"] = metadata
        else:
            config.pop("metadata_options", None)
