"""The generated bootstrap: Envoy accepts every variant, and the decisive settings are there."""

from __future__ import annotations

import itertools
import json
import pathlib
from typing import Any

import pytest
import yaml

from epp.errors import ConfigError
from epp.picker import wire
from epp.picker.datastore.types import FailureMode
from epp.picker.extproc.stream import BodyMode
from epp.tools.envoy.bootstrap import (
    BODY_MODES,
    FALLBACK_CLUSTER,
    PICKED_CLUSTER,
    POOL_CLUSTER,
    ROUND_ROBIN_CLUSTER,
    EnvoyOptions,
    EppEndpoint,
    HostPort,
    RoutingMode,
    Upstream,
    build_bootstrap,
    parse_host_port,
    render_yaml,
)
from epp.tools.envoy.process import EnvoyStartError
from tests.support.envoy_validation import validate_config

PODS = (HostPort("10.0.0.5", 8000), HostPort("10.0.0.6", 8000))

VARIANTS = [
    EnvoyOptions(
        body_mode=body,
        failure_mode=failure,
        epp_tls=tls,
        epp_health_port=health,
        pool_endpoints=PODS,
        upstream=upstream,
    )
    for body, failure, tls, health, upstream in itertools.product(
        BODY_MODES, FailureMode, (True, False), (9003, None), Upstream
    )
] + [
    EnvoyOptions(upstream=Upstream.ORIGINAL_DST),  # FailClose needs no pods with original-dst
    EnvoyOptions(process_responses=True, pool_endpoints=PODS),
    EnvoyOptions(access_log=False, pool_endpoints=PODS),
    EnvoyOptions(more_epps=(EppEndpoint(HostPort("127.0.0.1", 9012), 9013),), pool_endpoints=PODS),
    EnvoyOptions(mode=RoutingMode.ROUND_ROBIN, pool_endpoints=PODS),
    EnvoyOptions(epp=HostPort("epp.default.svc", 9002), failure_mode=FailureMode.FAIL_OPEN,
                 pool_endpoints=(HostPort("vllm.default.svc", 8000),)),
]  # fmt: skip


def _variant_id(o: EnvoyOptions) -> str:
    if o.mode is RoutingMode.ROUND_ROBIN:
        return "round-robin"
    parts = [o.upstream.value, o.body_mode.value, o.failure_mode.name, "tls" if o.epp_tls else "plain"]
    parts.append("hc" if o.epp_health_port else "nohc")
    if o.process_responses:
        parts.append("responses")
    if not o.access_log:
        parts.append("nolog")
    if o.more_epps:
        parts.append("replicas")
    if not o.epp.is_ip:
        parts.append("dns")
    if not o.pool_endpoints:
        parts.append("nopods")
    return "-".join(parts)


def _ext_proc(bootstrap: dict[str, Any]) -> dict[str, Any]:
    for flt in _hcm(bootstrap)["http_filters"]:
        if flt["name"] == "envoy.filters.http.ext_proc":
            config: dict[str, Any] = flt["typed_config"]
            return config
    raise AssertionError("no ext_proc filter")


def _hcm(bootstrap: dict[str, Any]) -> dict[str, Any]:
    hcm: dict[str, Any] = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]
    return hcm


def _clusters(bootstrap: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in bootstrap["static_resources"]["clusters"]}


@pytest.mark.parametrize("options", VARIANTS, ids=[_variant_id(o) for o in VARIANTS])
def test_envoy_accepts_every_variant(options: EnvoyOptions, tmp_path: pathlib.Path) -> None:
    path = tmp_path / "envoy.yaml"
    path.write_text(render_yaml(build_bootstrap(options)))
    validate_config(path)


def test_envoy_rejects_a_broken_config(tmp_path: pathlib.Path) -> None:
    bootstrap = build_bootstrap(EnvoyOptions(body_mode=BodyMode.FULL_DUPLEX_STREAMED, pool_endpoints=PODS))
    _ext_proc(bootstrap)["processing_mode"]["request_trailer_mode"] = "SKIP"  # FDX needs SEND
    path = tmp_path / "envoy.yaml"
    path.write_text(render_yaml(bootstrap))
    with pytest.raises(EnvoyStartError, match="envoy rejected"):
        validate_config(path)


def test_the_rendered_yaml_is_the_bootstrap() -> None:
    bootstrap = build_bootstrap(EnvoyOptions(pool_endpoints=PODS))
    assert yaml.safe_load(render_yaml(bootstrap)) == bootstrap


def test_epp_pick_is_received_and_client_destination_headers_are_stripped_first() -> None:
    bootstrap = build_bootstrap(EnvoyOptions(pool_endpoints=PODS))
    names = [f["name"] for f in _hcm(bootstrap)["http_filters"]]
    assert names == [
        "envoy.filters.http.header_mutation",
        "envoy.filters.http.ext_proc",
        "envoy.filters.http.router",
    ]
    removed = [
        m["remove"]
        for m in _hcm(bootstrap)["http_filters"][0]["typed_config"]["mutations"]["request_mutations"]
    ]
    assert set(removed) == wire.STRIPPED_CLIENT_HEADERS
    assert wire.DESTINATION_ENDPOINT_HEADER in removed
    # Headers the client legitimately sends to the EPP are kept.
    assert "x-gateway-model-name-rewrite" not in removed
    assert "x-gateway-inference-objective" not in removed
    assert _ext_proc(bootstrap)["metadata_options"] == {"receiving_namespaces": {"untyped": ["envoy.lb"]}}


def _addresses(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        e["endpoint"]["address"]["socket_address"]
        for e in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    ]


POD_ADDRESSES = [{"address": "10.0.0.5", "port_value": 8000}, {"address": "10.0.0.6", "port_value": 8000}]


def test_override_host_cluster_takes_the_pick_from_metadata_only() -> None:
    pool = _clusters(build_bootstrap(EnvoyOptions(pool_endpoints=PODS)))[POOL_CLUSTER]
    assert _addresses(pool) == POD_ADDRESSES
    policy = pool["load_balancing_policy"]["policies"][0]["typed_extension_config"]
    assert policy["name"] == "envoy.load_balancing_policies.override_host"
    assert policy["typed_config"]["override_host_sources"] == [
        {"metadata": {"key": "envoy.lb", "path": [{"key": wire.DESTINATION_ENDPOINT_KEY}]}}
    ]
    fallback = policy["typed_config"]["fallback_policy"]["policies"][0]["typed_extension_config"]
    assert fallback["name"] == "envoy.load_balancing_policies.round_robin"


def test_original_dst_cluster_dials_only_what_dynamic_metadata_names() -> None:
    picked = _clusters(build_bootstrap(EnvoyOptions(upstream=Upstream.ORIGINAL_DST)))[PICKED_CLUSTER]
    assert picked["type"] == "ORIGINAL_DST"
    assert picked["original_dst_lb_config"]["use_http_header"] is False
    assert picked["original_dst_lb_config"]["metadata_key"] == {
        "key": "envoy.lb",
        "path": [{"key": wire.DESTINATION_ENDPOINT_KEY}],
    }


def _routes(bootstrap: dict[str, Any]) -> list[dict[str, Any]]:
    routes: list[dict[str, Any]] = _hcm(bootstrap)["route_config"]["virtual_hosts"][0]["routes"]
    return routes


def _route_target(route: dict[str, Any]) -> str | int:
    if "direct_response" in route:
        status: int = route["direct_response"]["status"]
        return status
    cluster: str = route["route"]["cluster"]
    return cluster


@pytest.mark.parametrize(
    ("upstream", "failure_mode", "allow", "targets"),
    [
        (Upstream.OVERRIDE_HOST, FailureMode.FAIL_OPEN, True, [POOL_CLUSTER]),
        (Upstream.OVERRIDE_HOST, FailureMode.FAIL_CLOSE, False, [POOL_CLUSTER, 503]),
        (Upstream.ORIGINAL_DST, FailureMode.FAIL_OPEN, True, [PICKED_CLUSTER, FALLBACK_CLUSTER]),
        (Upstream.ORIGINAL_DST, FailureMode.FAIL_CLOSE, False, [PICKED_CLUSTER, 503]),
    ],
    ids=[
        "override-host-fail-open",
        "override-host-fail-close",
        "original-dst-fail-open",
        "original-dst-fail-close",
    ],
)
def test_failure_mode_decides_where_an_unpicked_request_goes(
    upstream: Upstream, failure_mode: FailureMode, allow: bool, targets: list[str | int]
) -> None:
    bootstrap = build_bootstrap(
        EnvoyOptions(upstream=upstream, failure_mode=failure_mode, pool_endpoints=PODS)
    )
    assert _ext_proc(bootstrap)["failure_mode_allow"] is allow
    routes = _routes(bootstrap)
    assert [_route_target(r) for r in routes] == targets
    if len(routes) == 2:
        # The first route needs the EPP's pick in envoy.lb metadata; a client header cannot match it.
        assert routes[0]["match"]["dynamic_metadata"][0]["filter"] == "envoy.lb"
        assert "headers" not in routes[0]["match"]
    if FALLBACK_CLUSTER in targets:
        assert _addresses(_clusters(bootstrap)[FALLBACK_CLUSTER]) == POD_ADDRESSES


def test_routes_retry_on_refused_connections() -> None:
    for route in _routes(build_bootstrap(EnvoyOptions(pool_endpoints=PODS))):
        if "route" in route:
            assert "connect-failure" in route["route"]["retry_policy"]["retry_on"]
            assert route["route"]["retry_policy"]["num_retries"] == 2


@pytest.mark.parametrize(
    ("body_mode", "process_responses", "expected"),
    [
        (
            BodyMode.FULL_DUPLEX_STREAMED,
            True,
            ("SEND", "FULL_DUPLEX_STREAMED", "SEND", "SEND", "FULL_DUPLEX_STREAMED", "SEND"),
        ),
        (BodyMode.BUFFERED, True, ("SEND", "BUFFERED", "SKIP", "SEND", "FULL_DUPLEX_STREAMED", "SEND")),
        (
            BodyMode.FULL_DUPLEX_STREAMED,
            False,
            ("SEND", "FULL_DUPLEX_STREAMED", "SEND", "SKIP", "NONE", "SKIP"),
        ),
    ],
    ids=["fdx-responses", "buffered-responses", "fdx-request-only"],
)
def test_processing_mode(body_mode: BodyMode, process_responses: bool, expected: tuple[str, ...]) -> None:
    options = EnvoyOptions(body_mode=body_mode, process_responses=process_responses, pool_endpoints=PODS)
    mode = _ext_proc(build_bootstrap(options))["processing_mode"]
    keys = (
        "request_header",
        "request_body",
        "request_trailer",
        "response_header",
        "response_body",
        "response_trailer",
    )
    assert tuple(mode[f"{k}_mode"] for k in keys) == expected


def test_a_mode_that_sends_no_body_refuses_to_build() -> None:
    """The EPP routes on the request body: a bootstrap that would never send it is an error."""
    with pytest.raises(ConfigError, match="request body"):
        build_bootstrap(EnvoyOptions(body_mode=BodyMode.NONE, pool_endpoints=PODS))


def test_epp_cluster_is_http2_with_tls_and_health_checked() -> None:
    epp = _clusters(build_bootstrap(EnvoyOptions(pool_endpoints=PODS)))["epp"]
    options = epp["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    ]
    assert options["explicit_http_config"] == {"http2_protocol_options": {}}
    sockets = {m["name"]: m["transport_socket"]["name"] for m in epp["transport_socket_matches"]}
    assert sockets == {
        "health-plaintext": "envoy.transport_sockets.raw_buffer",
        "ext-proc": "envoy.transport_sockets.tls",
    }
    assert epp["health_checks"][0]["grpc_health_check"] == {
        "service_name": "envoy.service.ext_proc.v3.ExternalProcessor"
    }
    assert epp["common_lb_config"]["healthy_panic_threshold"] == {"value": 0.0}
    # A refused connection ejects the EPP at once (no waiting for the next health check), for a
    # second; only local-origin errors count, and even a lone replica may be ejected.
    outlier = epp["outlier_detection"]
    assert outlier["split_external_local_origin_errors"] is True
    assert (outlier["consecutive_local_origin_failure"], outlier["max_ejection_percent"]) == (1, 100)
    assert outlier["base_ejection_time"] == outlier["max_ejection_time"] == "1s"
    endpoint = epp["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["health_check_config"] == {"port_value": 9003}


def test_round_robin_mode_has_no_ext_proc() -> None:
    bootstrap = build_bootstrap(EnvoyOptions(mode=RoutingMode.ROUND_ROBIN, pool_endpoints=PODS))
    assert [f["name"] for f in _hcm(bootstrap)["http_filters"]][-1] == "envoy.filters.http.router"
    assert "envoy.filters.http.ext_proc" not in [f["name"] for f in _hcm(bootstrap)["http_filters"]]
    assert set(_clusters(bootstrap)) == {ROUND_ROBIN_CLUSTER}


@pytest.mark.parametrize(
    "options",
    [
        EnvoyOptions(),
        EnvoyOptions(upstream=Upstream.ORIGINAL_DST, failure_mode=FailureMode.FAIL_OPEN),
        EnvoyOptions(mode=RoutingMode.ROUND_ROBIN),
    ],
    ids=["override-host", "original-dst-fail-open", "round-robin"],
)
def test_modes_that_need_pods_refuse_to_build_without_them(options: EnvoyOptions) -> None:
    with pytest.raises(ConfigError, match="pod endpoints"):
        build_bootstrap(options)


def test_admin_listens_on_loopback_ephemeral_port_by_default() -> None:
    assert build_bootstrap(EnvoyOptions(pool_endpoints=PODS))["admin"]["address"]["socket_address"] == {
        "address": "127.0.0.1",
        "port_value": 0,
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10.0.0.5:8000", HostPort("10.0.0.5", 8000)),
        ("[fd00::5]:8000", HostPort("fd00::5", 8000)),
        ("epp.default.svc:9002", HostPort("epp.default.svc", 9002)),
        (" 127.0.0.1:1 ", HostPort("127.0.0.1", 1)),
    ],
    ids=["ipv4", "ipv6", "dns", "spaces"],
)
def test_parse_host_port(text: str, expected: HostPort) -> None:
    assert parse_host_port(text) == expected


@pytest.mark.parametrize(
    "text",
    ["10.0.0.5", ":8000", "host:", "host:http", "host:0", "host:70000"],
    ids=["no-port", "no-host", "empty-port", "named-port", "zero", "too-big"],
)
def test_parse_host_port_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_host_port(text)


def test_by_default_the_epp_sees_the_request_only() -> None:
    mode = _ext_proc(build_bootstrap(EnvoyOptions(pool_endpoints=PODS)))["processing_mode"]
    assert (mode["response_header_mode"], mode["response_body_mode"], mode["response_trailer_mode"]) == (
        "SKIP",
        "NONE",
        "SKIP",
    )


def test_routed_requests_are_access_logged_to_the_epp() -> None:
    [logger] = _hcm(build_bootstrap(EnvoyOptions(pool_endpoints=PODS)))["access_log"]
    assert logger["name"] == "envoy.access_loggers.http_grpc"
    common = logger["typed_config"]["common_config"]
    assert common["grpc_service"] == {"envoy_grpc": {"cluster_name": "epp"}}
    assert common["transport_api_version"] == "V3"
    assert common["buffer_flush_interval"] == "0.100s"
    # Only requests that carry the EPP's key: what it routed, not what failed open around it.
    matcher = logger["filter"]["metadata_filter"]["matcher"]
    assert matcher == {
        "filter": "envoy.lb",
        "path": [{"key": "lora-epp-completion-key"}],
        "value": {"present_match": True},
    }


@pytest.mark.parametrize(
    "options",
    [
        EnvoyOptions(access_log=False, pool_endpoints=PODS),
        EnvoyOptions(mode=RoutingMode.ROUND_ROBIN, pool_endpoints=PODS),
    ],
    ids=["access-log-off", "round-robin"],
)
def test_no_access_log_when_off_or_without_an_epp(options: EnvoyOptions) -> None:
    assert "access_log" not in _hcm(build_bootstrap(options))


def test_an_unreachable_epp_is_a_json_503() -> None:
    bootstrap = build_bootstrap(EnvoyOptions(pool_endpoints=PODS))
    assert _ext_proc(bootstrap)["status_on_error"] == {"code": "ServiceUnavailable"}
    mappers = _hcm(bootstrap)["local_reply_config"]["mappers"]
    expressions = [m["filter"]["extension_filter"]["typed_config"]["expression"] for m in mappers]
    assert expressions == [
        "response.code_details.startsWith('ext_proc_error_gRPC_error')",
        "response.code_details.startsWith('ext_proc_error_per-message_timeout')",
    ]
    bodies = [json.loads(m["body_format_override"]["text_format_source"]["inline_string"]) for m in mappers]
    assert [(b["error"]["type"], b["error"]["code"]) for b in bodies] == [
        ("ServiceUnavailable", 503),
        ("GatewayTimeout", 504),
    ]
    assert {m["body_format_override"]["content_type"] for m in mappers} == {"application/json"}


@pytest.mark.parametrize("upstream", list(Upstream), ids=[u.value for u in Upstream])
def test_circuit_breakers_never_refuse_retries_or_ext_proc_streams(upstream: Upstream) -> None:
    options = EnvoyOptions(upstream=upstream, failure_mode=FailureMode.FAIL_OPEN, pool_endpoints=PODS)
    for name, cluster in _clusters(build_bootstrap(options)).items():
        if name == FALLBACK_CLUSTER:
            continue  # a plain round-robin cluster for requests the EPP did not pick
        [thresholds] = cluster["circuit_breakers"]["thresholds"]
        assert thresholds["max_retries"] >= 10_000, name  # Envoy's default is 3
        assert thresholds["max_requests"] >= 10_000, name  # Envoy's default is 1024


def test_several_epp_replicas_are_each_health_checked_and_retried_across() -> None:
    more = (EppEndpoint(HostPort("127.0.0.1", 9012), 9013), EppEndpoint(HostPort("127.0.0.1", 9022), 9023))
    bootstrap = build_bootstrap(
        EnvoyOptions(epp=HostPort("127.0.0.1", 9002), more_epps=more, pool_endpoints=PODS)
    )
    endpoints = [
        e["endpoint"] for e in _clusters(bootstrap)["epp"]["load_assignment"]["endpoints"][0]["lb_endpoints"]
    ]
    assert [
        (e["address"]["socket_address"]["port_value"], e["health_check_config"]["port_value"])
        for e in endpoints
    ] == [
        (9002, 9003),
        (9012, 9013),
        (9022, 9023),
    ]
    retry = _ext_proc(bootstrap)["grpc_service"]["envoy_grpc"]["retry_policy"]
    assert "connect-failure" in retry["retry_on"] and retry["num_retries"] == 2


def test_replicas_must_agree_on_health_checking() -> None:
    more = (EppEndpoint(HostPort("127.0.0.1", 9012), None),)
    with pytest.raises(ConfigError, match="health port"):
        build_bootstrap(EnvoyOptions(more_epps=more, pool_endpoints=PODS))


def test_a_dns_named_epp_is_re_resolved_often() -> None:
    options = EnvoyOptions(epp=HostPort("epp.default.svc", 9002), pool_endpoints=PODS)
    epp = _clusters(build_bootstrap(options))["epp"]
    assert (epp["type"], epp["dns_refresh_rate"]) == ("STRICT_DNS", "2s")
