"""What the adapter parts expose: Prometheus families and `GET /debug/adapters`.

Both read the parts' counters and tables at scrape/request time; nothing here is on the
request path.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from epp.clock import Clock
from epp.picker.adapters.loader import AdapterLoader
from epp.picker.adapters.preload import Preloader
from epp.picker.adapters.push import AdapterStatePush
from epp.picker.adapters.unload import ColdAdapterUnloader


@dataclass(frozen=True, slots=True)
class AdapterParts:
    loader: AdapterLoader
    clock: Clock
    push: AdapterStatePush | None = None
    preloader: Preloader | None = None
    unloader: ColdAdapterUnloader | None = None


class AdapterCollector(Collector):
    def __init__(self, parts: AdapterParts) -> None:
        self._parts = parts

    def describe(self) -> Iterator[Metric]:
        return iter(())  # unchecked: series depend on the pool

    def collect(self) -> Iterator[Metric]:
        parts = self._parts
        loader = parts.loader
        loads = CounterMetricFamily(
            "inference_extension_adapter_loads",
            "Adapter loads the EPP started, by the path they took.",
            labels=("via",),
        )
        loads.add_metric(["sidecar"], loader.sidecar_loads)
        loads.add_metric(["http"], loader.loads_started - loader.sidecar_loads)
        yield loads
        hits = CounterMetricFamily(
            "inference_extension_adapter_push_registered_hits",
            "Requests whose adapter the pod's pushed state showed registered (no load, no I/O).",
        )
        hits.add_metric([], loader.registered_hits)
        yield hits
        owned = GaugeMetricFamily(
            "inference_extension_adapter_owned",
            "Adapters the EPP registered itself and has not unloaded, by how.",
            labels=("origin",),
        )
        origins = list(loader.owned().values())
        for origin in ("demand", "preload"):
            owned.add_metric([origin], origins.count(origin))
        yield owned
        if parts.push is not None:
            pushed = GaugeMetricFamily(
                "inference_extension_adapter_state_pushed",
                "1 for each endpoint whose adapter view comes from its sidecar's push stream now.",
                labels=("endpoint",),
            )
            for address in sorted(parts.push.states()):
                pushed.add_metric([address], 1.0)
            yield pushed
            sidecars = GaugeMetricFamily(
                "inference_extension_adapter_state_sidecars",
                "Sidecars the EPP is dialling or streaming from.",
            )
            sidecars.add_metric([], len(parts.push.sidecars()))
            yield sidecars
        if parts.unloader is not None:
            unloads = CounterMetricFamily(
                "inference_extension_adapter_unloads",
                "Adapters the EPP unloaded: idle on-demand ones and catalogue removals.",
                labels=("reason",),
            )
            for reason, count in parts.unloader.unloads.items():
                unloads.add_metric([reason], count)
            yield unloads
            failed = CounterMetricFamily(
                "inference_extension_adapter_unload_failures", "Unloads that failed (retried later)."
            )
            failed.add_metric([], parts.unloader.unload_failures)
            yield failed
        if parts.preloader is not None:
            preload_failed = CounterMetricFamily(
                "inference_extension_adapter_preload_failures", "Preloads that failed (retried later)."
            )
            preload_failed.add_metric([], parts.preloader.loads_failed)
            yield preload_failed


def adapters_route(parts: AdapterParts, *, path: str = "/debug/adapters") -> web.RouteDef:
    """`GET path`: the catalogue strategy, each endpoint on push state, and what the EPP loaded."""

    async def handler(_request: web.Request) -> web.Response:
        loader = parts.loader
        now = parts.clock.now()
        pushed = parts.push.states() if parts.push is not None else {}
        body = {
            "preload_strategy": loader.catalog.preload_strategy,
            "push_enabled": parts.push is not None,
            "sidecars": sorted(parts.push.sidecars()) if parts.push is not None else [],
            "pushed": [
                {
                    "endpoint": address,
                    "version": state.version,
                    "age_s": round(now - state.received_at, 3),
                    "registered": sorted(state.registered),
                    "running": sorted(state.running_adapters),
                    "waiting": sorted(state.waiting_adapters),
                    "max_lora": state.max_lora,
                }
                for address, state in sorted(pushed.items())
            ],
            "owned": [
                {
                    "endpoint": address,
                    "adapter": adapter,
                    "origin": origin,
                    "idle_s": _idle_s(loader, address, adapter, now),
                }
                for (address, adapter), origin in sorted(loader.owned().items())
            ],
        }
        return web.json_response(body, dumps=json.dumps)

    return web.get(path, handler)


def _idle_s(loader: AdapterLoader, address: str, adapter: str, now: float) -> float | None:
    last = loader.last_routed(address, adapter)
    return None if last is None else round(now - last, 3)
