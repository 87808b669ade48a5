"""Real processes on loopback: simulated pods, `epp serve`, and a real Envoy in front.

Stacks that tests only read from are session-scoped (started once); tests that break a stack
(kill a pod, kill the EPP, rewrite the pool file) get their own. Every stack stops all of its
processes when its fixture ends, whatever happened.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping

import pytest

from epp.picker.extproc.stream import BodyMode
from epp.picker.scheduling.policies import DEFAULT_CONFIG
from epp.tools.envoy.bootstrap import RoutingMode
from epp.tools.localstack import LocalStack, SimOptions, StackOptions
from testkit import faults

ADAPTERS = ("adapter-0", "adapter-1", "adapter-2", "adapter-3")
SHEDDABLE_OBJECTIVE = "batch-jobs"


def models_yaml(models: tuple[str, ...]) -> str:
    """InferenceModels for `models` (so unknown models get 404) and a sheddable objective."""
    docs = [
        "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceModel\n"
        f"metadata:\n  name: {name}\nspec:\n  modelName: {name}\n  criticality: Standard\n"
        "  poolRef:\n    group: inference.networking.k8s.io\n    name: sim-pool\n"
        for name in models
    ]
    docs.append(
        "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\n"
        f"metadata:\n  name: {SHEDDABLE_OBJECTIVE}\nspec:\n  priority: -1\n  poolRef:\n    name: sim-pool\n"
    )
    return "---\n".join(docs)


SIM = SimOptions(
    adapters=ADAPTERS,
    max_loras=2,
    lora_load_latency_s=0.05,
    extra_args=("--max-model-len", "200000", "--kv-cache-tokens", "400000"),
)
EPP_STACK = StackOptions(pods=3, sim=SIM, extra_pool_yaml=models_yaml(("base", *ADAPTERS)))
# `default` without early refusal, for tests whose subject is restarts, kills and replicas, not
# overload: on a busy test machine the simulated pods fall behind, the pool saturates, and the
# overload judge would rightly answer some requests 429 (its own tests: tests/unit/picker/
# flowcontrol/test_overload.py, tests/unit/picker/test_director.py, the Sheddable 429 through
# Envoy in test_envoy_errors.py).
NO_EARLY_REFUSAL = (
    "--config-text",
    DEFAULT_CONFIG.replace(
        "- type: lora-capacity-detector\n",
        "- type: lora-capacity-detector\n  parameters: {queueWaitTarget: 0s}\n",
    ),
)


@dataclasses.dataclass(frozen=True, slots=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> object:
        return json.loads(self.body)

    @property
    def pod(self) -> str:
        return self.headers.get("x-inference-pod", "")


def post(url: str, body: bytes | dict[str, object], headers: Mapping[str, str] | None = None) -> Reply:
    """POST and return status, lower-cased headers and body, for any status."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"content-type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return Reply(
                response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
            )
    except urllib.error.HTTPError as err:
        return Reply(err.code, {k.lower(): v for k, v in err.headers.items()}, err.read())


def completion(
    stack: LocalStack, model: str, headers: Mapping[str, str] | None = None, **extra: object
) -> Reply:
    body: dict[str, object] = {"model": model, "prompt": "Say hello.", "max_tokens": 4, **extra}
    return post(f"{stack.gateway_url}/v1/completions", body, headers)


def _started(options: StackOptions) -> Iterator[LocalStack]:
    stack = LocalStack(options)
    try:
        stack.start()
    except Exception:
        print(faults.log_tails(stack))
        stack.stop()
        raise
    try:
        yield stack
    finally:
        stack.stop()


# Package scope: the stacks (and the EPPs scraping their sims every 50 ms) are gone before the
# real-vLLM tier starts, so they never compete with the real servers for the CPU.
@pytest.fixture(scope="package")
def fdx_stack() -> Iterator[LocalStack]:
    """EPP in FULL_DUPLEX_STREAMED, FailClose, InferenceModels configured."""
    yield from _started(EPP_STACK)


@pytest.fixture(scope="package")
def buffered_stack() -> Iterator[LocalStack]:
    yield from _started(dataclasses.replace(EPP_STACK, body_mode=BodyMode.BUFFERED))


@pytest.fixture(scope="package")
def round_robin_stack() -> Iterator[LocalStack]:
    yield from _started(dataclasses.replace(EPP_STACK, routing=RoutingMode.ROUND_ROBIN))


@pytest.fixture
def own_stack(request: pytest.FixtureRequest) -> Iterator[LocalStack]:
    """A fresh stack a test may break; parametrize indirectly with StackOptions."""
    options: StackOptions = getattr(request, "param", EPP_STACK)
    yield from _started(options)
