"""The simulator's engine: the shared vLLM pod model, seen token by token.

Scheduling, LoRA slots, KV and the prefix cache are `epp.tools.vllm_pod`, the same model
`epp bench` runs, and so is its cost (`EngineConfig.cost`, a `LatencyCost` set from `epp sim`'s
flags). This module adds what an HTTP server needs on top: request ids, one `TokenEvent` per
generated token for the streams, aborts, and a `FinishedRequest` record for vLLM's per-request
histograms.

The engine never reads a clock or sleeps. A driver alternates `plan_step(now)` (schedule the next
engine step and say how long it takes) and `finish_step(now)` (emit that step's tokens); the live
server drives it with real time, tests with simulated time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from epp.tools.vllm_pod.cost import LatencyCost
from epp.tools.vllm_pod.lora import Activation, LoraSlots
from epp.tools.vllm_pod.pod import PodConfig, VllmPod
from epp.tools.vllm_pod.prefix import token_segments
from epp.tools.vllm_pod.request import SimRequest

FINISH_LENGTH = "length"
FINISH_ABORT = "abort"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Capacity and timing of one simulated model server, as `epp sim`'s flags set them."""

    max_num_seqs: int = 8
    max_loras: int = 1
    max_cpu_loras: int = 1
    max_num_batched_tokens: int = 8192
    # Step and adapter-load times: the shared pod model's cost, which `epp bench` also runs.
    cost: LatencyCost = field(default_factory=LatencyCost)
    kv_cache_tokens: int = 65536
    block_size: int = 16

    @property
    def num_blocks(self) -> int:
        return max(1, self.kv_cache_tokens // self.block_size)

    def pod_config(self) -> PodConfig:
        return PodConfig(
            max_loras=self.max_loras,
            max_cpu_loras=self.max_cpu_loras,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
        )


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


@dataclass(slots=True)
class _Tracked:
    """A request's id and the per-token history the streams and histograms need."""

    request_id: str
    request: SimRequest
    max_tokens: int
    generated: int = 0
    last_token_s: float | None = None
    inter_token_s: list[float] = field(default_factory=list)


class Engine:
    """One model server: the shared pod model plus per-token bookkeeping; see the module docstring."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.pod = VllmPod(
            "sim",
            config.pod_config(),
            config.cost,
            kv_capacity_tokens=config.num_blocks * config.block_size,
            block_size=config.block_size,
        )
        self._by_id: dict[str, _Tracked] = {}
        self._by_index: dict[int, _Tracked] = {}
        self._next_index = 0
        self._plan: StepPlan | None = None
        self._stepping = False  # the planned step runs in the pod (it had work)
        self._step_decoding: list[SimRequest] = []
        self._step_prefill_tokens = 0

    @property
    def lora(self) -> LoraSlots:
        return self.pod.lora

    # ---- requests -------------------------------------------------------------------------
    def submit(
        self, request_id: str, adapter: str | None, prompt: Sequence[str], max_tokens: int, now: float
    ) -> None:
        """Queue a request. Raises ValueError if it could never fit (empty prompt, KV too small)."""
        if not prompt:
            raise ValueError("prompt must have at least one token")
        if max_tokens < 1:
            raise ValueError("max_tokens must be ≥ 1")
        if request_id in self._by_id:
            raise ValueError(f"duplicate request id {request_id!r}")
        segments, reusable = token_segments(prompt, self.config.block_size)
        request = SimRequest(
            index=self._next_index,
            arrival_s=now,
            adapter=adapter or "",
            prompt_tokens=len(prompt),
            output_tokens=max_tokens,
            prefix_segments=segments,
            prefix_reusable=reusable,
        )
        self.pod.enqueue(request)  # raises when prompt + max_tokens exceeds the KV cache
        self._next_index += 1
        tracked = _Tracked(request_id, request, max_tokens)
        self._by_id[request_id] = tracked
        self._by_index[request.index] = tracked

    def abort(self, request_id: str, now: float) -> FinishedRequest | None:
        """Drop a request (client went away); None if it is unknown or already finished."""
        tracked = self._by_id.get(request_id)
        if tracked is None or not self.pod.abort(tracked.request, now):
            return None
        self._forget(tracked)
        return self._finished(tracked, FINISH_ABORT, now)

    def has_work(self) -> bool:
        return self.pod.has_work()

    @property
    def stats(self) -> EngineStats:
        pod = self.pod
        deferred = min(pod.deferred, pod.waiting)
        return EngineStats(
            running=pod.running,
            waiting_capacity=pod.waiting - deferred,
            waiting_deferred=deferred,
            kv_cache_usage=pod.kv_cache_usage(),
            lora_in_flight=pod.adapters_in_batch(),
        )

    # ---- steps ----------------------------------------------------------------------------
    def plan_step(self, now: float) -> StepPlan:
        """Admit what fits and return the step's duration. Call `finish_step` before planning again."""
        if self._plan is not None:
            raise RuntimeError("plan_step called twice without finish_step")
        duration = self.pod.begin_step(now)
        self._stepping = duration is not None
        self._step_decoding = self.pod.decoding() if self._stepping else []
        self._step_prefill_tokens = self.pod.last_prefill_tokens if self._stepping else 0
        admitted = self.pod.last_admitted
        queries = sum(r.prompt_tokens for r in admitted)
        hits = sum(r.cached_tokens for r in admitted)
        self._plan = StepPlan(
            duration_s=duration or 0.0,
            admitted=tuple(self._by_index[r.index].request_id for r in admitted),
            activations=tuple(self.pod.last_loads),
            prefix_queries_tokens=queries,
            prefix_hits_tokens=hits,
            prefill_tokens=queries - hits,
        )
        return self._plan

    def finish_step(self, now: float) -> StepOutcome:
        """Emit one token for every request the step advanced past its prefill; retire finished ones."""
        if self._plan is None:
            raise RuntimeError("finish_step called without plan_step")
        self._plan = None
        if not self._stepping:
            return StepOutcome((), (), 0)
        self._stepping = False
        done = self.pod.end_step(now)
        tokens: list[TokenEvent] = []
        for request in (*self.pod.last_first_tokens, *self._step_decoding):
            tracked = self._by_index.get(request.index)
            if tracked is None:  # aborted while the step ran
                continue
            if tracked.last_token_s is not None:
                tracked.inter_token_s.append(now - tracked.last_token_s)
            tracked.last_token_s = now
            tracked.generated += 1
            last = request.finish_s is not None
            tokens.append(
                TokenEvent(tracked.request_id, tracked.generated - 1, FINISH_LENGTH if last else None)
            )
        finished: list[FinishedRequest] = []
        for request in done:
            tracked = self._by_index[request.index]
            self._forget(tracked)
            finished.append(self._finished(tracked, FINISH_LENGTH, now))
        self._step_decoding = []
        return StepOutcome(tuple(tokens), tuple(finished), self._step_prefill_tokens + len(tokens))

    # ---- helpers --------------------------------------------------------------------------
    def pinned_adapters(self) -> set[str]:
        """Adapters used by running requests: their GPU slots cannot be taken."""
        return set(self.pod.adapters_in_batch())

    def _forget(self, tracked: _Tracked) -> None:
        del self._by_id[tracked.request_id]
        del self._by_index[tracked.request.index]

    @staticmethod
    def _finished(tracked: _Tracked, reason: str, now: float) -> FinishedRequest:
        request = tracked.request
        scheduled = request.admitted_s if request.admitted_s is not None else now
        first = request.first_token_s
        return FinishedRequest(
            request_id=tracked.request_id,
            adapter=request.adapter or None,
            prompt_tokens=request.prompt_tokens,
            generation_tokens=tracked.generated,
            max_tokens=tracked.max_tokens,
            cached_tokens=request.cached_tokens,
            finish_reason=reason,
            queue_time_s=scheduled - request.arrival_s,
            prefill_time_s=(first - scheduled) if first is not None else now - scheduled,
            decode_time_s=(now - first) if first is not None else 0.0,
            inference_time_s=now - scheduled,
            e2e_latency_s=now - request.arrival_s,
            time_to_first_token_s=(first - request.arrival_s) if first is not None else None,
            inter_token_latencies_s=tuple(tracked.inter_token_s),
        )
