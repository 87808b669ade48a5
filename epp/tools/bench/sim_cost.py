"""`epp sim`'s latencies as a bench profile, so a scenario can model the loopback's pods exactly.

The bench prices steps with a calibrated hardware profile; `epp sim` (what the inference-perf
loopback and the kind pool run) prices them with the latencies set on its command line
(`LatencyCost`). A bench figure meant to be compared with a loopback run must use the sim's
costs, or the two disagree for reasons that have nothing to do with routing (a 20 ms fixed
prefill step under the sim against a sub-millisecond one under the 8B profile, for instance).
A scenario asks for this with a `sim_cost:` section (see `parse_sim_cost`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from epp.tools.vllm_pod.cost import LatencyCost
from epp.tools.vllm_pod.lora import AdapterTier
from epp.tools.vllm_pod.profiles import PodProfile

# `epp sim`'s default KV capacity (`--kv-cache-tokens`, epp/tools/sim/cli.py).
SIM_KV_CACHE_TOKENS = 65536

_FIELDS = {field.name for field in dataclasses.fields(LatencyCost)}


@dataclass(frozen=True, slots=True)
class SimLatencyProfile(PodProfile):
    """A `PodProfile` whose steps and loads are `epp sim`'s `LatencyCost`.

    The profile's own knobs keep their meaning for the bench's floors: `adapter_load_s` (when set)
    replaces every load, and `lora_step_overhead_per_adapter` is the sim's slowdown per extra
    distinct adapter in a batch, so the unconstrained run (free loads, no overhead) still works.
    """

    latency: LatencyCost = dataclasses.field(default_factory=LatencyCost)

    def step_s(self, decoding: int, running: int, prefill_tokens: int, distinct_adapters: int) -> float:
        cost = dataclasses.replace(self.latency, lora_step_slowdown=self.lora_step_overhead_per_adapter)
        return cost.step_s(decoding, running, prefill_tokens, distinct_adapters)

    def load_s(self, source: AdapterTier) -> float:
        if source is not AdapterTier.GPU and self.adapter_load_s is not None:
            return self.adapter_load_s
        return self.latency.load_s(source)


def parse_sim_cost(value: Any) -> SimLatencyProfile:
    """`sim_cost: {time_to_first_token_s: 0.02, …, kv_cache_tokens: 65536}`: `LatencyCost`'s fields
    (each optional, `epp sim`'s defaults otherwise) and the KV capacity."""
    if not isinstance(value, Mapping):
        raise ValueError("sim_cost must be a mapping of LatencyCost fields and kv_cache_tokens")
    unknown = set(value) - _FIELDS - {"kv_cache_tokens"}
    if unknown:
        raise ValueError(f"unknown keys in sim_cost: {', '.join(sorted(unknown))}")
    numbers = {key: float(v) for key, v in value.items() if key in _FIELDS}
    if any(v < 0 for v in numbers.values()):
        raise ValueError("sim_cost: latencies and factors must be ≥ 0")
    latency = LatencyCost(**numbers)
    kv_tokens = int(value.get("kv_cache_tokens", SIM_KV_CACHE_TOKENS))
    if kv_tokens < 16:
        raise ValueError("sim_cost.kv_cache_tokens must be at least one block (16)")
    return SimLatencyProfile(
        name="epp-sim",
        step_base_s=latency.inter_token_latency_s,
        decode_s_per_seq=0.0,
        prefill_s_per_token=latency.prefill_time_per_token_s,
        kv_capacity_tokens=kv_tokens,
        adapter_bytes=0,
        lora_step_overhead_per_adapter=latency.lora_step_slowdown,
        latency=latency,
    )
