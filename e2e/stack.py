"""What a check needs from a deployment, whichever way it runs (cluster or loopback).

A `Stack` is a gateway in front of an InferencePool of simulated vLLM pods (`epp sim`, which
names itself in `x-inference-pod`) routed by lora-epp. Optional abilities are `None` when a
stack cannot offer them, and the checks that need them skip with the reason.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Protocol


@dataclasses.dataclass(frozen=True, slots=True)
class Baseline:
    """The same kind of pods behind plain load balancing (no endpoint picker)."""

    url: str
    headers: Mapping[str, str]
    adapter_loads: Callable[[], float]  # adapter loads so far, summed over the baseline's pods


@dataclasses.dataclass(frozen=True, slots=True)
class Split:
    """A route that splits traffic by weight across two pools, each with its own EPP."""

    headers: Mapping[str, str]  # what a request carries to take the split route
    weights: Mapping[str, int]  # pool name → backendRef weight
    pool_of_pod: Callable[[str], str]  # pod name (x-inference-pod) → pool name


class Stack(Protocol):
    @property
    def gateway_url(self) -> str:
        """http://host:port of the gateway's listener."""

    @property
    def adapters(self) -> Sequence[str]:
        """LoRA adapters every pod of the pool serves (usable as `model`)."""

    @property
    def fail_open(self) -> bool:
        """Whether the pool's failureMode is FailOpen (the gateway serves without the EPP)."""

    def endpoints(self) -> dict[str, str]:
        """Pod name → `ip:port` of every Ready pod of the pool."""

    def delete_pod(self, name: str) -> None:
        """Take a pod away as Kubernetes does: it leaves the pool, then its process ends."""

    def epp_stopped(self) -> AbstractContextManager[None]:
        """Inside the block every EPP replica is gone; on exit the EPP serves again."""

    def apply_inference_model(self, name: str, model_name: str, targets: Sequence[str]) -> None:
        """Create or replace an InferenceModel of the pool (kubectl apply / a pool file edit)."""

    def delete_inference_model(self, name: str) -> None: ...

    def adapter_loads(self) -> float:
        """`vllm_sim:lora_adapter_loads_total` summed over the pool's current pods."""

    def epp_log_lines(self) -> list[str]:
        """Every log line the EPP has written so far (JSON lines; at least --v=4 for picks)."""

    @property
    def gateway_access_log(self) -> bool:
        """Whether the gateway sends the EPP its gRPC access log (every one we ship but agentgateway)."""

    def epp_finished_by(self, source: str) -> float:
        """`inference_extension_request_finished_total{source=...}` summed over the EPP replicas."""

    @property
    def baseline(self) -> Baseline | None: ...

    @property
    def kill_epp_leader(self) -> Callable[[], str] | None:
        """Kills the EPP replica that holds the leader lease and returns its name (HA only)."""

    @property
    def split(self) -> Callable[[], AbstractContextManager[Split]] | None: ...


def iter_json_lines(lines: Sequence[str]) -> Iterator[dict[str, object]]:
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            yield entry


def picks_from_log(lines: Sequence[str]) -> list[tuple[str, str]]:
    """(request id, destination) for every "request routed" line, in log order."""
    picks = []
    for entry in iter_json_lines(lines):
        if entry.get("msg") == "request routed" and isinstance(entry.get("destination"), str):
            picks.append((str(entry.get("request_id", "")), str(entry["destination"])))
    return picks


def finished_by_in(metrics_text: str, source: str) -> float:
    """`inference_extension_request_finished_total{source=...}` in one EPP's /metrics text."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics_text)
        for sample in family.samples
        if sample.name == "inference_extension_request_finished_total"
        and sample.labels.get("source") == source
    )


def finished_from_log(lines: Sequence[str]) -> list[tuple[str, dict[str, object]]]:
    """(request id, fields) for every "request finished" line (status, served, finished_by), in log order."""
    finished = []
    for entry in iter_json_lines(lines):
        if entry.get("msg") == "request finished":
            finished.append((str(entry.get("request_id", "")), entry))
    return finished
