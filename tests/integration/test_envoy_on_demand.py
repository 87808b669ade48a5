"""On-demand adapter loading through real Envoy + `epp serve --adapter-catalog` + `epp sim` pods.

What a user of `preloadStrategy: demand` sees: the first request for an adapter that no pod
has registered succeeds, served by a pod that loaded it through the runtime LoRA API;
concurrent first requests do not load it on several pods at once; a load that fails is a
clear 503 and the EPP keeps serving everything else.
"""

from __future__ import annotations

import concurrent.futures
import json
import urllib.request
from collections.abc import Iterator

import pytest

from epp.tools.localstack import LocalStack, SimOptions, StackOptions
from tests.integration.conftest import Reply, _started, completion

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def registered_adapters(stack: LocalStack) -> dict[str, set[str]]:
    """Pod name -> adapters in its `/v1/models` (what vLLM has registered)."""
    found: dict[str, set[str]] = {}
    for pod in stack.pods:
        with urllib.request.urlopen(f"{pod.url}/v1/models", timeout=5) as response:
            payload = json.loads(response.read())
        found[pod.name] = {m["id"] for m in payload["data"] if m.get("parent")}
    return found


@pytest.fixture(scope="module")
def demand_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    root = tmp_path_factory.mktemp("adapters")
    for name in ("legal-lora", "code-lora"):
        (root / name).mkdir()
        (root / name / "adapter_config.json").write_text("{}")
    catalog = root / "adapters.yaml"
    catalog.write_text(
        "preloadStrategy: demand\n"
        "adapters:\n"
        f"- {{name: legal-assistant-v2, path: {root / 'legal-lora'}}}\n"
        f"- {{name: code-reviewer-xl, path: {root / 'code-lora'}}}\n"
        f"- {{name: missing-weights, path: {root / 'nowhere'}}}\n"
    )
    options = StackOptions(
        pods=3,
        sim=SimOptions(
            adapters=(), max_loras=2, lora_load_latency_s=0.05, extra_args=("--check-lora-paths",)
        ),
        extra_serve_args=("--adapter-catalog", str(catalog)),
    )
    yield from _started(options)


def test_first_request_for_an_unregistered_adapter_is_served_by_the_pod_that_loaded_it(
    demand_stack: LocalStack,
) -> None:
    assert not any(registered_adapters(demand_stack).values()), "no pod starts with the adapter"
    reply = completion(demand_stack, "legal-assistant-v2")
    assert reply.status == 200, reply.body
    payload = reply.json()
    assert isinstance(payload, dict) and payload["model"] == "legal-assistant-v2"
    holders = {
        pod for pod, adapters in registered_adapters(demand_stack).items() if "legal-assistant-v2" in adapters
    }
    assert holders == {reply.pod}


def test_concurrent_first_requests_load_the_adapter_once_per_serving_pod(demand_stack: LocalStack) -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        replies: list[Reply] = list(
            pool.map(lambda _: completion(demand_stack, "code-reviewer-xl"), range(8))
        )
    assert [r.status for r in replies] == [200] * 8, [r.body for r in replies]
    serving = {r.pod for r in replies}
    holders = {
        pod for pod, adapters in registered_adapters(demand_stack).items() if "code-reviewer-xl" in adapters
    }
    assert holders == serving
    assert len(holders) == 1, "eight simultaneous first requests were spread over several pods"


def test_a_failed_load_is_a_clear_503_and_everything_else_keeps_working(demand_stack: LocalStack) -> None:
    reply = completion(demand_stack, "missing-weights")
    assert reply.status == 503, reply.body
    assert reply.headers.get("content-type", "").startswith("application/json")
    error = reply.json()
    assert isinstance(error, dict)
    assert "missing-weights" in error["error"]["message"]
    assert completion(demand_stack, "legal-assistant-v2").status == 200
    assert completion(demand_stack, "base").status == 200


def test_adapters_outside_the_catalogue_are_routed_as_before(demand_stack: LocalStack) -> None:
    # Not in the catalogue: no load is attempted and the model server's own 404 reaches the client.
    reply = completion(demand_stack, "not-in-catalogue")
    assert reply.status == 404, reply.body
    assert not any("not-in-catalogue" in a for a in registered_adapters(demand_stack).values())
