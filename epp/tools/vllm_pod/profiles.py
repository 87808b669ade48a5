"""`epp bench`'s calibrated cost model: one model-server replica on named hardware.

Every constant names its public source beside it (`PROFILES` and the adapter-load constants);
docs/benchmarks.md has the same table. A step costs a fixed base, plus a cost per decoding
sequence and per prefill token, scaled by the number of distinct adapters in the batch; an adapter
load costs a fixed time plus the adapter's size over each link it crosses (disk → host → GPU).

An adapter's size is linear in its rank (each adapted weight gains rank × (in + out) parameters,
Hu et al. 2021, "LoRA", §4.1), so a profile states its size at one rank and `at_rank` rescales it
for a scenario whose adapters have another (`adapters.rank` in a scenario file).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from epp.tools.vllm_pod.lora import AdapterTier

BYTES_PER_GB = 1e9


@dataclass(frozen=True, slots=True)
class PodProfile:
    """Cost model of one model-server replica (one pod), all times in seconds; a `CostModel`."""

    name: str
    step_base_s: float  # fixed cost of one engine step (the c=1 ITL minus one sequence)
    decode_s_per_seq: float  # extra step time per decoding sequence in the batch
    prefill_s_per_token: float  # step time per prefill token scheduled in the step
    kv_capacity_tokens: int  # KV cache size in tokens
    adapter_bytes: int  # size of one LoRA adapter at `adapter_rank` held by this pod (per GPU under TP)
    lora_step_overhead_per_adapter: float  # k6: step factor 1 + k6 · distinct adapters in the batch
    block_size_tokens: int = 16  # vLLM default KV block size
    adapter_load_s: float | None = None  # fixed load time per slot miss; None = size-based (below)
    adapter_rank: int = 16  # the LoRA rank `adapter_bytes` was computed at

    def at_rank(self, rank: int) -> PodProfile:
        """This profile serving adapters of LoRA rank `rank`: the same modules, a size scaled by rank.

        Only the load cost follows; the step overhead k6 stays the profile's (its source gives it
        at r8 and r16, not as a law in rank).
        """
        if rank < 1:
            raise ValueError(f"adapter rank must be at least 1, got {rank}")
        return dataclasses.replace(
            self, adapter_rank=rank, adapter_bytes=round(self.adapter_bytes * rank / self.adapter_rank)
        )

    def step_s(self, decoding: int, running: int, prefill_tokens: int, distinct_adapters: int) -> float:
        del running  # the sources price decoding sequences and prefill tokens, not batch membership
        return (
            self.step_base_s + self.decode_s_per_seq * decoding + self.prefill_s_per_token * prefill_tokens
        ) * (1.0 + self.lora_step_overhead_per_adapter * distinct_adapters)

    def load_s(self, source: AdapterTier) -> float:
        if source is AdapterTier.GPU:
            return 0.0
        if self.adapter_load_s is not None:
            return self.adapter_load_s
        # A host copy crosses PCIe into the slot; a storage read lands in host memory first.
        load_s = CPU_TO_GPU_FIXED_S + self.adapter_bytes / CPU_TO_GPU_BYTES_PER_S
        if source is AdapterTier.DISK:
            load_s += DISK_FIXED_S + self.adapter_bytes * DISK_S_PER_BYTE
        return load_s


# Calibration: each number names its public source.
PROFILES: dict[str, PodProfile] = {
    # Llama-3.1/3.3-70B on 2×H100 fp8 TP2 (NVIDIA NIM 1.8.0 published benchmarks):
    #   ITL 18.6 ms at c=1 and 92.9 ms at c=100 → +0.75 ms per sequence, step base 18.6 − 0.75 ms;
    #   TTFT 407 ms for 5,000 input tokens at c=1 → 0.0814 ms per prefill token.
    # KV: 2 × 80 GB × 0.9 (vLLM gpu_memory_utilization default) − 70 GB fp8 weights = 74 GB at
    #   160 KB/token (fp8: 80 layers × 8 KV heads × 128 × K and V × 1 byte) → ≈ 462,000 tokens.
    # Adapter: q,k,v,o at rank 16 = 16 × (in + out) × 80 layers × 2 bytes = 131 MB, halved per GPU under TP2.
    # k6 = 0.035 for r16 (the BLIS simulator's LoRA step-overhead model).
    "llama-3.1-70b-h100-tp2": PodProfile(
        name="llama-3.1-70b-h100-tp2",
        step_base_s=0.01785,
        decode_s_per_seq=0.00075,
        prefill_s_per_token=0.0000814,
        kv_capacity_tokens=462_000,
        adapter_bytes=66_000_000,
        lora_step_overhead_per_adapter=0.035,
        adapter_rank=16,
    ),
    # Llama-3.1-8B on 1×H100 bf16 (NVIDIA NIM Llama-3.1-8B v1.8.0 benchmarks): ITL 4.6 ms at c=1, 7.6 ms at
    #   c=100 → +0.030 ms per sequence. Prefill: the 70B per-token cost scaled by parameter count
    #   (8/70) = 0.0093 ms/token (NIM 8B does not state its input length).
    # KV: 80 GB × 0.9 − 16 GB weights = 56 GB at 128 KB/token (32 layers × 8 KV heads × 128 × K and V
    #   × 2 bytes) → ≈ 437,000 tokens.
    # Adapter: q,v at rank 8 = 8 × (in + out) × 32 layers × 2 bytes ≈ 7 MB (GIE's multi-LoRA regression uses
    #   rank 8). k6 = 0.02 for r8 (BLIS).
    "llama-3.1-8b-h100": PodProfile(
        name="llama-3.1-8b-h100",
        step_base_s=0.00457,
        decode_s_per_seq=0.000030,
        prefill_s_per_token=0.0000093,
        kv_capacity_tokens=437_000,
        adapter_bytes=7_000_000,
        lora_step_overhead_per_adapter=0.02,
        adapter_rank=8,
    ),
}

# Adapter load latency:
# host RAM → GPU: 1.5 ms fixed (BLIS cold-load model) + bytes at 25 GB/s (PCIe 4 arithmetic);
CPU_TO_GPU_FIXED_S = 0.0015
CPU_TO_GPU_BYTES_PER_S = 25 * BYTES_PER_GB
# disk → host cache: ≈ 10 ms fixed (a disk reload measured on vLLM 0.32.0 on CPU) + 0.4 s per GB
# (vLLM host-cache activation of a 1 GB adapter, as the llm-d router's loraloadstate README measures).
DISK_FIXED_S = 0.010
DISK_S_PER_BYTE = 0.4 / BYTES_PER_GB
