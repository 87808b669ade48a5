"""The benchmark's pod: the shared vLLM pod model, costed by a calibrated hardware profile.

The model itself (scheduling, LoRA slots, KV, prefix cache, `/metrics`) is `epp.tools.vllm_pod`,
the same code `epp sim` serves over HTTP, under the same vLLM rules; here it is costed by a
`PodProfile` and the names the event loop uses are gathered in one place.
"""

from __future__ import annotations

from epp.tools.vllm_pod.pod import PodConfig, PodCounters, VllmPod
from epp.tools.vllm_pod.profiles import PROFILES, PodProfile
from epp.tools.vllm_pod.request import SimRequest

__all__ = ["PROFILES", "PodConfig", "PodCounters", "PodProfile", "SimPod", "SimRequest"]


class SimPod(VllmPod):
    """One vLLM replica on the hardware `profile` describes, configured with vLLM's `config` flags."""

    def __init__(self, name: str, profile: PodProfile, config: PodConfig) -> None:
        super().__init__(
            name,
            config,
            profile,
            kv_capacity_tokens=profile.kv_capacity_tokens,
            block_size=profile.block_size_tokens,
        )
        self.profile = profile
