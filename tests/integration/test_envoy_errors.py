"""The EPP's error answers reach the client through Envoy with their status and JSON body."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp.tools.localstack import LocalStack, SimOptions
from testkit import faults
from testkit.waiting import eventually_value, wait_until
from tests.integration.conftest import ADAPTERS, EPP_STACK, SHEDDABLE_OBJECTIVE, Reply, completion, post
from tests.support.epp_metrics import epp_metric

pytestmark = pytest.mark.integration


@pytest.fixture(params=["fdx_stack", "buffered_stack"], ids=["full-duplex-streamed", "buffered"])
def stack(request: pytest.FixtureRequest) -> LocalStack:
    found: LocalStack = request.getfixturevalue(request.param)
    return found


def _error(reply: Reply) -> dict[str, Any]:
    assert reply.headers["content-type"].startswith("application/json")
    payload = reply.json()
    assert isinstance(payload, dict)
    error: dict[str, Any] = payload["error"]
    assert error["code"] == reply.status
    return error


@pytest.mark.parametrize(
    ("body", "status", "error_type"),
    [
        (b"{not json", 400, "BadRequest"),
        (b'["a list"]', 400, "BadRequest"),
        (b'{"prompt": "no model"}', 400, "BadRequest"),
        (b'{"model": "no-such-model", "prompt": "x"}', 404, "NotFound"),
    ],
    ids=["bad-json", "not-an-object", "no-model", "unknown-model"],
)
def test_bad_requests_get_the_epp_error(stack: LocalStack, body: bytes, status: int, error_type: str) -> None:
    reply = post(f"{stack.gateway_url}/v1/completions", body)
    assert reply.status == status, reply.body
    error = _error(reply)
    assert error["type"] == error_type
    assert error["message"].startswith("inference gateway: ")
    # The gateway keeps serving after bad input.
    assert completion(stack, ADAPTERS[0]).status == 200


@pytest.mark.parametrize(
    "spoofed",
    ["admin", "other-pod", "outside"],
)
def test_a_client_destination_header_is_never_followed(fdx_stack: LocalStack, spoofed: str) -> None:
    chosen = completion(fdx_stack, ADAPTERS[1]).pod
    assert fdx_stack.envoy is not None
    targets = {
        "admin": fdx_stack.envoy.admin_address,
        "other-pod": next(p.address for p in fdx_stack.pods if p.name != chosen),
        "outside": "127.0.0.1:1",
    }
    headers = {
        "x-gateway-destination-endpoint": targets[spoofed],
        "x-gateway-destination-endpoint-fallback": targets[spoofed],
    }
    reply = completion(fdx_stack, ADAPTERS[1], headers=headers)
    assert reply.status == 200
    assert reply.pod == chosen  # the EPP's pick, not the client's
    payload = reply.json()
    assert isinstance(payload, dict)
    assert payload["object"] == "text_completion"


def test_no_ready_endpoints_is_503_and_recovers(own_stack: LocalStack) -> None:
    def answered(status: int) -> Reply | None:
        reply = completion(own_stack, ADAPTERS[0])
        return reply if reply.status == status else None

    faults.write_pool_file(own_stack, own_stack.pool_file_text(ready=False))
    reply = eventually_value(lambda: answered(503), within_s=15, what="a 503 once no pod is ready")
    assert _error(reply)["type"] == "ServiceUnavailable"
    faults.write_pool_file(own_stack, own_stack.pool_file_text(ready=True))
    eventually_value(lambda: answered(200), within_s=15, what="a 200 once the pods are ready again")


def _empty_subset_hint(bootstrap: dict[str, Any]) -> None:
    """What a data plane does when no endpoint of the pool may serve: an empty subset list."""
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    filters = hcm["http_filters"]
    ext_proc = next(f for f in filters if f["name"] == "envoy.filters.http.ext_proc")
    ext_proc["typed_config"]["metadata_options"]["forwarding_namespaces"] = {
        "untyped": ["envoy.lb.subset_hint"]
    }
    set_metadata = {
        "name": "envoy.filters.http.set_metadata",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config",
            "metadata": [
                {
                    "metadata_namespace": "envoy.lb.subset_hint",
                    "value": {"x-gateway-destination-endpoint-subset": []},
                }
            ],
        },
    }
    filters.insert(filters.index(ext_proc), set_metadata)


@pytest.mark.parametrize(
    "own_stack",
    [dataclasses.replace(EPP_STACK, pods=1, envoy_bootstrap_hook=_empty_subset_hint)],
    indirect=True,
    ids=["empty-subset"],
)
def test_an_empty_subset_hint_is_503(own_stack: LocalStack) -> None:
    reply = completion(own_stack, ADAPTERS[0])
    assert reply.status == 503, reply.body
    assert _error(reply)["type"] == "ServiceUnavailable"


# Admission sheds up front only without flow control (with it, as upstream's newer EPP, a
# sheddable request waits in its band: tests/integration/test_flow_control.py): a policy without it.
SLOW = dataclasses.replace(
    EPP_STACK,
    pods=1,
    sim=SimOptions(adapters=ADAPTERS, max_num_seqs=1, inter_token_latency_s=0.1),
    policy="gie-v1",
)


def _waiting_requests(pod_url: str) -> float:
    with urllib.request.urlopen(f"{pod_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:num_requests_waiting":
            return sum(sample.value for sample in family.samples)
    return 0.0


@pytest.mark.parametrize("own_stack", [SLOW], indirect=True, ids=["one-slow-pod"])
def test_sheddable_requests_are_shed_with_429_when_the_pool_is_saturated(own_stack: LocalStack) -> None:
    pod = own_stack.pods[0]
    body = {"model": "base", "prompt": "busy", "max_tokens": 10}  # 1 s each, one at a time
    sheddable = {"x-gateway-inference-objective": SHEDDABLE_OBJECTIVE}
    with concurrent.futures.ThreadPoolExecutor(max_workers=9) as pool:
        # Load the pod directly, not through the EPP: 9 requests, 8 of them waiting (> 5).
        busy = [pool.submit(post, f"{pod.url}/v1/completions", body) for _ in range(9)]
        wait_until(lambda: _waiting_requests(pod.url) > 5, "the pod has more than 5 requests waiting")
        # ... and the EPP has scraped it so: it sheds on what it last saw.
        wait_until(
            lambda: epp_metric(own_stack, "inference_pool_per_pod_queue_size") > 5,
            "the EPP sees the pod's queue",
        )
        reply = completion(own_stack, ADAPTERS[0], headers=sheddable)
        assert reply.status == 429, reply.body
        assert _error(reply)["type"] == "InferencePoolResourceExhausted"
        # A request that is not sheddable is still admitted (it queues on the busy pod).
        assert completion(own_stack, ADAPTERS[0]).status == 200
        assert all(future.result().status == 200 for future in busy)
