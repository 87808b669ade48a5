"""The simulated engine: continuous batching, LoRA slots, KV blocks and token timing, as a pure model.

The engine never reads a clock or sleeps. A driver alternates `plan_step(now)` (schedule the next
engine step and say how long it takes) and `finish_step(now)` (emit that step's tokens); the live
server drives it with real time, a discrete-event model can drive it with simulated time.

Scheduling follows vLLM's: waiting requests in arrival order join the running batch while there is
room (`max_num_seqs`, free KV blocks); a request whose adapter has no GPU slot (every slot pinned by
running requests) is skipped and counts as waiting for reason "deferred", one without batch or KV
room as "capacity". Step time = adapter loads + prefill of newly admitted requests (a fixed
time-to-first-token plus a per-uncached-token cost) + one decode token for every running request,
whose latency grows with the batch size and with the number of distinct adapters in the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from epp.tools.sim.kvcache import PrefixCache
from epp.tools.sim.lora import Activation, AdapterTier, LoraCache

FINISH_LENGTH = "length"
FINISH_ABORT = "abort"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Capacity and timing of one simulated model server."""

    max_num_seqs: int = 8
    max_loras: int = 1
    max_cpu_loras: int = 1
    time_to_first_token_s: float = 0.020
    inter_token_latency_s: float = 0.005
    prefill_time_per_token_s: float = 0.0
    lora_load_latency_s: float = 0.050  # storage → GPU slot
    lora_cpu_load_latency_s: float = 0.002  # host memory → GPU slot
    itl_batch_factor: float = 0.05  # ITL × (1 + factor × (batch − 1))
    lora_step_slowdown: float = 0.10  # step × (1 + slowdown × (distinct adapters − 1))
    kv_cache_tokens: int = 65536
    block_size: int = 16

    @property
    def num_blocks(self) -> int:
        return max(1, self.kv_cache_tokens // self.block_size)


@dataclass(slots=True)
class _Sequence:
    """Mutable per-request engine state."""

    request_id: str
    adapter: str | None
    prompt: tuple[str, ...]
    max_tokens: int
    arrival_s: float
    scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    generated: int = 0
    cached_tokens: int = 0
    inter_token_s: list[float] = field(default_factory=list)

    def reserved_blocks(self, block_size: int) -> int:
        return math.ceil((len(self.prompt) + self.max_tokens) / block_size)

    def used_blocks(self, block_size: int) -> int:
        return math.ceil((len(self.prompt) + self.generated) / block_size)


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token; `finish_reason` is set on a request's last token."""

    request_id: str
    index: int
    finish_reason: str | None


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """Everything vLLM's per-request histograms and counters observe about a finished request."""

    request_id: str
    adapter: str | None
    prompt_tokens: int
    generation_tokens: int
    max_tokens: int
    cached_tokens: int
    finish_reason: str
    queue_time_s: float
    prefill_time_s: float
    decode_time_s: float
    inference_time_s: float
    e2e_latency_s: float
    time_to_first_token_s: float | None
    inter_token_latencies_s: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class StepPlan:
    """A scheduled engine step: how long it runs and what it admitted and loaded."""

    duration_s: float
    admitted: tuple[str, ...]
    activations: tuple[Activation, ...]
    prefix_queries_tokens: int
    prefix_hits_tokens: int
    prefill_tokens: int


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What a finished step produced."""

    tokens: tuple[TokenEvent, ...]
    finished: tuple[FinishedRequest, ...]
    iteration_tokens: int


@dataclass(frozen=True, slots=True)
class EngineStats:
    """The scheduler view that vLLM's gauges report."""

    running: int
    waiting_capacity: int
    waiting_deferred: int
    kv_cache_usage: float
    lora_in_flight: tuple[str, ...]  # adapters with a scheduled request, in first-scheduled order

    @property
    def waiting(self) -> int:
        return self.waiting_capacity + self.waiting_deferred


class Engine:
    """One model server's scheduler and timing model; see the module docstring."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.lora = LoraCache(config.max_loras, config.max_cpu_loras)
        self.prefix_cache = PrefixCache(config.block_size, config.num_blocks)
        self._waiting: list[_Sequence] = []
        self._running: dict[str, _Sequence] = {}
        self._plan: StepPlan | None = None
        self._stats = EngineStats(0, 0, 0, 0.0, ())

    # ---- requests -------------------------------------------------------------------------
    def submit(
        self, request_id: str, adapter: str | None, prompt: Sequence[str], max_tokens: int, now: float
    ) -> None:
        """Queue a request. Raises ValueError if it could never fit (empty prompt, KV too small)."""
        if not prompt:
            raise ValueError("prompt must have at least one token")
        if max_tokens < 1:
            raise ValueError("max_tokens must be ≥ 1")
        seq = _Sequence(request_id, adapter, tuple(prompt), max_tokens, now)
        if seq.reserved_blocks(self.config.block_size) > self.config.num_blocks:
            raise ValueError("prompt plus max_tokens exceeds the KV cache")
        if request_id in self._running or any(s.request_id == request_id for s in self._waiting):
            raise ValueError(f"duplicate request id {request_id!r}")
        self._waiting.append(seq)
        self._stats = self._compute_stats(deferred=self._stats.waiting_deferred)

    def abort(self, request_id: str, now: float) -> FinishedRequest | None:
        """Drop a request (client went away); None if it is unknown or already finished."""
        for index, seq in enumerate(self._waiting):
            if seq.request_id == request_id:
                del self._waiting[index]
                self._stats = self._compute_stats(deferred=self._stats.waiting_deferred)
                return self._finished(seq, FINISH_ABORT, now)
        seq_running = self._running.pop(request_id, None)
        if seq_running is None:
            return None
        self._stats = self._compute_stats(deferred=self._stats.waiting_deferred)
        return self._finished(seq_running, FINISH_ABORT, now)

    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    @property
    def stats(self) -> EngineStats:
        return self._stats

    # ---- steps ----------------------------------------------------------------------------
    def plan_step(self, now: float) -> StepPlan:
        """Admit what fits and return the step's duration. Call `finish_step` before planning again."""
        if self._plan is not None:
            raise RuntimeError("plan_step called twice without finish_step")
        cfg = self.config
        decoding = [s for s in self._running.values() if s.first_token_s is not None]
        free_blocks = cfg.num_blocks - sum(s.reserved_blocks(cfg.block_size) for s in self._running.values())
        admitted: list[_Sequence] = []
        activations: list[Activation] = []
        still_waiting: list[_Sequence] = []
        deferred = 0
        for seq in self._waiting:
            blocks = seq.reserved_blocks(cfg.block_size)
            if len(self._running) >= cfg.max_num_seqs or blocks > free_blocks:
                still_waiting.append(seq)
                continue
            if seq.adapter is not None:
                pinned = self._pinned_adapters()
                if not self.lora.can_activate(seq.adapter, pinned):
                    still_waiting.append(seq)
                    deferred += 1
                    continue
                activation = self.lora.activate(seq.adapter, pinned)
                if activation.source is not AdapterTier.GPU:
                    activations.append(activation)
            free_blocks -= blocks
            seq.scheduled_s = now
            self._running[seq.request_id] = seq
            admitted.append(seq)
        self._waiting = still_waiting

        queries = hits = prefill_tokens = 0
        for seq in admitted:
            seq.cached_tokens = self.prefix_cache.lookup(seq.adapter, seq.prompt)
            queries += len(seq.prompt)
            hits += seq.cached_tokens
            prefill_tokens += len(seq.prompt) - seq.cached_tokens

        load_s = sum(
            cfg.lora_cpu_load_latency_s if a.source is AdapterTier.CPU else cfg.lora_load_latency_s
            for a in activations
        )
        adapters_in_batch = {s.adapter for s in self._running.values() if s.adapter is not None}
        adapter_factor = 1.0 + cfg.lora_step_slowdown * max(0, len(adapters_in_batch) - 1)
        prefill_s = (
            (cfg.time_to_first_token_s + cfg.prefill_time_per_token_s * prefill_tokens) if admitted else 0.0
        )
        decode_s = 0.0
        if decoding:
            batch_factor = 1.0 + cfg.itl_batch_factor * (len(self._running) - 1)
            decode_s = cfg.inter_token_latency_s * batch_factor
        duration_s = load_s + (prefill_s + decode_s) * adapter_factor
        self._plan = StepPlan(
            duration_s=duration_s,
            admitted=tuple(s.request_id for s in admitted),
            activations=tuple(activations),
            prefix_queries_tokens=queries,
            prefix_hits_tokens=hits,
            prefill_tokens=prefill_tokens,
        )
        self._stats = self._compute_stats(deferred=deferred)
        return self._plan

    def finish_step(self, now: float) -> StepOutcome:
        """Emit one token for every running request and retire the finished ones."""
        plan = self._plan
        if plan is None:
            raise RuntimeError("finish_step called without plan_step")
        self._plan = None
        admitted = set(plan.admitted)
        tokens: list[TokenEvent] = []
        finished: list[FinishedRequest] = []
        iteration_tokens = 0
        for seq in list(self._running.values()):
            if seq.request_id in admitted:
                iteration_tokens += len(seq.prompt) - seq.cached_tokens
                self.prefix_cache.insert(seq.adapter, seq.prompt)
                seq.first_token_s = now
            elif seq.last_token_s is not None:
                seq.inter_token_s.append(now - seq.last_token_s)
            else:  # defensive: every running request not admitted this step has emitted a token
                continue
            iteration_tokens += 1
            seq.last_token_s = now
            seq.generated += 1
            done = seq.generated >= seq.max_tokens
            tokens.append(TokenEvent(seq.request_id, seq.generated - 1, FINISH_LENGTH if done else None))
            if done:
                del self._running[seq.request_id]
                finished.append(self._finished(seq, FINISH_LENGTH, now))
        self._stats = self._compute_stats(deferred=self._stats.waiting_deferred)
        return StepOutcome(tuple(tokens), tuple(finished), iteration_tokens)

    # ---- helpers --------------------------------------------------------------------------
    def pinned_adapters(self) -> set[str]:
        """Adapters used by running requests: their GPU slots cannot be taken."""
        return self._pinned_adapters()

    def _pinned_adapters(self) -> set[str]:
        return {s.adapter for s in self._running.values() if s.adapter is not None}

    def _compute_stats(self, *, deferred: int) -> EngineStats:
        cfg = self.config
        deferred = min(deferred, len(self._waiting))
        used = sum(s.used_blocks(cfg.block_size) for s in self._running.values())
        in_flight: dict[str, None] = {}
        for seq in self._running.values():
            if seq.adapter is not None:
                in_flight[seq.adapter] = None
        return EngineStats(
            running=len(self._running),
            waiting_capacity=len(self._waiting) - deferred,
            waiting_deferred=deferred,
            kv_cache_usage=min(1.0, used / cfg.num_blocks),
            lora_in_flight=tuple(in_flight),
        )

    @staticmethod
    def _finished(seq: _Sequence, reason: str, now: float) -> FinishedRequest:
        scheduled = seq.scheduled_s if seq.scheduled_s is not None else now
        first = seq.first_token_s
        return FinishedRequest(
            request_id=seq.request_id,
            adapter=seq.adapter,
            prompt_tokens=len(seq.prompt),
            generation_tokens=seq.generated,
            max_tokens=seq.max_tokens,
            cached_tokens=seq.cached_tokens,
            finish_reason=reason,
            queue_time_s=scheduled - seq.arrival_s,
            prefill_time_s=(first - scheduled) if first is not None else now - scheduled,
            decode_time_s=(now - first) if first is not None else 0.0,
            inference_time_s=now - scheduled,
            e2e_latency_s=now - seq.arrival_s,
            time_to_first_token_s=(first - seq.arrival_s) if first is not None else None,
            inter_token_latencies_s=tuple(seq.inter_token_s),
        )
