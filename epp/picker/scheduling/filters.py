"""Filters: each keeps a subset of the endpoints it is given, in order.

The upstream v0.3/v0.5 decision-tree filters (`low-queue-filter`, `least-queue-filter`,
`least-kv-cache-filter`, `lora-affinity-filter`), `header-based-testing-filter`, and
`decode-filter` (llm-d role label).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.framework import ScheduleContext

TEST_ENDPOINT_HEADER = "test-epp-endpoint-selection"
ROLE_LABEL = "llm-d.ai/role"


def _waiting(e: EndpointState) -> int:
    return e.metrics.waiting_requests if e.metrics else 0


def _kv(e: EndpointState) -> float:
    return e.metrics.kv_cache_usage if e.metrics else 0.0


@dataclass(frozen=True, slots=True)
class LowQueueFilter:
    """Keep endpoints whose waiting queue is ≤ `threshold` (upstream `queueingThresholdLoRA`, 128)."""

    name: str = "low-queue-filter"
    threshold: int = 128
    strict: bool = False  # v0.3 used `<`, v0.4+ `<=`

    def filter(self, ctx: ScheduleContext, endpoints: list[EndpointState]) -> list[EndpointState]:
        if self.strict:
            return [e for e in endpoints if _waiting(e) < self.threshold]
        return [e for e in endpoints if _waiting(e) <= self.threshold]


@dataclass(frozen=True, slots=True)
class LeastQueueFilter:
    """Keep endpoints with waiting queue in [min, min + (max − min) // N]."""

    name: str = "least-queue-filter"

    def filter(self, ctx: ScheduleContext, endpoints: list[EndpointState]) -> list[EndpointState]:
        if not endpoints:
            return endpoints
        queues = [_waiting(e) for e in endpoints]
        low, high = min(queues), max(queues)
        limit = low + (high - low) // len(endpoints)
        return [e for e, q in zip(endpoints, queues, strict=True) if q <= limit]


@dataclass(frozen=True, slots=True)
class LeastKvCacheFilter:
    """Keep endpoints with KV usage in [min, min + (max − min) / N]."""

    name: str = "least-kv-cache-filter"

    def filter(self, ctx: ScheduleContext, endpoints: list[EndpointState]) -> list[EndpointState]:
        if not endpoints:
            return endpoints
        kvs = [_kv(e) for e in endpoints]
        low, high = min(kvs), max(kvs)
        limit = low + (high - low) / len(endpoints)
        return [e for e, kv in zip(endpoints, kvs, strict=True) if kv <= limit]


@dataclass(frozen=True, slots=True)
class LoraAffinityFilter:
    """Upstream soft affinity: pods with the adapter active, else pods with a free slot.

    With both sets non-empty, the affinity set is chosen with probability `threshold`
    (0.999), else the available set. Neither → empty (the filter fails).
    """

    name: str = "lora-affinity-filter"
    threshold: float = 0.999
    count_waiting_separately: bool = True  # v0.4+: available = active + waiting < max

    def filter(self, ctx: ScheduleContext, endpoints: list[EndpointState]) -> list[EndpointState]:
        target = ctx.request.target_model
        affinity: list[EndpointState] = []
        available: list[EndpointState] = []
        for e in endpoints:
            m = e.metrics
            if m is None:
                continue
            if target in m.active_adapters:
                affinity.append(e)
                continue
            if self.count_waiting_separately:
                used = len(m.running_adapters) + len(m.waiting_adapters)
            else:
                used = len(m.active_adapters)  # v0.3: waiting merged into active
            if used < m.max_lora:
                available.append(e)
        if affinity and available:
            return affinity if ctx.state.rng.random() < self.threshold else available
        return affinity or available


@dataclass(frozen=True, slots=True)
class HeaderBasedTestingFilter:
    """Keep endpoints whose IP is listed in header `test-epp-endpoint-selection` (comma-separated)."""

    name: str = "header-based-testing-filter"

    def filter(self, ctx: ScheduleContext, endpoints: list[EndpointState]) -> list[EndpointState]:
        raw = ctx.request.headers.get(TEST_ENDPOINT_HEADER, "")
        wanted = [part.strip() for part in raw.split(",") if part.strip()]
        by_ip: dict[str, EndpointState] = {}
        for e in endpoints:
            by_ip.setdefault(e.endpoint.ip, e)
            by_ip.setdefault(e.address, e)
        return [by_ip[w] for w in wanted if w in by_ip]


@dataclass(frozen=True, slots=True)
class DecodeFilter:
    """Keep endpoints whose `llm-d.ai/role` label is `decode` or `both`, or absent."""

    name: str = "decode-filter"

    def filter(self, ctx: ScheduleContext, endpoints: list[EndpointState]) -> list[EndpointState]:
        return [e for e in endpoints if e.endpoint.labels.get(ROLE_LABEL, "both") in ("decode", "both")]


def apply_or_keep(
    ctx: ScheduleContext,
    flt: LowQueueFilter | LeastQueueFilter | LeastKvCacheFilter | LoraAffinityFilter,
    endpoints: list[EndpointState],
) -> tuple[list[EndpointState], bool]:
    """Decision-tree semantics: (result, True) when the filter kept any, else (the input, False)."""
    kept = flt.filter(ctx, endpoints)
    return (kept, True) if kept else (endpoints, False)


__all__: Sequence[str] = (
    "DecodeFilter",
    "HeaderBasedTestingFilter",
    "LeastKvCacheFilter",
    "LeastQueueFilter",
    "LoraAffinityFilter",
    "LowQueueFilter",
    "apply_or_keep",
)
