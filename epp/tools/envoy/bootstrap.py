"""Envoy bootstrap builder: a listener that asks the EPP where each request goes.

The bootstrap is built as plain dicts (Envoy's own JSON/YAML shape) so it can be printed,
diffed and checked with `envoy --mode validate`; every variant is validated that way in the
unit tests. The decisive settings and why they are what they are:

- The EPP cluster speaks HTTP/2 (gRPC), optionally over TLS without verification (the EPP
  serves a self-signed certificate by default).
- `metadata_options.receiving_namespaces.untyped: [envoy.lb]`, or Envoy drops the EPP's pick.
- A `header_mutation` filter before ext_proc removes client-sent destination headers, and
  Envoy reads the EPP's pick from `envoy.lb` dynamic metadata only, which a client cannot set:
  a client never chooses the address Envoy dials.
- Upstream `override-host` (default): a cluster of the pool's pods with Envoy's override_host
  policy. It takes the EPP's ordered list (`a:p,b:p,c:p`: pick + fallbacks), retries along it
  when a pod refuses the connection, never dials an address outside the pool, and with no
  pick at all (the EPP is down and the pool fails open) balances round robin, so FailOpen
  really serves. Upstream `original-dst` dials the single `ip:port` the EPP names (pods not
  known in advance); a FailOpen fallback cluster of the known pods serves what the EPP did not
  pick.
- FailClose: a request that reaches the router without a pick (route matched on the
  `envoy.lb` metadata) gets a 503 JSON error, never an arbitrary pod.
- The request body is BUFFERED by default: Envoy keeps it while the EPP routes, so an EPP that
  dies mid-routing (SIGKILL, OOM) costs nothing in FailOpen: the request goes on without a pick.
  In FULL_DUPLEX_STREAMED Envoy hands the body over and cannot fail open once the first chunk
  went out; a kill loses the requests being routed (benchmarks/buffered_body.py measures what
  buffering costs). Envoy may buffer as much request body as the EPP accepts (the listener's
  `per_connection_buffer_limit_bytes` is the EPP's `--max-request-body-bytes`): a larger body
  gets 413 from Envoy, before it is buffered whole. FULL_DUPLEX_STREAMED also sends a request
  that ends with HTTP trailers upstream with its body twice (Envoy 1.40 replays the route's retry
  buffer when the trailers are let go; tests/integration/test_envoy_trailers.py); BUFFERED does not.
- An active gRPC health check on the EPP (with panic routing off) makes Envoy see a dead EPP
  before a request starts, so its stream fails at once and fail-open applies.
- The EPP sees the request only (response header SKIP, body NONE): its ext_proc stream ends
  once the request is routed, so an EPP that stops or dies never cuts a response, and its CPU
  per request does not grow with the response. How each request ended reaches the EPP through
  Envoy's gRPC access logger, batched, sent to the same cluster (`--process-responses` puts the
  response body back through the EPP, for token usage, at a cost per streamed chunk).
- FailClose while the EPP is down answers 503 with an OpenAI-shaped JSON error (a local reply
  mapper on ext_proc's own errors), not an empty 500.
- A refused connection to the EPP ejects it from its cluster at once (outlier detection on
  local-origin errors), so a dead EPP fails the requests routing at that instant and the first
  to find it gone, not every request until the next health check.
- Circuit breakers are raised on every cluster: Envoy's defaults (1024 requests, 3 retries in
  flight) would refuse retries to a fallback pod, and ext_proc streams, under load.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
from collections.abc import Sequence
from typing import Any

import yaml

from epp.errors import ConfigError
from epp.picker import wire
from epp.picker.datastore.types import FailureMode
from epp.picker.extproc.stream import BodyMode

EXT_PROC_HEALTH_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
ACCESS_LOG_NAME = "lora-epp"
# Far above any real load: the limits exist to protect a proxy from a runaway client, not from us.
CIRCUIT_BREAKER_LIMIT = 100_000
EPP_UNAVAILABLE_BODY = (
    '{"error":{"message":"inference gateway: ServiceUnavailable - the endpoint picker is unavailable",'
    '"type":"ServiceUnavailable","code":503}}'
)
EPP_TIMEOUT_BODY = (
    '{"error":{"message":"inference gateway: GatewayTimeout - the endpoint picker did not answer in time",'
    '"type":"GatewayTimeout","code":504}}'
)

EPP_CLUSTER = "epp"
POOL_CLUSTER = "pool"
PICKED_CLUSTER = "picked_endpoint"
FALLBACK_CLUSTER = "pool_fallback"
ROUND_ROBIN_CLUSTER = "pool_round_robin"

_T = "type.googleapis.com/"

# The request body modes a bootstrap may ask for, in the order they are offered. The EPP routes
# on the body, so ext_proc must send it: the picker's headers-only NONE is not one of them.
BODY_MODES = (BodyMode.FULL_DUPLEX_STREAMED, BodyMode.BUFFERED)


class Upstream(enum.Enum):
    """How Envoy dials the EPP's pick.

    `override-host`: a cluster of the pool's pods with Envoy's override_host policy; understands
    the EPP's fallback list (`a:p,b:p`) and retries along it. Needs the pods up front.
    `original-dst`: dials whatever single `ip:port` the EPP names; for pools whose pods are not
    known when Envoy starts. Needs the EPP to emit one endpoint (`maxNumOfEndpoints: 1`).
    """

    OVERRIDE_HOST = "override-host"
    ORIGINAL_DST = "original-dst"


class RoutingMode(enum.Enum):
    """`epp`: route through the EPP; `round-robin`: a plain cluster of the pods, no ext_proc."""

    EPP = "epp"
    ROUND_ROBIN = "round-robin"


@dataclasses.dataclass(frozen=True, slots=True)
class HostPort:
    host: str
    port: int

    @property
    def is_ip(self) -> bool:
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            return False
        return True


def parse_host_port(text: str) -> HostPort:
    """`10.0.0.5:8000`, `[fd00::5]:8000` or `name.ns.svc:8000` → HostPort; ConfigError otherwise."""
    value = text.strip()
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ConfigError(f"expected HOST:PORT, got {text!r}")
    port = int(port_text)
    if not 0 < port < 65536:
        raise ConfigError(f"port out of range in {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return HostPort(host, port)


# Where `epp serve` listens by default on this host: ext_proc and gRPC health.
DEFAULT_EPP = HostPort("127.0.0.1", 9002)
DEFAULT_EPP_HEALTH_PORT = 9003


@dataclasses.dataclass(frozen=True, slots=True)
class EppEndpoint:
    """One more EPP replica: its ext_proc address and gRPC health port (None: not health-checked)."""

    address: HostPort
    health_port: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class EnvoyOptions:
    """Everything the bootstrap depends on; defaults match `epp serve`'s defaults."""

    listen_address: str = "0.0.0.0"
    listen_port: int = 8081
    admin_address: str = "127.0.0.1"
    admin_port: int = 0  # 0 = ephemeral; read it back from --admin-address-path
    mode: RoutingMode = RoutingMode.EPP
    upstream: Upstream = Upstream.OVERRIDE_HOST
    epp: HostPort = DEFAULT_EPP
    # The EPP's gRPC health port; None = no active check.
    epp_health_port: int | None = DEFAULT_EPP_HEALTH_PORT
    more_epps: tuple[EppEndpoint, ...] = ()  # further replicas in the EPP cluster
    epp_tls: bool = True
    # BUFFERED: Envoy holds the body while the EPP routes, so a dying EPP fails open (module doc).
    body_mode: BodyMode = BodyMode.BUFFERED
    # The most request body Envoy buffers (its listener's per-connection buffer limit; the routes'
    # own limits do not reach ext_proc's buffer in Envoy 1.40): the EPP's limit (`epp serve
    # --max-request-body-bytes`), so Envoy refuses (413) only what the EPP would refuse anyway.
    max_request_body_bytes: int = wire.DEFAULT_MAX_REQUEST_BODY_BYTES
    # Response headers SEND + response body FULL_DUPLEX_STREAMED: the EPP reads usage, and is on
    # the response path (CPU per streamed chunk; an EPP crash cuts responses in flight).
    process_responses: bool = False
    # Envoy's gRPC access log to the EPP: how each routed request ended (completion, status, timing).
    access_log: bool = True
    # As often as `epp serve` scrapes the pods by default: what it knows of requests that ended
    # is no staler than what it knows of the pods' queues.
    access_log_flush_interval_s: float = 0.1
    failure_mode: FailureMode = FailureMode.FAIL_CLOSE
    # The pool's pods: the FailOpen fallback and the round-robin mode's cluster.
    pool_endpoints: tuple[HostPort, ...] = ()
    # Longer than a request may wait in the EPP's flow-control queue (its TTL, 60 s by default):
    # while it waits, no byte moves on its stream.
    stream_idle_timeout_s: float = 120.0
    route_timeout_s: float = 300.0
    message_timeout_s: float = 1.0  # BUFFERED only; Envoy ignores it in FULL_DUPLEX_STREAMED
    # BUFFERED only: how far the EPP may extend one message's timeout while its request waits in
    # the flow-control queue or for an adapter load (it asks for its TTL and a margin, 90 s).
    max_message_timeout_s: float = 120.0
    upstream_connect_timeout_s: float = 1.0
    health_check_interval_s: float = 1.0
    num_retries: int = 2  # on connect failure / reset, to the next endpoint


def _duration(seconds: float) -> str:
    return f"{seconds:.3f}s"


def _socket_address(address: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": address, "port_value": port}}


def _static_or_dns_cluster(
    name: str, endpoints: Sequence[HostPort], connect_timeout_s: float
) -> dict[str, Any]:
    cluster_type = "STATIC" if all(ep.is_ip for ep in endpoints) else "STRICT_DNS"
    return {
        "name": name,
        "type": cluster_type,
        "connect_timeout": _duration(connect_timeout_s),
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {"endpoint": {"address": _socket_address(ep.host, ep.port)}} for ep in endpoints
                    ]
                }
            ],
        },
    }


def _circuit_breakers() -> dict[str, Any]:
    limit = CIRCUIT_BREAKER_LIMIT
    return {
        "thresholds": [
            {
                "max_connections": limit,
                "max_pending_requests": limit,
                "max_requests": limit,
                "max_retries": limit,
            }
        ]
    }


def _epp_endpoints(options: EnvoyOptions) -> tuple[EppEndpoint, ...]:
    return (EppEndpoint(options.epp, options.epp_health_port), *options.more_epps)


def _epp_cluster(options: EnvoyOptions) -> dict[str, Any]:
    replicas = _epp_endpoints(options)
    lb_endpoints: list[dict[str, Any]] = []
    for replica in replicas:
        endpoint: dict[str, Any] = {"address": _socket_address(replica.address.host, replica.address.port)}
        if replica.health_port is not None:
            endpoint["health_check_config"] = {"port_value": replica.health_port}
        lb_endpoints.append({"endpoint": endpoint})
    cluster: dict[str, Any] = {
        "name": EPP_CLUSTER,
        "type": "STATIC" if all(r.address.is_ip for r in replicas) else "STRICT_DNS",
        "connect_timeout": _duration(options.upstream_connect_timeout_s),
        "lb_policy": "ROUND_ROBIN",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": _T + "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        # Every routed request holds a stream while it is routed (the whole response with
        # `--process-responses`); Envoy's default of 1024 concurrent requests would refuse more.
        "circuit_breakers": _circuit_breakers(),
        "load_assignment": {
            "cluster_name": EPP_CLUSTER,
            "endpoints": [{"lb_endpoints": lb_endpoints}],
        },
    }
    if cluster["type"] == "STRICT_DNS":
        # A headless Service name: replicas that come and go are seen within seconds (default 5 s).
        cluster["dns_refresh_rate"] = "2s"
    tls_socket = {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            # No validation context: the EPP's certificate is self-signed by default.
            "@type": _T + "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "common_tls_context": {"alpn_protocols": ["h2"]},  # gRPC over TLS negotiates HTTP/2
        },
    }
    raw_socket = {
        "name": "envoy.transport_sockets.raw_buffer",
        "typed_config": {"@type": _T + "envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer"},
    }
    if replicas[0].health_port is not None:
        # The EPP's health port is plaintext even when ext_proc is TLS: the health check picks
        # the plaintext socket by criteria; traffic (no endpoint metadata) takes the last entry.
        cluster["transport_socket_matches"] = [
            {
                "name": "health-plaintext",
                "match": {"epp-health": "plaintext"},
                "transport_socket": raw_socket,
            },
            {
                "name": "ext-proc",
                "match": {},
                "transport_socket": tls_socket if options.epp_tls else raw_socket,
            },
        ]
        cluster["health_checks"] = [
            {
                "timeout": _duration(options.health_check_interval_s),
                "interval": _duration(options.health_check_interval_s),
                "no_traffic_interval": _duration(options.health_check_interval_s),
                "unhealthy_threshold": 1,
                "healthy_threshold": 1,
                "grpc_health_check": {"service_name": EXT_PROC_HEALTH_SERVICE},
                "transport_socket_match_criteria": {"epp-health": "plaintext"},
            }
        ]
        # With every EPP host unhealthy, do not "panic" and send streams to it anyway.
        cluster["common_lb_config"] = {"healthy_panic_threshold": {"value": 0.0}}
        # An EPP that died refuses connections at once: the first refusal takes it out of the
        # cluster for a second, so the requests behind it fail open (or are refused cleanly)
        # instead of failing mid-routing until the next health check. Local-origin errors only:
        # an ImmediateResponse or a gRPC status from a live EPP is no reason to eject it.
        cluster["outlier_detection"] = {
            "split_external_local_origin_errors": True,
            "consecutive_local_origin_failure": 1,
            "enforcing_consecutive_local_origin_failure": 100,
            "consecutive_5xx": 1_000_000,
            "consecutive_gateway_failure": 1_000_000,
            "enforcing_success_rate": 0,
            "enforcing_failure_percentage": 0,
            # Ejected hosts return when the analysis interval ticks (default 10 s): tick each second.
            "interval": "1s",
            "base_ejection_time": "1s",
            "max_ejection_time": "1s",
            "max_ejection_percent": 100,
        }
    elif options.epp_tls:
        cluster["transport_socket"] = tls_socket
    return cluster


def _override_host_cluster(options: EnvoyOptions) -> dict[str, Any]:
    """The pool's pods; the EPP's `envoy.lb` list picks the host, round robin when there is none.

    The list's later entries are the EPP's fallbacks, used on retry. An address that is not a
    member of the cluster is never dialled.
    """
    cluster = _static_or_dns_cluster(POOL_CLUSTER, options.pool_endpoints, options.upstream_connect_timeout_s)
    del cluster["lb_policy"]
    cluster["circuit_breakers"] = _circuit_breakers()
    round_robin = {
        "typed_extension_config": {
            "name": "envoy.load_balancing_policies.round_robin",
            "typed_config": {
                "@type": _T + "envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"
            },
        }
    }
    cluster["load_balancing_policy"] = {
        "policies": [
            {
                "typed_extension_config": {
                    "name": "envoy.load_balancing_policies.override_host",
                    "typed_config": {
                        "@type": _T
                        + "envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
                        # Metadata only, never a header: a client cannot set dynamic metadata.
                        "override_host_sources": [
                            {
                                "metadata": {
                                    "key": wire.LB_METADATA_NAMESPACE,
                                    "path": [{"key": wire.DESTINATION_ENDPOINT_KEY}],
                                }
                            }
                        ],
                        "fallback_policy": {"policies": [round_robin]},
                    },
                }
            }
        ]
    }
    return cluster


def _picked_cluster(options: EnvoyOptions) -> dict[str, Any]:
    return {
        "name": PICKED_CLUSTER,
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": _duration(options.upstream_connect_timeout_s),
        "circuit_breakers": _circuit_breakers(),
        # Metadata only, never a header: a client cannot set dynamic metadata.
        "original_dst_lb_config": {
            "use_http_header": False,
            "metadata_key": {
                "key": wire.LB_METADATA_NAMESPACE,
                "path": [{"key": wire.DESTINATION_ENDPOINT_KEY}],
            },
        },
    }


def _ext_proc_filter(options: EnvoyOptions) -> dict[str, Any]:
    fail_open = options.failure_mode is FailureMode.FAIL_OPEN
    fdx = options.body_mode is BodyMode.FULL_DUPLEX_STREAMED
    processing_mode: dict[str, str] = {
        "request_header_mode": "SEND",
        "request_body_mode": options.body_mode.value,
        # FULL_DUPLEX_STREAMED is rejected by Envoy without request trailers SEND.
        "request_trailer_mode": "SEND" if fdx else "SKIP",
    }
    if options.process_responses:
        processing_mode |= {
            "response_header_mode": "SEND",
            "response_body_mode": "FULL_DUPLEX_STREAMED",
            "response_trailer_mode": "SEND",
        }
    else:
        processing_mode |= {
            "response_header_mode": "SKIP",
            "response_body_mode": "NONE",
            "response_trailer_mode": "SKIP",
        }
    envoy_grpc: dict[str, Any] = {"cluster_name": EPP_CLUSTER}
    if options.more_epps:
        # A replica that refuses the stream (just died) is retried on another before any reply.
        envoy_grpc["retry_policy"] = {
            "retry_on": "connect-failure,refused-stream,reset,unavailable",
            "num_retries": len(options.more_epps),
            "retry_host_predicate": [_previous_hosts_predicate()],
        }
    return {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": _T + "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {"envoy_grpc": envoy_grpc},
            "failure_mode_allow": fail_open,
            # FailClose with the EPP unreachable: 503 (retryable), with a JSON body from the
            # local reply mapper, instead of Envoy's default empty 500.
            "status_on_error": {"code": "ServiceUnavailable"},
            "message_timeout": _duration(options.message_timeout_s),
            "max_message_timeout": _duration(options.max_message_timeout_s),
            "processing_mode": processing_mode,
            "metadata_options": {"receiving_namespaces": {"untyped": [wire.LB_METADATA_NAMESPACE]}},
            # Re-route after every header mutation the EPP sends: in BUFFERED the pick comes on
            # the body reply, which carries no clear_route_cache of its own.
            "route_cache_action": "CLEAR",
        },
    }


def _strip_control_headers_filter() -> dict[str, Any]:
    return {
        "name": "envoy.filters.http.header_mutation",
        "typed_config": {
            "@type": _T + "envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
            # Sorted: the set has no order of its own, and a render must be the same every time.
            "mutations": {
                "request_mutations": [{"remove": name} for name in sorted(wire.STRIPPED_CLIENT_HEADERS)]
            },
        },
    }


def _retry_policy(options: EnvoyOptions) -> dict[str, Any]:
    """Retry a request whose pod refused or dropped the connection, on another pod.

    With override-host the retry takes the next endpoint of the EPP's list (its fallbacks);
    round robin skips the hosts already tried.
    """
    return {
        "retry_on": "connect-failure,refused-stream,reset",
        "num_retries": options.num_retries,
        "retry_host_predicate": [_previous_hosts_predicate()],
        "host_selection_retry_max_attempts": 3,
    }


def _previous_hosts_predicate() -> dict[str, Any]:
    return {
        "name": "envoy.retry_host_predicates.previous_hosts",
        "typed_config": {
            "@type": _T + "envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
        },
    }


def _route(cluster: str, options: EnvoyOptions, match: dict[str, Any]) -> dict[str, Any]:
    return {
        "match": match,
        "route": {
            "cluster": cluster,
            "timeout": _duration(options.route_timeout_s),
            "retry_policy": _retry_policy(options),
        },
    }


def _routes(options: EnvoyOptions) -> list[dict[str, Any]]:
    everything: dict[str, Any] = {"prefix": "/"}
    if options.mode is RoutingMode.ROUND_ROBIN:
        return [_route(ROUND_ROBIN_CLUSTER, options, everything)]
    picked_match = {
        "prefix": "/",
        "dynamic_metadata": [
            {
                "filter": wire.LB_METADATA_NAMESPACE,
                "path": [{"key": wire.DESTINATION_ENDPOINT_KEY}],
                "value": {"present_match": True},
            }
        ],
    }
    picked_cluster = POOL_CLUSTER if options.upstream is Upstream.OVERRIDE_HOST else PICKED_CLUSTER
    if options.failure_mode is FailureMode.FAIL_OPEN:
        if options.upstream is Upstream.OVERRIDE_HOST:
            # One cluster does both: the EPP's host when named, round robin when not.
            return [_route(POOL_CLUSTER, options, everything)]
        return [_route(picked_cluster, options, picked_match), _route(FALLBACK_CLUSTER, options, everything)]
    unpicked = {
        "match": everything,
        "direct_response": {
            "status": 503,
            "body": {
                "inline_string": '{"error":{"message":"inference gateway: ServiceUnavailable - '
                'no endpoint was picked","type":"ServiceUnavailable","code":503}}'
            },
        },
    }
    return [_route(picked_cluster, options, picked_match), unpicked]


def _access_log(options: EnvoyOptions) -> dict[str, Any]:
    """Envoy's gRPC access logger to the EPP cluster, for requests the EPP routed (its key is set).

    Batched: one message per flush interval (or per 16 KiB of entries) on a long-lived stream,
    written after each request ends, so it adds nothing to a request's path.
    """
    return {
        "name": "envoy.access_loggers.http_grpc",
        "filter": {
            "metadata_filter": {
                "matcher": {
                    "filter": wire.LB_METADATA_NAMESPACE,
                    "path": [{"key": wire.COMPLETION_KEY}],
                    "value": {"present_match": True},
                },
                "match_if_key_not_found": False,
            }
        },
        "typed_config": {
            "@type": _T + "envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig",
            "common_config": {
                "log_name": ACCESS_LOG_NAME,
                "transport_api_version": "V3",
                "grpc_service": {"envoy_grpc": {"cluster_name": EPP_CLUSTER}},
                "buffer_flush_interval": _duration(options.access_log_flush_interval_s),
                "buffer_size_bytes": 16384,
            },
        },
    }


def _code_details_filter(prefix: str) -> dict[str, Any]:
    """Matches local replies whose response code details start with `prefix`."""
    return {
        "extension_filter": {
            "name": "envoy.access_loggers.extension_filters.cel",
            "typed_config": {
                "@type": _T + "envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter",
                "expression": f"response.code_details.startsWith('{prefix}')",
            },
        }
    }


def _local_reply_config() -> dict[str, Any]:
    """JSON bodies (OpenAI error shape) for the replies ext_proc makes when the EPP fails it:
    unreachable or erroring (503), or too slow in BUFFERED mode (504). The EPP's own errors
    already carry JSON bodies and are left alone."""

    def mapper(prefix: str, body: str) -> dict[str, Any]:
        return {
            "filter": _code_details_filter(prefix),
            "body_format_override": {
                "text_format_source": {"inline_string": body},
                "content_type": "application/json",
            },
        }

    return {
        "mappers": [
            mapper("ext_proc_error_gRPC_error", EPP_UNAVAILABLE_BODY),
            mapper("ext_proc_error_per-message_timeout", EPP_TIMEOUT_BODY),
        ]
    }


def _http_filters(options: EnvoyOptions) -> list[dict[str, Any]]:
    router = {
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": _T + "envoy.extensions.filters.http.router.v3.Router"},
    }
    if options.mode is RoutingMode.ROUND_ROBIN:
        return [_strip_control_headers_filter(), router]
    return [_strip_control_headers_filter(), _ext_proc_filter(options), router]


def build_bootstrap(options: EnvoyOptions) -> dict[str, Any]:
    """The whole bootstrap as a dict; ConfigError when the options cannot work together."""
    if options.body_mode not in BODY_MODES:
        modes = " or ".join(mode.value for mode in BODY_MODES)
        raise ConfigError(f"ext_proc must send the request body for the EPP to route it: {modes}")
    if not options.pool_endpoints:
        if options.mode is RoutingMode.ROUND_ROBIN:
            raise ConfigError(
                "round-robin mode needs the pool's pod endpoints (--pool-file or --pool-endpoint)"
            )
        if options.upstream is Upstream.OVERRIDE_HOST:
            raise ConfigError(
                "the override-host upstream needs the pool's pod endpoints (--pool-file or --pool-endpoint);"
                " use --upstream original-dst for a pool whose pods are not known in advance"
            )
        if options.failure_mode is FailureMode.FAIL_OPEN:
            raise ConfigError("FailOpen needs the pool's pod endpoints (--pool-file or --pool-endpoint)")
    checked = {replica.health_port is not None for replica in _epp_endpoints(options)}
    if len(checked) > 1:
        raise ConfigError("either every EPP replica has a health port or none has")
    hcm: dict[str, Any] = {
        "@type": _T + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "gateway",
        # The only bound on a hung EPP in FULL_DUPLEX_STREAMED (504 at the limit).
        "stream_idle_timeout": _duration(options.stream_idle_timeout_s),
        "route_config": {
            "name": "gateway",
            "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": _routes(options)}],
        },
        "http_filters": _http_filters(options),
    }
    if options.mode is RoutingMode.EPP:
        hcm["local_reply_config"] = _local_reply_config()
        if options.access_log:
            hcm["access_log"] = [_access_log(options)]
    timeout_s = options.upstream_connect_timeout_s
    clusters: list[dict[str, Any]] = []
    if options.mode is RoutingMode.ROUND_ROBIN:
        clusters.append(_static_or_dns_cluster(ROUND_ROBIN_CLUSTER, options.pool_endpoints, timeout_s))
    elif options.upstream is Upstream.OVERRIDE_HOST:
        clusters += [_override_host_cluster(options), _epp_cluster(options)]
    else:
        clusters += [_picked_cluster(options), _epp_cluster(options)]
        if options.failure_mode is FailureMode.FAIL_OPEN:
            clusters.append(_static_or_dns_cluster(FALLBACK_CLUSTER, options.pool_endpoints, timeout_s))
    return {
        "admin": {"address": _socket_address(options.admin_address, options.admin_port)},
        "static_resources": {
            "listeners": [
                {
                    "name": "gateway",
                    "address": _socket_address(options.listen_address, options.listen_port),
                    "per_connection_buffer_limit_bytes": options.max_request_body_bytes,
                    "filter_chains": [
                        {
                            "filters": [
                                {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                            ]
                        }
                    ],
                }
            ],
            "clusters": clusters,
        },
    }


def render_yaml(bootstrap: dict[str, Any]) -> str:
    """YAML text Envoy reads with `-c FILE`."""
    text: str = yaml.safe_dump(bootstrap, sort_keys=False, default_flow_style=False)
    return text
