"""`Preloader`: with preloadStrategy `all` every catalogue adapter reaches every pod that answers,
with `planned` each adapter the scheduler has seen reaches the pods its plan makes its homes;
a bounded number at a time, with failures retried later."""

from __future__ import annotations

import asyncio

from epp.clock import FakeClock
from epp.picker.adapters.catalog import Catalog
from epp.picker.adapters.loader import AdapterLoader, SidecarCallError
from epp.picker.adapters.preload import Preloader
from epp.picker.datastore.store import Datastore
from epp.picker.datastore.types import Metrics
from epp.picker.scheduling.build import build_scheduler_from_config
from epp.picker.scheduling.framework import ProfileScheduler, record_routed
from epp.picker.scheduling.picker_config import load_config
from epp.picker.scheduling.policies import policy_config_text
from epp.picker.scheduling.state import SchedulerState
from epp.picker.scheduling.types import LLMRequest
from epp.picker.scrape.backoff import Backoff
from tests.support.fake_scheduler import pool_datastore
from tests.unit.picker.adapters.fakes import CatalogFile, FakePods

IPS = ("10.0.0.1", "10.0.0.2")
ADDRESSES = [f"{ip}:8000" for ip in IPS]
ALL = Catalog({"a1": "/a1", "a2": "/a2", "a3": "/a3"}, "all")


def setup(
    catalog: Catalog = ALL,
    *,
    scraped: tuple[int, ...] = (0, 1),
    concurrency: int = 4,
    scheduler: SchedulerState | None = None,
) -> tuple[FakeClock, Datastore, FakePods, CatalogFile, Preloader]:
    clock = FakeClock()
    store = pool_datastore(IPS, clock=clock)
    for index in scraped:
        store.update_metrics(f"pod-{index}-rank-0", Metrics(updated_at=clock.now()))
    pods = FakePods(clock, registered={address: set() for address in ADDRESSES})
    file = CatalogFile(catalog)
    loader = AdapterLoader(file, clock=clock, pods=pods)
    backoff = Backoff(base_s=1.0, cap_s=8.0)
    preloader = Preloader(loader, store, clock, concurrency=concurrency, backoff=backoff, scheduler=scheduler)
    return clock, store, pods, file, preloader


async def settle(preloader: Preloader) -> int:
    """Start due loads until none is running or due; returns how many were started."""
    started = 0
    async with asyncio.TaskGroup() as group:
        for _ in range(1000):
            started += preloader.start_due(group)
            if not preloader.pending:
                break
            await asyncio.sleep(0)
    return started


async def test_every_adapter_lands_on_every_scraped_pod_a_bounded_number_at_a_time() -> None:
    _, _, pods, _, preloader = setup(concurrency=2)
    assert await settle(preloader) == 6
    assert pods.registered == {address: {"a1", "a2", "a3"} for address in ADDRESSES}
    assert pods.most_at_once == 2
    assert await settle(preloader) == 0  # nothing is loaded twice


async def test_demand_strategy_preloads_nothing() -> None:
    _, _, pods, _, preloader = setup(Catalog(dict(ALL.paths), "demand"))
    assert await settle(preloader) == 0 and pods.calls == []


async def test_a_pod_is_preloaded_once_it_answers_its_scrapes() -> None:
    clock, store, pods, _, preloader = setup(scraped=(0,))
    await settle(preloader)
    assert pods.registered[ADDRESSES[1]] == set()
    store.update_metrics("pod-1-rank-0", Metrics(updated_at=clock.now()))
    await settle(preloader)
    assert pods.registered[ADDRESSES[1]] == {"a1", "a2", "a3"}


async def test_a_new_catalogue_adapter_is_loaded_everywhere() -> None:
    _, _, pods, file, preloader = setup()
    await settle(preloader)
    file.current = Catalog({**ALL.paths, "a4": "/a4"}, "all")
    assert await settle(preloader) == 2
    assert all("a4" in held for held in pods.registered.values())


async def test_a_failed_preload_is_retried_after_a_delay() -> None:
    clock, _, pods, _, preloader = setup(Catalog({"a1": "/a1"}, "all"), scraped=(0,))
    pods.refuse[(ADDRESSES[0], "a1")] = SidecarCallError("NOT_FOUND", "HTTP 404: no such adapter")
    assert await settle(preloader) == 1 and preloader.loads_failed == 1
    del pods.refuse[(ADDRESSES[0], "a1")]
    assert await settle(preloader) == 0  # waits out its backoff
    clock.advance(1.0)
    assert await settle(preloader) == 1
    assert pods.registered[ADDRESSES[0]] == {"a1"}


async def test_an_adapter_a_pod_loses_is_loaded_again() -> None:
    clock, _, pods, _, preloader = setup(Catalog({"a1": "/a1"}, "all"), scraped=(0,))
    await settle(preloader)
    pods.registered[ADDRESSES[0]].clear()  # the model server restarted; its sidecar says so
    clock.advance(1.0)
    assert await settle(preloader) == 1
    assert pods.registered[ADDRESSES[0]] == {"a1"}


def _route(scheduler: ProfileScheduler, store: Datastore, adapter: str, now: float) -> str:
    """Route one request for `adapter` through the default policy; returns the pod's address."""
    request = LLMRequest(request_id=f"{adapter}-{now}", incoming_model=adapter, target_model=adapter)
    snapshot = store.snapshot()
    result = scheduler.schedule(request, snapshot.endpoints, snapshot, now)
    record_routed(
        scheduler, request, result, now
    )  # as the director does: plugins learn it, the ledger counts it
    return result.primary.address


async def test_planned_strategy_loads_adapters_seen_on_their_planned_homes_only() -> None:
    text = policy_config_text("default")
    assert text is not None
    scheduler = build_scheduler_from_config(load_config(text), seed=1, name="default")
    assert isinstance(scheduler, ProfileScheduler)
    planned = Catalog(dict(ALL.paths), "planned")
    clock, store, pods, _, preloader = setup(planned, scheduler=scheduler.state)
    assert await settle(preloader) == 0  # no traffic yet: no plan, nothing to load ahead
    served_at = _route(scheduler, store, "a1", clock.now())
    assert await settle(preloader) == 1
    assert pods.registered[served_at] == {"a1"}  # where the request went: its planned home
    assert sum(len(names) for names in pods.registered.values()) == 1  # a2, a3: no traffic, no load
    for _ in range(3):  # a1 takes all the traffic: its share asks for both pods
        _route(scheduler, store, "a1", clock.now())
    assert await settle(preloader) == 1
    assert pods.registered == {address: {"a1"} for address in ADDRESSES}


async def test_planned_strategy_without_scheduler_state_preloads_nothing() -> None:
    _, _, pods, _, preloader = setup(Catalog(dict(ALL.paths), "planned"))
    assert await settle(preloader) == 0 and pods.calls == []
