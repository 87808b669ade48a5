"""`prefix-cache-scorer` / `kv-cache-match-scorer`: share of the prompt's leading blocks an endpoint holds.

score = matched leading blocks / prompt blocks (0 when the prompt has no full block).
Adapter-aware: hashes are seeded with the target model. The primary pick's blocks are
recorded in `on_routed`. Per-endpoint LRU capacity is `lruCapacityPerServer` when set,
otherwise sized from the pod's `num_gpu_blocks` × `block_size` (tokens, ≈ 4 characters
each) when scraped, otherwise 31,250 blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.framework import ScheduleContext
from epp.picker.scheduling.prefix import PrefixIndex, prefix_hashes
from epp.picker.scheduling.types import LLMRequest

CHARS_PER_TOKEN = 4
_PENDING_MAX = 4096  # decisions whose hashes wait for on_routed; older ones are recomputed


@dataclass(slots=True)
class PrefixCacheScorer:
    name: str = "prefix-cache-scorer"
    block_size_chars: int = 64
    max_blocks: int = 256
    lru_capacity_per_server: int | None = None
    index: PrefixIndex = field(default_factory=PrefixIndex)
    _pending: OrderedDict[str, list[int]] = field(default_factory=OrderedDict)
    _sized: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.lru_capacity_per_server is not None:
            self.index.default_capacity_per_endpoint = self.lru_capacity_per_server

    def hashes(self, request: LLMRequest) -> list[int]:
        return prefix_hashes(
            request.target_model,
            request.prompt,
            block_size_chars=self.block_size_chars,
            max_blocks=self.max_blocks,
        )

    def score(self, ctx: ScheduleContext, endpoints: Sequence[EndpointState]) -> list[float]:
        request = ctx.request
        hashes = self.hashes(request)
        self._pending[request.request_id] = hashes
        self._pending.move_to_end(request.request_id)
        while len(self._pending) > _PENDING_MAX:
            self._pending.popitem(last=False)
        if not hashes:
            return [0.0] * len(endpoints)
        matched = self.index.match(hashes)
        if not matched:
            return [0.0] * len(endpoints)
        total = float(len(hashes))
        return [matched.get(e.endpoint.name, 0) / total for e in endpoints]

    def on_routed(self, request: LLMRequest, endpoint: EndpointState, now: float) -> None:
        hashes = self._pending.pop(request.request_id, None)
        if hashes is None:
            hashes = self.hashes(request)
        if self.lru_capacity_per_server is None:
            self._autosize(endpoint)
        self.index.record(endpoint.name, hashes)

    def forget(self, keep: Iterable[str]) -> None:
        keep_list = list(keep)
        self.index.forget(keep_list)
        keep_set = set(keep_list)
        for name in [n for n in self._sized if n not in keep_set]:
            del self._sized[name]

    def _autosize(self, e: EndpointState) -> None:
        m = e.metrics
        if m is None or m.num_gpu_blocks is None or m.block_size is None:
            return
        capacity = max(1, m.num_gpu_blocks * m.block_size * CHARS_PER_TOKEN // self.block_size_chars)
        if self._sized.get(e.name) != capacity:
            self._sized[e.name] = capacity
            self.index.set_capacity(e.name, capacity)
