"""How long a step takes: the pluggable part of the pod model.

The scheduler (`epp.tools.vllm_pod.pod`) decides what a step holds; a `CostModel` turns that into
seconds. This is the one place the consumers legitimately differ: `epp bench` wants figures that
carry over to real hardware, so it uses a profile calibrated from published measurements
(`epp.tools.vllm_pod.profiles.PodProfile`); `epp sim` wants latencies an operator sets on the
command line (`LatencyCost`); the scenario tests want round numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from epp.tools.vllm_pod.lora import AdapterTier


class CostModel(Protocol):
    """Step time from what the step holds; adapter loads are added on top of it."""

    def step_s(self, decoding: int, running: int, prefill_tokens: int, distinct_adapters: int) -> float:
        """One engine step: `decoding` sequences each produce a token, `prefill_tokens` prompt tokens
        are computed, `running` requests are in the batch holding `distinct_adapters` adapters."""
        ...

    def load_s(self, source: AdapterTier) -> float:
        """Bringing one adapter into a GPU slot from `source` (CPU or DISK)."""
        ...


@dataclass(frozen=True, slots=True)
class LatencyCost:
    """`epp sim`'s cost, set by its flags: a fixed prefill time and an ITL that grows with the batch.

    step = (prefill + decode) × (1 + lora_step_slowdown × (distinct adapters − 1)), where prefill =
    time_to_first_token + prefill_time_per_token × prompt tokens computed (when the step computes
    any) and decode = inter_token_latency × (1 + itl_batch_factor × (running − 1)) (when any
    sequence decodes).
    """

    time_to_first_token_s: float = 0.020
    inter_token_latency_s: float = 0.005
    prefill_time_per_token_s: float = 0.0
    itl_batch_factor: float = 0.05
    lora_step_slowdown: float = 0.10
    lora_load_latency_s: float = 0.050  # storage → GPU slot
    lora_cpu_load_latency_s: float = 0.002  # host memory → GPU slot

    def step_s(self, decoding: int, running: int, prefill_tokens: int, distinct_adapters: int) -> float:
        prefill_s = (
            self.time_to_first_token_s + self.prefill_time_per_token_s * prefill_tokens
            if prefill_tokens
            else 0.0
        )
        decode_s = (
            self.inter_token_latency_s * (1.0 + self.itl_batch_factor * (running - 1)) if decoding else 0.0
        )
        return (prefill_s + decode_s) * (1.0 + self.lora_step_slowdown * max(0, distinct_adapters - 1))

    def load_s(self, source: AdapterTier) -> float:
        if source is AdapterTier.GPU:
            return 0.0
        return self.lora_cpu_load_latency_s if source is AdapterTier.CPU else self.lora_load_latency_s
