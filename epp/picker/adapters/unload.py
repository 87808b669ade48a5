"""Cold-adapter unloading (`--adapter-idle-unload`): give back what on-demand loading took.

Each tick looks only at adapters the loader registered itself (`AdapterLoader.owned()`), so
an adapter a pod had without us (static `--lora-modules`) is never unloaded. It unloads,
oldest use first and at most `max_per_tick` per tick:

- adapters removed from the catalogue, wherever we loaded them;
- adapters loaded on demand (not preloaded, and the catalogue is not `preloadStrategy: all`)
  that have had no request held for that pod for `idle_s` and are cold there: the residency
  model no longer has them in a GPU slot. One still in a slot is kept: it takes no slot
  another adapter needs (the model evicts it when one does), and unloading it would only
  cost a reload. With `preloadStrategy: planned` the same goes for preloaded ones, and a pod
  that the placement plan makes one of the adapter's homes keeps it (the preloader would
  only load it again).

Never one with requests in flight: running or waiting in the pod's metrics, or in flight
per the scheduler. A failed unload is logged and retried after a doubling delay.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from epp.clock import Clock
from epp.errors import EppError
from epp.picker.adapters.loader import AdapterLoader, Key, Origin
from epp.picker.datastore.store import Datastore
from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.state import SchedulerState

log = logging.getLogger(__name__)

Reason = Literal["idle", "removed"]
MAX_TICK_S = 10.0
MIN_TICK_S = 0.05
MAX_RETRY_S = 300.0


@dataclass(frozen=True, slots=True)
class Unloaded:
    address: str
    adapter: str
    reason: Reason


class ColdAdapterUnloader:
    """Unloads cold on-demand adapters and catalogue removals (see module doc).

    `idle_s` 0 disables idle unloading (catalogue removals still unload). `scheduler` gives
    in-flight counts and residency; None (a policy without that state) leaves only the
    pod's metrics and the idle time to judge by.
    """

    def __init__(
        self,
        loader: AdapterLoader,
        datastore: Datastore,
        clock: Clock,
        *,
        idle_s: float,
        scheduler: SchedulerState | None = None,
        max_per_tick: int = 4,
    ) -> None:
        if idle_s < 0 or max_per_tick < 1:
            raise ValueError("idle_s must be >= 0 and max_per_tick >= 1")
        self._loader = loader
        self._datastore = datastore
        self._clock = clock
        self._idle_s = idle_s
        self._scheduler = scheduler
        self._max_per_tick = max_per_tick
        self.tick_s = min(MAX_TICK_S, max(MIN_TICK_S, idle_s / 4)) if idle_s else MAX_TICK_S
        self._failures: dict[Key, int] = {}
        self._retry_at: dict[Key, float] = {}
        self.unloads: dict[Reason, int] = {"idle": 0, "removed": 0}
        self.unload_failures = 0

    async def run(self) -> None:
        while True:
            await self._clock.sleep(self.tick_s)
            await self.tick()

    async def tick(self) -> list[Unloaded]:
        """One pass: unload what is due (at most `max_per_tick`); returns what was unloaded."""
        now = self._clock.now()
        endpoints = {state.address: state for state in self._datastore.snapshot().endpoints}
        self._loader.retain(endpoints.__contains__)
        for key in [k for k in self._retry_at if k not in self._loader.owned()]:
            self._retry_at.pop(key, None)
            self._failures.pop(key, None)
        due = sorted(self._due(endpoints, now))
        done: list[Unloaded] = []
        for _, key, reason in due[: self._max_per_tick]:
            if await self._unload(key, reason, now):
                done.append(Unloaded(key[0], key[1], reason))
        return done

    def _due(self, endpoints: dict[str, EndpointState], now: float) -> list[tuple[float, Key, Reason]]:
        catalog = self._loader.catalog
        idle_unloading = self._idle_s > 0 and catalog.preload_strategy != "all"
        due: list[tuple[float, Key, Reason]] = []
        for key, origin in self._loader.owned().items():
            address, adapter = key
            endpoint = endpoints.get(address)
            if endpoint is None or self._retry_at.get(key, 0.0) > now:
                continue
            if self._loader.is_loading(address, adapter) or self._loader.is_unloading(address, adapter):
                continue
            if self._busy(endpoint, adapter):
                continue
            last = self._loader.last_routed(address, adapter)
            if adapter not in catalog.paths:
                due.append((last or 0.0, key, "removed"))
            elif idle_unloading and self._cold(origin, endpoint, adapter, last, now):
                due.append((last or 0.0, key, "idle"))
        return due

    def _cold(
        self, origin: Origin, endpoint: EndpointState, adapter: str, last: float | None, now: float
    ) -> bool:
        """Idle for `idle_s`, out of every GPU slot, and not kept for the strategy's sake."""
        if self._loader.catalog.preload_strategy == "planned":
            if self._planned_home(endpoint, adapter):
                return False
        elif origin != "demand" or last is None:
            return False
        return now - (last or 0.0) >= self._idle_s and not self._in_gpu_slot(endpoint, adapter)

    def _planned_home(self, endpoint: EndpointState, adapter: str) -> bool:
        state = self._scheduler
        return state is not None and endpoint.name in state.plan.planned_homes(adapter)

    def _busy(self, endpoint: EndpointState, adapter: str) -> bool:
        metrics = endpoint.metrics
        if metrics is not None and adapter in metrics.active_adapters:
            return True
        state = self._scheduler
        return state is not None and state.adapter_in_flight(endpoint.name, adapter)

    def _in_gpu_slot(self, endpoint: EndpointState, adapter: str) -> bool:
        state = self._scheduler
        return state is not None and state.adapter_in_gpu_slot(endpoint.name, adapter)

    async def _unload(self, key: Key, reason: Reason, now: float) -> bool:
        address, adapter = key
        try:
            await self._loader.unload(address, adapter)
        except EppError as error:
            failures = self._failures.get(key, 0) + 1
            self._failures[key] = failures
            delay_s = min(MAX_RETRY_S, self.tick_s * 2.0 ** min(failures, 16))
            self._retry_at[key] = now + delay_s
            self.unload_failures += 1
            log.warning(
                "adapter unload failed; will retry",
                extra={"address": address, "adapter": adapter, "error": error.message, "retry_s": delay_s},
            )
            return False
        self._failures.pop(key, None)
        self._retry_at.pop(key, None)
        self.unloads[reason] += 1
        log.info("cold adapter unloaded", extra={"address": address, "adapter": adapter, "reason": reason})
        return True


__all__ = ["ColdAdapterUnloader", "Unloaded"]
