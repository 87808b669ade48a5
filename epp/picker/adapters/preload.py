"""Adapters loaded ahead of their requests, in the background.

Which (pod, adapter) pairs, by the catalogue's `preloadStrategy`:
- `all`: every catalogue adapter on every ready pod.
- `planned`: each catalogue adapter the scheduler has seen on the pods its placement plan
  makes the adapter's homes (hottest adapter first), so the first requests after the plan
  moves an adapter, or widens its homes, find it registered. Needs the default policy's
  scheduler state; without it nothing is preloaded.
- `demand`: none.

`Preloader` loads each wanted pair not yet known loaded: when a pod appears (its first good
scrape), when the catalogue or the plan changes (checked every `interval_s`) and, with sidecar
push state, when a pod reports it lost one (a model-server restart). At most `concurrency`
loads run at once; a failed one is logged and retried after a jittered, doubling delay.
Loads go through `AdapterLoader` with `preload=True`, so a request for the same pair waits on
the same load instead of starting another, and routing never waits on the preloader itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

from epp.clock import Clock
from epp.errors import EppError
from epp.picker.adapters.catalog import Catalog
from epp.picker.adapters.loader import AdapterLoader, Key
from epp.picker.datastore.store import Datastore
from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.state import SchedulerState
from epp.picker.scrape.backoff import Backoff

log = logging.getLogger(__name__)

DEFAULT_BACKOFF = Backoff(base_s=1.0, cap_s=60.0)


class Preloader:
    def __init__(
        self,
        loader: AdapterLoader,
        datastore: Datastore,
        clock: Clock,
        *,
        concurrency: int = 4,
        interval_s: float = 1.0,
        backoff: Backoff = DEFAULT_BACKOFF,
        rng: random.Random | None = None,
        scheduler: SchedulerState | None = None,
    ) -> None:
        if concurrency < 1 or interval_s <= 0:
            raise ValueError("concurrency must be >= 1 and interval_s > 0")
        self._loader = loader
        self._datastore = datastore
        self._clock = clock
        self._concurrency = concurrency
        self._interval_s = interval_s
        self._backoff = backoff
        self._rng = rng if rng is not None else random.Random()
        self._scheduler = scheduler
        self._wake = asyncio.Event()
        self._running: set[Key] = set()
        self._done: dict[Key, float] = {}  # pair -> Clock time its load finished
        self._failures: dict[Key, int] = {}
        self._retry_at: dict[Key, float] = {}
        self.loads_failed = 0
        datastore.on_endpoints_changed(self._wake.set)

    @property
    def pending(self) -> int:
        """Pairs being loaded now."""
        return len(self._running)

    def done(self) -> frozenset[Key]:
        return frozenset(self._done)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            while True:
                self._wake.clear()
                self.start_due(group)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._interval_s)

    def start_due(self, group: asyncio.TaskGroup) -> int:
        """Start loads for due pairs (up to the concurrency limit); returns how many started."""
        catalog = self._loader.catalog
        now = self._clock.now()
        # A pod is preloaded once it answers its scrapes, so the first load does not race its start.
        ready = [s for s in self._datastore.snapshot().endpoints if s.is_fresh(now, float("inf"))]
        wanted = self._wanted(catalog, ready, now)
        wanted_set = set(wanted)
        for table in (self._done, self._failures, self._retry_at):
            for key in [k for k in table if k not in wanted_set]:
                del table[key]
        started = 0
        for key in wanted:
            if len(self._running) >= self._concurrency:
                break
            if key in self._running or self._retry_at.get(key, 0.0) > now:
                continue
            if key in self._done and not self._lost(key):
                continue
            self._done.pop(key, None)
            self._running.add(key)
            group.create_task(self._load(key), name=f"adapter-preload:{key[0]}:{key[1]}")
            started += 1
        return started

    def _wanted(self, catalog: Catalog, ready: list[EndpointState], now: float) -> list[Key]:
        """The pairs the strategy wants loaded, in the order to load them."""
        if catalog.preload_strategy == "all":
            return [(state.address, adapter) for adapter in catalog.paths for state in ready]
        state = self._scheduler
        if catalog.preload_strategy != "planned" or state is None:
            return []
        address_of = {s.name: s.address for s in ready}
        plan, popularity = state.plan, state.popularity
        seen = [adapter for adapter in catalog.paths if plan.planned_homes(adapter)]
        seen.sort(key=lambda adapter: (-popularity.rate(adapter, now), adapter))
        return [
            (address_of[home], adapter)
            for adapter in seen
            for home in plan.planned_homes(adapter)
            if home in address_of
        ]

    def _lost(self, key: Key) -> bool:
        """True when a State pushed after our load says the pod no longer has the adapter."""
        address, adapter = key
        pushed = self._loader.pushed(address)
        if pushed is None or adapter in pushed.registered or self._loader.is_loading(address, adapter):
            return False
        return pushed.received_at > self._done[key]

    async def _load(self, key: Key) -> None:
        address, adapter = key
        try:
            await self._loader.ensure_loaded(address, adapter, preload=True)
        except EppError as error:
            failures = self._failures.get(key, 0) + 1
            self._failures[key] = failures
            delay_s = self._backoff.delay_s(failures, self._rng)
            self._retry_at[key] = self._clock.now() + delay_s
            self.loads_failed += 1
            log.warning(
                "adapter preload failed; will retry",
                extra={"address": address, "adapter": adapter, "error": error.message, "retry_s": delay_s},
            )
        else:
            self._done[key] = self._clock.now()
            self._failures.pop(key, None)
            self._retry_at.pop(key, None)
        finally:
            self._running.discard(key)
            self._wake.set()
