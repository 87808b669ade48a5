"""A vLLM pod, stepped by its caller: continuous batching, LoRA slots, KV and prefix cache.

Pure: no I/O and no clock. The caller calls `begin_step(now)` to schedule one engine step (it
returns the step's duration in seconds, or None when there is nothing to run) and
`end_step(end_s)` when that step is over (it returns the requests that finished). `metrics(now)`
reports what vLLM's `/metrics` would say at that moment, quirks included.

The scheduler follows vLLM V1's where a router can see the difference:

- Running requests first get their share of the step's token budget (`max_num_batched_tokens`:
  one token per decoding sequence, then prefill chunks in admission order); then waiting requests
  join the batch in FIFO order while there is room (`max_num_seqs`, KV).
- A waiting request whose adapter is not in the batch while the batch already holds `max_loras`
  distinct adapters is skipped ("deferred") and later requests may pass it, as vLLM does; this is
  what makes a fifth adapter on a four-slot pod wait for a slot.
- GPU slots are an LRU of `max_loras` over a host tier of `max_cpu_loras` (`epp.tools.vllm_pod.lora`);
  an adapter not in a slot is loaded into a free slot or over the least recently used adapter with
  no request in the batch (a swap). The cost model prices the load; it is added to that step.
- KV: a request reserves prompt + output tokens when it joins the batch and keeps them until it
  finishes (no preemption); a request that does not fit stops admission, as vLLM's allocator does.
- Prefix cache: per adapter (`epp.tools.vllm_pod.prefix`); a finished prefill leaves its prompt's
  segments cached in free KV, least recently used evicted first when KV runs short.

`epp sim` and `epp bench` run exactly these rules, host tier and KV count included, so the
bench's figures follow vLLM rather than a simplification of it.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

from epp.picker.datastore.types import Metrics
from epp.tools.vllm_pod.cost import CostModel
from epp.tools.vllm_pod.lora import Activation, AdapterTier, LoraSlots
from epp.tools.vllm_pod.prefix import PrefixCache
from epp.tools.vllm_pod.request import SimRequest


@dataclass(frozen=True, slots=True)
class PodConfig:
    """vLLM server flags that matter here (names as vLLM's CLI spells them)."""

    max_loras: int = 4  # --max-loras: GPU slots = distinct adapters one batch may hold
    max_cpu_loras: int = 8  # --max-cpu-loras: host-RAM tier (vLLM defaults it to max_loras)
    max_num_seqs: int = 256  # --max-num-seqs (vLLM V1 default on GPUs)
    max_num_batched_tokens: int = 8192  # --max-num-batched-tokens: token budget per step (chunked prefill)
    # --lora-modules: adapters registered at start, each read into host memory and given a GPU
    # slot in turn (so the last max_loras hold the slots).
    lora_modules: tuple[str, ...] = ()
    served_model_name: str = "base"


@dataclass(frozen=True, slots=True)
class PodCounters:
    swaps: int
    loads_from_cpu: int
    loads_from_disk: int
    steps: int
    max_distinct_adapters_in_batch: int
    max_running: int
    max_waiting: int


class VllmPod:
    """One vLLM replica; see the module docstring."""

    def __init__(
        self,
        name: str,
        config: PodConfig,
        cost: CostModel,
        *,
        kv_capacity_tokens: int,
        block_size: int = 16,
    ) -> None:
        if config.max_loras < 1 or config.max_num_seqs < 1:
            raise ValueError("max_loras and max_num_seqs must be at least 1")
        if kv_capacity_tokens < 1 or block_size < 1:
            raise ValueError("kv_capacity_tokens and block_size must be at least 1")
        self.name = name
        self.config = config
        self.cost = cost
        self.kv_capacity_tokens = kv_capacity_tokens
        self.block_size = block_size
        self.lora = LoraSlots(config.max_loras, config.max_cpu_loras)
        for adapter in config.lora_modules:
            self.lora.register(adapter, ())
        self.prefix_cache = PrefixCache()
        # Waiting requests, held twice so admission never rescans skipped ones: in the order they
        # reached this pod (a heap on their arrival number here, entries dropped lazily once
        # admitted; a router that queues requests may send them out of their clients' order) and per adapter
        # (exact: an adapter with nothing waiting has no queue).
        self._waiting_heap: list[tuple[int, SimRequest]] = []
        self._arrivals = itertools.count()
        self._queues: dict[str, deque[SimRequest]] = {}
        self._waiting_count = 0
        self._prefilling: list[SimRequest] = []
        self._decoding: list[tuple[int, int, SimRequest]] = []  # (finish step, index, request)
        self._running_by_adapter: Counter[str] = Counter()
        self._running_order: dict[int, SimRequest] = {}  # by index, in admission order
        self.kv_reserved_tokens = 0
        self.deferred = 0
        self.busy = False  # a step is in progress
        self._step = 0
        self._finishing_prefill: list[SimRequest] = []
        # What the last step did, for callers that report per step (epp sim's /metrics, streams).
        self.last_admitted: list[SimRequest] = []
        self.last_loads: list[Activation] = []
        self.last_prefill_tokens = 0
        self.last_first_tokens: Sequence[SimRequest] = ()
        self._swaps = 0
        self._loads_cpu = 0
        self._loads_disk = 0
        self._max_distinct = 0
        self._max_running = 0
        self._max_waiting = 0

    # --- requests in and out -----------------------------------------------------------------

    def enqueue(self, request: SimRequest) -> None:
        """A request routed here joins the waiting queue; ValueError if it could never fit in KV."""
        if request.kv_tokens > self.kv_capacity_tokens:
            raise ValueError("prompt plus max_tokens exceeds the KV cache")
        adapter = request.adapter
        request.pod = self.name
        request.adapter_hit = adapter == "" or self.lora.on_gpu(adapter)
        running = self._running_by_adapter
        request.slot_blocked = (
            adapter != ""
            and adapter not in running
            and len(running) - ("" in running) >= self.config.max_loras
        )
        request.queued = True
        self._waiting_count += 1
        if self._waiting_count > self._max_waiting:
            self._max_waiting = self._waiting_count
        request.queue_seq = next(self._arrivals)
        heapq.heappush(self._waiting_heap, (request.queue_seq, request))
        queue = self._queues.get(adapter)
        if queue is None:
            self._queues[adapter] = queue = deque()
        queue.append(request)

    def abort(self, request: SimRequest, now: float) -> bool:
        """Drop a request (its client went away); False if it is not waiting or running here."""
        if request.pod != self.name or request.finish_s is not None:
            return False
        if request.queued:
            self._dequeue(request)
        elif request.admitted_s is not None:
            if request.first_token_s is None:
                self._prefilling.remove(request)
                if request in self._finishing_prefill:
                    self._finishing_prefill.remove(request)
            else:
                self._decoding = [entry for entry in self._decoding if entry[2] is not request]
                heapq.heapify(self._decoding)
            self._release(request)
        else:
            return False
        request.finish_s = now
        return True

    @property
    def running(self) -> int:
        return len(self._prefilling) + len(self._decoding)

    @property
    def waiting(self) -> int:
        return self._waiting_count

    @property
    def in_flight(self) -> int:
        return self.running + self._waiting_count

    def has_work(self) -> bool:
        return bool(self._waiting_count or self._prefilling or self._decoding)

    def decoding(self) -> list[SimRequest]:
        """Requests past their first token: each gets one more token at the end of the current step."""
        return [entry[2] for entry in self._decoding]

    # --- one engine step ---------------------------------------------------------------------

    def begin_step(self, now: float) -> float | None:
        """Schedule one step; returns its duration in seconds, or None when there is nothing to do."""
        load_s = self._admit_waiting(now) if self._waiting_count else self._nothing_to_admit()
        prefilling, decoding = self._prefilling, self._decoding
        running = len(prefilling) + len(decoding)
        if running == 0:
            self.busy = False
            return None
        budget = self.config.max_num_batched_tokens - len(decoding)
        prefill_tokens = 0
        self._finishing_prefill = []
        for request in prefilling:
            if budget <= 0:
                break
            chunk = min(budget, request.prefill_remaining)
            request.prefill_remaining -= chunk
            budget -= chunk
            prefill_tokens += chunk
            if request.prefill_remaining == 0:
                self._finishing_prefill.append(request)
        # Entries are deleted when their count reaches 0, so the keys are the batch's adapters.
        by_adapter = self._running_by_adapter
        distinct = len(by_adapter) - ("" in by_adapter)
        if distinct > self._max_distinct:
            self._max_distinct = distinct
        if running > self._max_running:
            self._max_running = running
        self.last_prefill_tokens = prefill_tokens
        step_s = self.cost.step_s(len(decoding), running, prefill_tokens, distinct)
        self.busy = True
        return step_s + load_s

    def end_step(self, end_s: float) -> list[SimRequest]:
        """The step began by `begin_step` is over at `end_s`; returns the requests that finished.

        Every request in `decoding()` before this call produced one token, and so did each request
        in `last_first_tokens` after it (its first).
        """
        self._step += 1
        finished: list[SimRequest] = []
        if self._finishing_prefill:
            done = set(id(r) for r in self._finishing_prefill)
            self._prefilling = [r for r in self._prefilling if id(r) not in done]
            for request in self._finishing_prefill:
                request.first_token_s = end_s
                request.first_token_step = self._step
                self._cache_prefix(request)
                if request.output_tokens <= 1:
                    finished.append(request)
                else:
                    heapq.heappush(
                        self._decoding, (self._step + request.output_tokens - 1, request.index, request)
                    )
            self.last_first_tokens = self._finishing_prefill
            self._finishing_prefill = []
        else:
            self.last_first_tokens = ()
        while self._decoding and self._decoding[0][0] <= self._step:
            finished.append(heapq.heappop(self._decoding)[2])
        for request in finished:
            request.finish_s = end_s
            self._release(request)
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
        return Metrics(
            updated_at=now,
            waiting_requests=self._waiting_count,
            running_requests=self.running,
            deferred_requests=min(self.deferred, self._waiting_count),
            kv_cache_usage=self.kv_cache_usage(),
            lora_enabled=True,
            max_lora=self.config.max_loras,
            running_adapters=scheduled,
            waiting_adapters=scheduled,
            block_size=self.block_size,
            num_gpu_blocks=self.kv_capacity_tokens // self.block_size,
            served_model_name=self.config.served_model_name,
        )

    def kv_cache_usage(self) -> float:
        """vLLM's `kv_cache_usage_perc` (0..1): blocks holding running requests' computed tokens.

        Not the tokens a request reserved on admission (prompt + every output token), which is how
        admission is modelled: vLLM allocates blocks as tokens are computed, so a scraper sees the
        fraction grow over a request's life. `epp bench` reported the reservation until its host
        tier was aligned with vLLM's; on zipf-100 and brief the two counts moved the default
        policy's swaps by < 1 % and its P99 TTFT by < 4 %, so the bench reports vLLM's.
        """
        size = self.block_size
        blocks = 0
        for request in self._running_order.values():
            held = request.prompt_tokens - request.prefill_remaining
            if request.first_token_s is not None:
                held += self._step - request.first_token_step + 1
            blocks += -(-held // size)
        return min(1.0, blocks / max(1, self.kv_capacity_tokens // size))

    def adapters_in_batch(self) -> tuple[str, ...]:
        """Adapters with a running request, in the order their oldest running request joined."""
        return tuple(dict.fromkeys(r.adapter for r in self._running_order.values() if r.adapter))

    def counters(self) -> PodCounters:
        return PodCounters(
            swaps=self._swaps,
            loads_from_cpu=self._loads_cpu,
            loads_from_disk=self._loads_disk,
            steps=self._step,
            max_distinct_adapters_in_batch=self._max_distinct,
            max_running=self._max_running,
            max_waiting=self._max_waiting,
        )

    # --- internals -----------------------------------------------------------------------------

    def _admit_waiting(self, now: float) -> float:
        """Move waiting requests into the batch in vLLM V1's order; returns adapter load seconds.

        Equivalent to vLLM's pass over the FIFO waiting queue that skips requests whose adapter
        would exceed `max_loras`, without rescanning skipped requests: while the batch's adapter
        set is full only the queues of adapters already in the batch (and the base model's) are
        eligible, so the next request admitted is the oldest eligible one.
        """
        load_s = 0.0
        by_adapter = self._running_by_adapter
        scheduled = {a for a in by_adapter if a}
        cfg = self.config
        max_loras = cfg.max_loras
        if self.last_admitted:
            self.last_admitted = []
        if self.last_loads:
            self.last_loads = []
        prefilling = self._prefilling
        running = len(prefilling) + len(self._decoding)
        capacity = self.kv_capacity_tokens
        # Where vLLM's pass over the queue would have stopped reading it: deferred counts before it.
        reached = -1
        while self._waiting_count and running < cfg.max_num_seqs:
            if len(scheduled) >= max_loras:
                request = self._oldest_eligible(scheduled)
            else:
                request = self._oldest_waiting()
            if request is None:
                reached = -2  # every waiting request was reached
                break
            reached = request.queue_seq
            if self.kv_reserved_tokens + request.kv_tokens > capacity:
                break  # no KV for the next request in order: admission stops here
            self._dequeue(request)
            adapter = request.adapter
            if adapter:
                activation = self.lora.activate(adapter, scheduled)
                if activation.source is not AdapterTier.GPU:
                    load_s += self.cost.load_s(activation.source)
                    self._count_load(request, activation)
                scheduled.add(adapter)
            if request.prefix_reusable:
                request.cached_tokens = self.prefix_cache.lookup(
                    adapter, request.prefix_segments, request.prefix_reusable
                )
            request.prefill_remaining = max(1, request.prompt_tokens - request.cached_tokens)
            request.admitted_s = now
            self.kv_reserved_tokens += request.kv_tokens
            by_adapter[adapter] += 1
            prefilling.append(request)
            running += 1
            self._running_order[request.index] = request
            self.last_admitted.append(request)
        self.deferred = 0 if len(scheduled) < max_loras else self._skipped_before(reached, scheduled)
        self.prefix_cache.trim(capacity - self.kv_reserved_tokens)
        return load_s

    def _nothing_to_admit(self) -> float:
        """`_admit_waiting` with an empty queue: nothing deferred, and no KV newly reserved, so the
        prefix cache still fits in free KV."""
        if self.last_admitted:
            self.last_admitted = []
        if self.last_loads:
            self.last_loads = []
        self.deferred = 0
        return 0.0

    def _skipped_before(self, reached: int, scheduled: set[str]) -> int:
        """Waiting requests vLLM's pass reached and skipped for the LoRA limit: vLLM's "deferred".

        Those are the waiting requests older than where the pass stopped (a request that did not
        fit in KV, or the last one admitted when the batch reached `max_num_seqs`; -2: it read the
        whole queue, -1: it read nothing). Requests behind that point were never looked at, so a
        batch full of sequences shows its queue as waiting for capacity, not deferred. Every
        waiting request older than that point is one the pass skipped, since the pass admits the
        oldest eligible request first.
        """
        if reached == -1 or not self._waiting_count:
            return 0
        if reached == -2:
            return self._waiting_count
        count = 0
        for adapter, queue in self._queues.items():
            if adapter and adapter not in scheduled and queue[0].queue_seq < reached:
                count += bisect.bisect_left(queue, reached, key=_queue_seq)
        return count

    def _count_load(self, request: SimRequest, activation: Activation) -> None:
        request.adapter_loaded = True
        self.last_loads.append(activation)
        if activation.source is AdapterTier.CPU:
            self._loads_cpu += 1
        else:
            self._loads_disk += 1
        if activation.evicted_from_gpu is not None:
            self._swaps += 1
            request.caused_swap = True

    def _oldest_waiting(self) -> SimRequest | None:
        while self._waiting_heap and not self._waiting_heap[0][1].queued:
            heapq.heappop(self._waiting_heap)
        return self._waiting_heap[0][1] if self._waiting_heap else None

    def _oldest_eligible(self, scheduled: set[str]) -> SimRequest | None:
        best: SimRequest | None = None
        queues = self._queues
        for adapter in (*scheduled, ""):
            queue = queues.get(adapter)
            if queue is not None and (best is None or queue[0].queue_seq < best.queue_seq):
                best = queue[0]
        return best

    def _dequeue(self, request: SimRequest) -> None:
        request.queued = False
        self._waiting_count -= 1
        queue = self._queues[request.adapter]
        if queue[0] is request:
            queue.popleft()  # admission always takes the oldest of its adapter
        else:
            queue.remove(request)  # an abort
        if not queue:
            del self._queues[request.adapter]

    def _release(self, request: SimRequest) -> None:
        """A running request left the batch: its KV and its pin on the adapter's slot go."""
        self.kv_reserved_tokens -= request.kv_tokens
        adapter = request.adapter
        self._running_by_adapter[adapter] -= 1
        if self._running_by_adapter[adapter] == 0:
            del self._running_by_adapter[adapter]
        del self._running_order[request.index]

    def _cache_prefix(self, request: SimRequest) -> None:
        if request.prefix_segments:
            self.prefix_cache.insert(request.adapter, request.prefix_segments)
            self.prefix_cache.trim(self.kv_capacity_tokens - self.kv_reserved_tokens)


def _queue_seq(request: SimRequest) -> int:
    return request.queue_seq
