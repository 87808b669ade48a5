"""manifests/gateway/{kgateway,istio,envoy-gateway}: each gateway sends its HTTP access log to the
EPP Service's ext_proc port, over HTTP/2 with the TLS the EPP serves, filtered to the requests the
EPP routed, and records the completion key the EPP matches entries by. The real Envoy run of the
same loggers is tests/integration/test_gateway_access_log.py."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import gateway_access_log as access_log


def _epp_serves_tls(objects: list[dict[str, Any]]) -> bool:
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return "--secure-serving=false" not in container["args"]


@pytest.mark.parametrize("gateway", access_log.GATEWAYS)
def test_the_gateway_logs_routed_requests_to_the_epp(gateway: str) -> None:
    objects = access_log.stack_objects(gateway)
    found = access_log.plans(objects, istio_mesh_config=access_log.istio_mesh_config())
    assert [(p.provider, p.gateway) for p in found] == [(gateway, "inference-gateway")]
    errors = access_log.reference_errors(
        found, objects, namespace="default", epp_tls=_epp_serves_tls(objects)
    )
    assert errors == []


def test_a_log_to_the_wrong_port_or_without_tls_is_caught() -> None:
    """The checks above can fail: a policy pointing at the metrics port, plain text to a TLS EPP."""
    objects = access_log.stack_objects("kgateway")
    for obj in objects:
        if obj["kind"] == "HTTPListenerPolicy":
            obj["spec"]["accessLog"][0]["grpcService"]["backendRef"]["port"] = 9090
        if obj["kind"] == "BackendConfigPolicy":
            del obj["spec"]["tls"]
    found = access_log.plans(objects)
    errors = access_log.reference_errors(found, objects, namespace="default", epp_tls=True)
    assert any("not the EPP's ext_proc port" in e for e in errors), errors
    assert any("TLS False" in e for e in errors), errors


def test_a_header_filter_that_does_not_record_the_header_is_caught() -> None:
    objects = access_log.stack_objects("envoy-gateway")
    for obj in objects:
        if obj["kind"] == "EnvoyProxy":
            obj["spec"]["telemetry"]["accessLog"]["settings"][0]["sinks"][0]["als"]["http"][
                "requestHeaders"
            ] = []
    found = access_log.plans(objects)
    errors = access_log.reference_errors(found, objects, namespace="default", epp_tls=True)
    assert any("does not record it" in e for e in errors), errors


def test_istio_provider_in_the_mesh_config_names_what_the_telemetry_asks_for() -> None:
    (telemetry,) = [o for o in access_log.stack_objects("istio") if o["kind"] == "Telemetry"]
    names = {p["name"] for p in access_log.istio_mesh_config()["extensionProviders"]}
    assert {p["name"] for p in telemetry["spec"]["accessLogging"][0]["providers"]} <= names
