"""The `Stack` on loopback: real Envoy, `epp serve` and `epp sim` pods from `epp.tools.localstack`.

Kubernetes actions become what the EPP's pool-file source sees: deleting a pod removes it from
the pool file and ends its process; applying an InferenceModel adds it to the pool file. The
baseline is a second stack of fresh pods behind Envoy's plain round-robin cluster.
"""

from __future__ import annotations

import contextlib
import pathlib
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager

import yaml

from e2e.stack import Baseline, Split, finished_by_in
from epp.picker.datastore.types import FailureMode
from epp.tools.envoy.bootstrap import RoutingMode
from epp.tools.localstack import LocalStack, SimOptions, StackOptions, pool_yaml
from testkit import faults

POOL_NAME = "sim-pool"  # the name epp.tools.localstack gives its pool


def stack_options(*, pods: int, adapters: Sequence[str], routing: RoutingMode) -> StackOptions:
    return StackOptions(
        pods=pods,
        sim=SimOptions(adapters=tuple(adapters), max_loras=2, lora_load_latency_s=0.05),
        routing=routing,
        failure_mode=FailureMode.FAIL_OPEN,
        extra_serve_args=("--v=4", "--log-format=json"),
    )


class LocalE2EStack:
    """Owns a started `LocalStack` (and, on first use, a round-robin baseline stack)."""

    def __init__(
        self, *, pods: int = 4, adapters: Sequence[str] = ("a0", "a1", "a2", "a3", "a4", "a5")
    ) -> None:
        self._adapters = tuple(adapters)
        self._pods_count = pods
        self.local = LocalStack(stack_options(pods=pods, adapters=adapters, routing=RoutingMode.EPP), seed=1)
        self._baseline: LocalStack | None = None
        self._deleted: set[str] = set()
        self._models: dict[str, dict[str, object]] = {}

    # ----- lifecycle -----

    def start(self) -> None:
        self.local.start()
        # One InferenceModel per adapter, as kind/values.yaml has: with a model registry in place, a
        # model name no InferenceModel claims gets a 404 from the EPP.
        for adapter in self._adapters:
            self._models[adapter] = _inference_model(adapter, adapter, [])
        self._write_pool_file()

    def stop(self) -> None:
        self.local.stop()
        if self._baseline is not None:
            self._baseline.stop()

    # ----- Stack -----

    @property
    def gateway_url(self) -> str:
        return self.local.gateway_url

    @property
    def adapters(self) -> Sequence[str]:
        return self._adapters

    @property
    def fail_open(self) -> bool:
        return self.local.options.failure_mode is FailureMode.FAIL_OPEN

    def endpoints(self) -> dict[str, str]:
        return {pod.name: pod.address for pod in self.local.pods if pod.name not in self._deleted}

    def delete_pod(self, name: str) -> None:
        self._deleted.add(name)
        self._write_pool_file()
        faults.kill_pod(self.local, name)

    @contextlib.contextmanager
    def _epp_stopped(self) -> Iterator[None]:
        faults.stop_epp(self.local)
        try:
            faults.wait_envoy_sees_epp_down(self.local)
            yield
        finally:
            faults.restart_epp(self.local)

    def epp_stopped(self) -> AbstractContextManager[None]:
        return self._epp_stopped()

    def apply_inference_model(self, name: str, model_name: str, targets: Sequence[str]) -> None:
        self._models[name] = _inference_model(name, model_name, targets)
        self._write_pool_file()

    def delete_inference_model(self, name: str) -> None:
        self._models.pop(name, None)
        self._write_pool_file()

    def adapter_loads(self) -> float:
        return sum(self.local.adapter_loads().values())

    @property
    def gateway_access_log(self) -> bool:
        return self.local.options.access_log

    def epp_finished_by(self, source: str) -> float:
        url = f"http://127.0.0.1:{self.local.epp_metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return finished_by_in(response.read().decode(), source)

    def epp_log_lines(self) -> list[str]:
        path = self.local.workdir / "epp.log"
        return path.read_text(errors="replace").splitlines() if path.exists() else []

    @property
    def baseline(self) -> Baseline | None:
        if self._baseline is None:
            options = stack_options(
                pods=self._pods_count, adapters=self._adapters, routing=RoutingMode.ROUND_ROBIN
            )
            self._baseline = LocalStack(options, seed=2)
            self._baseline.start()
        stack = self._baseline
        return Baseline(
            url=stack.gateway_url, headers={}, adapter_loads=lambda: sum(stack.adapter_loads().values())
        )

    @property
    def kill_epp_leader(self) -> Callable[[], str] | None:
        return None  # one EPP process; leader election needs the Kubernetes API

    @property
    def split(self) -> Callable[[], AbstractContextManager[Split]] | None:
        return None  # one pool behind one Envoy listener

    # ----- pool file -----

    def _write_pool_file(self) -> None:
        live = [(pod.name, pod.ip) for pod in self.local.pods if pod.name not in self._deleted]
        port = self.local.pods[0].port
        text = pool_yaml(POOL_NAME, live, port, self.local.options.failure_mode)
        extra = yaml.safe_dump_all(list(self._models.values()), sort_keys=False)
        _atomic_write(self.local.pool_file, text + "\n---\n" + extra)


def _inference_model(name: str, model_name: str, targets: Sequence[str]) -> dict[str, object]:
    spec: dict[str, object] = {
        "modelName": model_name,
        "poolRef": {"group": "inference.networking.k8s.io", "name": POOL_NAME},
    }
    if targets:
        spec["targetModels"] = [{"name": target} for target in targets]
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceModel",
        "metadata": {"name": name},
        "spec": spec,
    }


def _atomic_write(path: pathlib.Path, text: str) -> None:
    """The EPP polls the file: it must never read half of it."""
    partial = path.with_suffix(".partial")
    partial.write_text(text)
    partial.replace(path)
