"""A simulated vLLM pod in simulated time: continuous batching, LoRA slots, KV and prefix cache.

Pure: no I/O and no clock. The event loop (`epp.tools.bench.events`) calls `begin_step(now)` to
schedule one engine step (it returns the step's duration in seconds) and `end_step(end_s)` when
that step is over (it returns the requests that finished). `metrics(now)` reports what vLLM's
`/metrics` would say at that moment, quirks included (see `metrics`).

Every constant names its public source beside it (`PROFILES`); docs/benchmarks.md has the same
table.
"""

from __future__ import annotations

import heapq
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass

from epp.picker.datastore.types import Metrics

BYTES_PER_GB = 1e9


@dataclass(frozen=True, slots=True)
class PodProfile:
    """Cost model of one model-server replica (one pod), all times in seconds."""

    name: str
    step_base_s: float  # fixed cost of one engine step (the c=1 ITL minus one sequence)
    decode_s_per_seq: float  # extra step time per decoding sequence in the batch
    prefill_s_per_token: float  # step time per prefill token scheduled in the step
    kv_capacity_tokens: int  # KV cache size in tokens
    adapter_bytes: int  # size of one LoRA adapter held by this pod (per GPU under TP)
    lora_step_overhead_per_adapter: float  # k6: step factor 1 + k6 · distinct adapters in the batch
    block_size_tokens: int = 16  # vLLM default KV block size
    adapter_load_s: float | None = None  # fixed load time per slot miss; None = size-based (below)


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


@dataclass(frozen=True, slots=True)
class PodConfig:
    """vLLM server flags that matter here (names as vLLM's CLI spells them)."""

    max_loras: int = 4  # --max-loras: GPU slots = distinct adapters one batch may hold
    max_cpu_loras: int = 8  # --max-cpu-loras: host-RAM tier (vLLM defaults it to max_loras)
    max_num_seqs: int = 256  # --max-num-seqs (vLLM V1 default on GPUs)
    max_num_batched_tokens: int = 8192  # --max-num-batched-tokens: token budget per step (chunked prefill)
    served_model_name: str = "base"


class SimRequest:
    """One request's workload and what happened to it (mutable: the simulator fills it in)."""

    __slots__ = (
        "adapter",
        "adapter_hit",
        "arrival_s",
        "cached_tokens",
        "caused_swap",
        "finish_s",
        "first_token_s",
        "index",
        "output_tokens",
        "pod",
        "prefill_remaining",
        "prefix_key",
        "prefix_tokens",
        "prompt_tokens",
        "queued",
        "rejected",
        "slot_blocked",
    )

    def __init__(
        self,
        index: int,
        arrival_s: float,
        adapter: str,
        prompt_tokens: int,
        output_tokens: int,
        prefix_key: str = "",
        prefix_tokens: int = 0,
    ) -> None:
        self.index = index
        self.arrival_s = arrival_s
        self.adapter = adapter  # "" = base model, needs no slot
        self.prompt_tokens = max(1, prompt_tokens)
        self.output_tokens = max(1, output_tokens)
        self.prefix_key = prefix_key  # shared prompt prefix (e.g. the adapter's system prompt)
        self.prefix_tokens = min(prefix_tokens, self.prompt_tokens)
        self.pod = ""
        self.adapter_hit = False  # adapter resident in a GPU slot of its pod when it arrived
        self.caused_swap = False  # its admission evicted another adapter from a GPU slot
        self.cached_tokens = 0
        self.prefill_remaining = 0
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.rejected = False
        self.queued = False  # in a pod's waiting queue
        self.slot_blocked = False  # arrived while the batch held max_loras other adapters

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    @property
    def kv_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class PodCounters:
    swaps: int
    loads_from_cpu: int
    loads_from_disk: int
    steps: int
    max_distinct_adapters_in_batch: int
    max_running: int


class SimPod:
    """One vLLM replica, following vLLM V1's scheduler where routing can see the difference.

    - Running requests first get their share of the step's token budget (1 per decoding
      sequence, prefill chunks); then waiting requests are admitted in FIFO order.
    - A waiting request whose adapter is not in the batch while the batch already holds
      `max_loras` distinct adapters is skipped ("deferred") and later requests may pass it,
      as vLLM does; this is what makes a fifth adapter on a four-slot pod wait for a slot.
    - GPU slots are an LRU of `max_loras`; an adapter not in a slot is loaded (from host RAM
      or disk, see the load constants) into a free slot or over the least recently used
      adapter with no request in the batch (a swap). The load time is added to that step.
    - KV: a request reserves prompt + output tokens on admission (no preemption); a request
      that does not fit stops admission, as vLLM's allocator does.
    - Prefix cache: per adapter (vLLM seeds block hashes with the LoRA id); a finished
      prefill leaves its shared prefix cached in free KV, LRU-evicted when KV runs short.
    """

    def __init__(self, name: str, profile: PodProfile, config: PodConfig) -> None:
        if config.max_loras < 1 or config.max_num_seqs < 1:
            raise ValueError("max_loras and max_num_seqs must be at least 1")
        self.name = name
        self.profile = profile
        self.config = config
        # Waiting requests, held twice so admission never rescans skipped ones: in arrival order
        # (a heap on the request index) and per adapter. Entries are dropped lazily once admitted.
        self._waiting_heap: list[tuple[int, SimRequest]] = []
        self._queues: dict[str, deque[SimRequest]] = {}
        self._queued_by_adapter: Counter[str] = Counter()
        self._waiting_count = 0
        self._prefilling: list[SimRequest] = []
        self._decoding: list[tuple[int, int, SimRequest]] = []  # (finish step, index, request)
        self._running_by_adapter: Counter[str] = Counter()
        self.gpu_slots: OrderedDict[str, None] = OrderedDict()  # LRU, oldest first
        self.cpu_tier: OrderedDict[str, None] = OrderedDict()
        self._prefix_cache: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._prefix_cached_tokens = 0
        self.kv_used_tokens = 0
        self.deferred = 0
        self.busy = False  # a step is in progress
        self._step = 0
        self._finishing_prefill: list[SimRequest] = []
        self._swaps = 0
        self._loads_cpu = 0
        self._loads_disk = 0
        self._max_distinct = 0
        self._max_running = 0

    # --- requests in -------------------------------------------------------------------------

    def enqueue(self, request: SimRequest) -> None:
        """A request routed here joins the waiting queue (the event loop then starts a step)."""
        request.pod = self.name
        request.adapter_hit = request.adapter == "" or request.adapter in self.gpu_slots
        request.slot_blocked = (
            request.adapter != ""
            and request.adapter not in self._running_by_adapter
            and len(self._running_by_adapter) - ("" in self._running_by_adapter) >= self.config.max_loras
        )
        request.queued = True
        self._waiting_count += 1
        self._queued_by_adapter[request.adapter] += 1
        heapq.heappush(self._waiting_heap, (request.index, request))
        self._queues.setdefault(request.adapter, deque()).append(request)

    @property
    def running(self) -> int:
        return len(self._prefilling) + len(self._decoding)

    @property
    def waiting(self) -> int:
        return self._waiting_count

    @property
    def in_flight(self) -> int:
        return self.running + self._waiting_count

    # --- one engine step ---------------------------------------------------------------------

    def begin_step(self, now: float) -> float | None:
        """Schedule one step; returns its duration in seconds, or None when there is nothing to do."""
        del now  # the model is time-invariant; the argument keeps the call sites honest
        load_s = self._admit_waiting()
        if self.running == 0:
            self.busy = False
            return None
        budget = self.config.max_num_batched_tokens - len(self._decoding)
        prefill_tokens = 0
        self._finishing_prefill = []
        for request in self._prefilling:
            if budget <= 0:
                break
            chunk = min(budget, request.prefill_remaining)
            request.prefill_remaining -= chunk
            budget -= chunk
            prefill_tokens += chunk
            if request.prefill_remaining == 0:
                self._finishing_prefill.append(request)
        # Entries are deleted when their count reaches 0, so the keys are the batch's adapters.
        distinct = len(self._running_by_adapter) - ("" in self._running_by_adapter)
        self._max_distinct = max(self._max_distinct, distinct)
        self._max_running = max(self._max_running, self.running)
        p = self.profile
        step_s = (
            p.step_base_s + p.decode_s_per_seq * len(self._decoding) + p.prefill_s_per_token * prefill_tokens
        ) * (1.0 + p.lora_step_overhead_per_adapter * distinct)
        self.busy = True
        return step_s + load_s

    def end_step(self, end_s: float) -> list[SimRequest]:
        """The step began by `begin_step` is over at `end_s`; returns the requests that finished."""
        self._step += 1
        finished: list[SimRequest] = []
        if self._finishing_prefill:
            done = set(id(r) for r in self._finishing_prefill)
            self._prefilling = [r for r in self._prefilling if id(r) not in done]
            for request in self._finishing_prefill:
                request.first_token_s = end_s
                self._cache_prefix(request)
                if request.output_tokens <= 1:
                    finished.append(request)
                else:
                    heapq.heappush(
                        self._decoding, (self._step + request.output_tokens - 1, request.index, request)
                    )
            self._finishing_prefill = []
        while self._decoding and self._decoding[0][0] <= self._step:
            finished.append(heapq.heappop(self._decoding)[2])
        for request in finished:
            request.finish_s = end_s
            self.kv_used_tokens -= request.kv_tokens
            self._running_by_adapter[request.adapter] -= 1
            if self._running_by_adapter[request.adapter] == 0:
                del self._running_by_adapter[request.adapter]
        self.busy = False
        return finished

    # --- what /metrics says --------------------------------------------------------------------

    def metrics(self, now: float) -> Metrics:
        """What a scrape of vLLM's /metrics would report now.

        vLLM 0.32.0's quirks kept on purpose (see the captures in tests/fixtures/vllm-0.32.0):
        `running_adapters` and `waiting_adapters` are both the adapters with a scheduled request;
        adapters resident in a slot but idle are invisible; requests waiting for a slot show only
        in `deferred_requests`.
        """
        scheduled = frozenset(a for a in self._running_by_adapter if a)
        capacity_blocks = self.profile.kv_capacity_tokens // self.profile.block_size_tokens
        return Metrics(
            updated_at=now,
            waiting_requests=self._waiting_count,
            running_requests=self.running,
            deferred_requests=self.deferred,
            kv_cache_usage=min(1.0, self.kv_used_tokens / self.profile.kv_capacity_tokens),
            lora_enabled=True,
            max_lora=self.config.max_loras,
            running_adapters=scheduled,
            waiting_adapters=scheduled,
            block_size=self.profile.block_size_tokens,
            num_gpu_blocks=capacity_blocks,
            served_model_name=self.config.served_model_name,
        )

    def counters(self) -> PodCounters:
        return PodCounters(
            swaps=self._swaps,
            loads_from_cpu=self._loads_cpu,
            loads_from_disk=self._loads_disk,
            steps=self._step,
            max_distinct_adapters_in_batch=self._max_distinct,
            max_running=self._max_running,
        )

    # --- internals -----------------------------------------------------------------------------

    def _admit_waiting(self) -> float:
        """Move waiting requests into the batch in vLLM V1's order; returns adapter load seconds.

        Equivalent to vLLM's pass over the FIFO waiting queue that skips requests whose adapter
        would exceed `max_loras`, without rescanning skipped requests: while the batch's adapter
        set is full only the queues of adapters already in the batch (and the base model's) are
        eligible, so the next request admitted is the oldest eligible one.
        """
        load_s = 0.0
        scheduled = {a for a in self._running_by_adapter if a}
        cfg = self.config
        while self._waiting_count and self.running < cfg.max_num_seqs:
            if len(scheduled) >= cfg.max_loras:
                request = self._oldest_eligible(scheduled)
            else:
                request = self._oldest_waiting()
            if request is None:
                break
            if self.kv_used_tokens + request.kv_tokens > self.profile.kv_capacity_tokens:
                break  # no KV for the next request in order: admission stops here
            self._dequeue(request)
            adapter = request.adapter
            if adapter:
                load_s += self._activate(adapter, scheduled, request)
                scheduled.add(adapter)
            key = (adapter, request.prefix_key)
            if request.prefix_key and key in self._prefix_cache:
                self._prefix_cache.move_to_end(key)
                request.cached_tokens = request.prefix_tokens
            request.prefill_remaining = max(1, request.prompt_tokens - request.cached_tokens)
            self.kv_used_tokens += request.kv_tokens
            self._running_by_adapter[adapter] += 1
            self._prefilling.append(request)
        # vLLM counts the requests its pass skipped for the LoRA limit as "deferred".
        if len(scheduled) >= cfg.max_loras:
            eligible = sum(
                self._queued_by_adapter.get(a, 0) for a in scheduled
            ) + self._queued_by_adapter.get("", 0)
            self.deferred = self._waiting_count - eligible
        else:
            self.deferred = 0
        self._trim_prefix_cache()
        return load_s

    def _oldest_waiting(self) -> SimRequest | None:
        while self._waiting_heap and not self._waiting_heap[0][1].queued:
            heapq.heappop(self._waiting_heap)
        return self._waiting_heap[0][1] if self._waiting_heap else None

    def _oldest_eligible(self, scheduled: set[str]) -> SimRequest | None:
        best: SimRequest | None = None
        for adapter in (*scheduled, ""):
            queue = self._queues.get(adapter)
            if not queue:
                continue
            while queue and not queue[0].queued:
                queue.popleft()
            if queue and (best is None or queue[0].index < best.index):
                best = queue[0]
        return best

    def _dequeue(self, request: SimRequest) -> None:
        request.queued = False
        self._waiting_count -= 1
        self._queued_by_adapter[request.adapter] -= 1

    def _activate(self, adapter: str, in_batch: set[str], request: SimRequest) -> float:
        """Make `adapter` resident in a GPU slot; returns the load time (0 when already there)."""
        if adapter in self.gpu_slots:
            self.gpu_slots.move_to_end(adapter)
            return 0.0
        if len(self.gpu_slots) >= self.config.max_loras:
            victim = next(a for a in self.gpu_slots if a not in in_batch)
            del self.gpu_slots[victim]
            self._swaps += 1
            request.caused_swap = True
        self.gpu_slots[adapter] = None
        if self.profile.adapter_load_s is not None:
            self._loads_cpu += 1
            return self.profile.adapter_load_s
        load_s = CPU_TO_GPU_FIXED_S + self.profile.adapter_bytes / CPU_TO_GPU_BYTES_PER_S
        if adapter in self.cpu_tier:
            self.cpu_tier.move_to_end(adapter)
            self._loads_cpu += 1
        else:
            load_s += DISK_FIXED_S + self.profile.adapter_bytes * DISK_S_PER_BYTE
            self.cpu_tier[adapter] = None
            if len(self.cpu_tier) > self.config.max_cpu_loras:
                self.cpu_tier.popitem(last=False)
            self._loads_disk += 1
        return load_s

    def _cache_prefix(self, request: SimRequest) -> None:
        if not request.prefix_key or request.prefix_tokens <= 0:
            return
        key = (request.adapter, request.prefix_key)
        if key in self._prefix_cache:
            self._prefix_cache.move_to_end(key)
            return
        self._prefix_cache[key] = request.prefix_tokens
        self._prefix_cached_tokens += request.prefix_tokens
        self._trim_prefix_cache()

    def _trim_prefix_cache(self) -> None:
        free = self.profile.kv_capacity_tokens - self.kv_used_tokens
        while self._prefix_cache and self._prefix_cached_tokens > free:
            _, tokens = self._prefix_cache.popitem(last=False)
            self._prefix_cached_tokens -= tokens
