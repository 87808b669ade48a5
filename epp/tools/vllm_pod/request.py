"""One request as the pod model sees it: its workload, and what happened to it as it ran."""

from __future__ import annotations

from collections.abc import Sequence

from epp.tools.vllm_pod.prefix import Segment, shared_prefix_segments


class SimRequest:
    """A request's workload and outcome (mutable: the pod fills the outcome in).

    `index` orders requests (vLLM's FIFO is arrival order): callers give each request on a pod a
    distinct, increasing index. The adapter "" is the base model, which needs no slot. The prompt
    is described to the prefix cache either by a named shared prefix (`prefix_key`,
    `prefix_tokens`: a synthetic workload) or by explicit `prefix_segments` (a real prompt's
    blocks, see `epp.tools.vllm_pod.prefix.token_segments`).
    """

    __slots__ = (
        "adapter",
        "adapter_hit",
        "adapter_loaded",
        "admitted_s",
        "arrival_s",
        "cached_tokens",
        "caused_swap",
        "dispatched_s",
        "finish_s",
        "first_token_s",
        "first_token_step",
        "index",
        "objective",
        "output_tokens",
        "pod",
        "prefill_remaining",
        "prefix_key",
        "prefix_reusable",
        "prefix_segments",
        "prefix_tokens",
        "prompt_tokens",
        "queue_seq",
        "queued",
        "refused_s",
        "refused_status",
        "rejected",
        "slot_blocked",
        "tenant",
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
        *,
        prefix_segments: Sequence[Segment] | None = None,
        prefix_reusable: int | None = None,
        tenant: str = "",
        objective: str = "",
    ) -> None:
        self.index = index
        self.arrival_s = arrival_s
        self.adapter = adapter
        self.prompt_tokens = max(1, prompt_tokens)
        self.output_tokens = max(1, output_tokens)
        self.prefix_key = prefix_key  # shared prompt prefix (e.g. the adapter's system prompt)
        self.prefix_tokens = min(prefix_tokens, self.prompt_tokens)
        if prefix_segments is None:
            prefix_segments = shared_prefix_segments(prefix_key, self.prefix_tokens)
        self.prefix_segments = tuple(prefix_segments)
        self.prefix_reusable = len(self.prefix_segments) if prefix_reusable is None else prefix_reusable
        self.tenant = tenant  # the client's fairness ID ("": none sent)
        self.objective = objective  # the InferenceObjective it names ("": none)
        self.pod = ""
        self.dispatched_s: float | None = None  # when the router sent it to its pod (after any queueing)
        self.refused_status: int | None = None  # the router's error status when it was refused
        self.refused_s: float | None = None  # when the router refused it
        self.queue_seq = 0  # its place in its pod's arrival order (vLLM's FIFO)
        self.adapter_hit = False  # adapter resident in a GPU slot of its pod when it arrived
        self.adapter_loaded = False  # its admission loaded its adapter into a GPU slot
        self.caused_swap = False  # that load evicted another adapter from a GPU slot
        self.cached_tokens = 0
        self.prefill_remaining = 0
        self.admitted_s: float | None = None  # joined the running batch
        self.first_token_s: float | None = None
        self.first_token_step = 0  # the pod's step count when its first token came out
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
        """KV the request reserves on admission: its prompt and every token it may generate."""
        return self.prompt_tokens + self.output_tokens
