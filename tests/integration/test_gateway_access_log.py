"""Each gateway's access log to the EPP, as manifests/gateway configures it, run by a real Envoy.

The Envoy logger each gateway builds from its objects (log name, CEL filter, recorded headers;
tests/support/gateway_access_log.py reads them from the manifests) streams over TLS to a real
`epp serve`, and the EPP finishes every routed request from the entries: the EPP is off the
response path (the ext_proc stream ends once the request is routed), so the access log is the only
way it learns of the end. Envoy Gateway's case also runs its ext_proc filter the way Envoy AI
Gateway builds it, which drops the EPP's dynamic metadata and routes by the destination header:
there the key comes back through the request header the log records.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from epp.picker import wire
from epp.tools.envoy.bootstrap import EPP_CLUSTER
from epp.tools.localstack import LocalStack
from testkit.waiting import wait_until
from tests.integration.conftest import ADAPTERS, EPP_STACK, _started, completion
from tests.support import gateway_access_log
from tests.support.epp_metrics import epp_metric

REQUESTS = 12


def _plan(gateway: str) -> gateway_access_log.AccessLogPlan:
    (plan,) = gateway_access_log.plans(
        gateway_access_log.stack_objects(gateway), istio_mesh_config=gateway_access_log.istio_mesh_config()
    )
    return plan


def _hcm(bootstrap: dict[str, Any]) -> dict[str, Any]:
    (listener,) = bootstrap["static_resources"]["listeners"]
    (chain,) = listener["filter_chains"]
    (manager,) = chain["filters"]
    config: dict[str, Any] = manager["typed_config"]
    return config


def _like_ai_gateway(bootstrap: dict[str, Any]) -> None:
    """ext_proc accepts no metadata namespace; the route and the pool cluster read the pick from
    the destination header."""
    hcm = _hcm(bootstrap)
    for http_filter in hcm["http_filters"]:
        if http_filter["name"] == "envoy.filters.http.ext_proc":
            del http_filter["typed_config"]["metadata_options"]
    for host in hcm["route_config"]["virtual_hosts"]:
        for route in host["routes"]:
            if route["match"].pop("dynamic_metadata", None) is not None:
                route["match"]["headers"] = [
                    {"name": wire.DESTINATION_ENDPOINT_HEADER, "present_match": True}
                ]
    for cluster in bootstrap["static_resources"]["clusters"]:
        for policy in cluster.get("load_balancing_policy", {}).get("policies", []):
            config = policy["typed_extension_config"]["typed_config"]
            if "override_host_sources" in config:
                config["override_host_sources"] = [{"header": wire.DESTINATION_ENDPOINT_HEADER}]


def _hook(gateway: str) -> Callable[[dict[str, Any]], None]:
    plan = _plan(gateway)

    def edit(bootstrap: dict[str, Any]) -> None:
        _hcm(bootstrap)["access_log"] = [gateway_access_log.envoy_access_log(plan, EPP_CLUSTER)]
        if gateway == "envoy-gateway":
            _like_ai_gateway(bootstrap)

    return edit


@pytest.fixture(params=gateway_access_log.GATEWAYS)
def gateway_stack(request: pytest.FixtureRequest) -> Iterator[LocalStack]:
    gateway: str = request.param
    assert _plan(gateway).tls, "the manifests speak TLS to the EPP; so does this stack"
    options = dataclasses.replace(
        EPP_STACK, pods=2, access_log=False, epp_tls=True, envoy_bootstrap_hook=_hook(gateway)
    )
    yield from _started(options)


def finished_by(stack: LocalStack, source: str) -> float:
    """inference_extension_request_finished_total{source=...} of the stack's EPP."""
    return epp_metric(stack, "inference_extension_request_finished_total", source=source)


def _finished(stack: LocalStack) -> dict[str, float]:
    return {source: finished_by(stack, source) for source in ("access-log", "stream-end", "expired")}


def test_the_gateways_access_log_finishes_every_routed_request(gateway_stack: LocalStack) -> None:
    stack = gateway_stack
    warm_up: list[int] = []

    def logged() -> bool:
        warm_up.append(completion(stack, ADAPTERS[0]).status)
        return finished_by(stack, "access-log") > 0

    # Envoy opens its log stream with its first entry; until then a request's end is its stream's.
    wait_until(
        logged, "the first entry of the gateway's access log to reach the EPP", within_s=30, interval_s=0.5
    )
    assert set(warm_up) == {200}
    wait_until(
        lambda: sum(_finished(stack).values()) == len(warm_up),
        "every warm-up request finished",
        within_s=30,
    )
    before = _finished(stack)
    replies = [completion(stack, ADAPTERS[i % len(ADAPTERS)]) for i in range(REQUESTS)]
    assert [r.status for r in replies] == [200] * REQUESTS
    # Entries are batched (Envoy's default flush: 1 s) and sent after each response.
    wait_until(
        lambda: sum(_finished(stack).values()) - sum(before.values()) >= REQUESTS,
        f"{REQUESTS} more requests finished",
        within_s=30,
    )
    after = _finished(stack)
    assert {source: after[source] - before[source] for source in after} == {
        "access-log": REQUESTS,
        "stream-end": 0,
        "expired": 0,
    }
