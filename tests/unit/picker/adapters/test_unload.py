"""`ColdAdapterUnloader`: which adapters a pod gives back, and which it never does."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from epp.clock import FakeClock
from epp.picker.adapters.catalog import Catalog
from epp.picker.adapters.loader import AdapterLoader, SidecarCallError
from epp.picker.adapters.unload import ColdAdapterUnloader, Unloaded
from epp.picker.datastore.store import Datastore
from epp.picker.datastore.types import Metrics
from epp.picker.scheduling.state import SchedulerState
from tests.support import placement
from tests.support.fake_scheduler import pool_datastore
from tests.unit.picker.adapters.fakes import CatalogFile, FakePods

IDLE_S = 60.0
NAME, ADDRESS = "pod-0-rank-0", "10.0.0.1:8000"
PATHS = {"cold": "/cold", "other": "/other", "static-one": "/static"}


@dataclass
class Pod:
    clock: FakeClock
    store: Datastore
    pods: FakePods
    catalog: CatalogFile
    loader: AdapterLoader
    scheduler: SchedulerState

    def scrape(self, **fields: object) -> None:
        self.store.update_metrics(
            NAME,
            Metrics(updated_at=self.clock.now(), lora_enabled=True, max_lora=1, **fields),  # type: ignore[arg-type]
        )

    def route(self, adapter: str) -> None:
        """What the scheduler records when it sends a request for `adapter` to the pod."""
        self.scheduler.residency.on_routed(NAME, adapter, self.clock.now())

    def unloader(self, **options: object) -> ColdAdapterUnloader:
        kwargs: dict[str, object] = {"idle_s": IDLE_S, "scheduler": self.scheduler, **options}
        return ColdAdapterUnloader(self.loader, self.store, self.clock, **kwargs)  # type: ignore[arg-type]


async def pod_with_cold_adapter(strategy: str = "demand", *, preloaded: bool = False) -> Pod:
    """One pod with one GPU slot: "cold" was loaded on demand (or preloaded), then "other" took its
    slot; "static-one" was there from the start. Then IDLE_S passes."""
    clock = FakeClock()
    store = pool_datastore(("10.0.0.1",), clock=clock)
    pods = FakePods(clock, registered={ADDRESS: {"static-one"}})
    catalog = CatalogFile(Catalog(PATHS, strategy))
    loader = AdapterLoader(catalog, clock=clock, pods=pods)
    scheduler = SchedulerState.create(seed=0, staleness_threshold_s=2.0)
    pod = Pod(clock, store, pods, catalog, loader, scheduler)
    pod.scrape()
    scheduler.residency.observe(store.snapshot().endpoints[0])  # one slot (max_lora 1)
    await loader.ensure_loaded(ADDRESS, "cold", preload=preloaded)
    if not preloaded:
        pod.route("cold")
    await loader.ensure_loaded(ADDRESS, "other")
    pod.route("other")
    await loader.ensure_loaded(ADDRESS, "static-one")
    clock.advance(IDLE_S)
    pod.scrape()
    return pod


async def test_an_idle_adapter_out_of_its_gpu_slot_is_unloaded() -> None:
    pod = await pod_with_cold_adapter()
    unloader = pod.unloader()
    assert await unloader.tick() == [Unloaded(ADDRESS, "cold", "idle")]
    assert "cold" not in pod.pods.registered[ADDRESS]
    assert (ADDRESS, "cold") not in pod.loader.owned() and unloader.unloads["idle"] == 1
    assert await unloader.tick() == []  # "other" and "static-one" hold slots or are not ours


Keep = Callable[[Pod], Awaitable[None]]


async def used_recently(pod: Pod) -> None:
    await pod.loader.ensure_loaded(ADDRESS, "cold")  # a request held for it, just now


async def running_on_the_pod(pod: Pod) -> None:
    pod.scrape(running_adapters=frozenset({"cold"}))


async def waiting_on_the_pod(pod: Pod) -> None:
    pod.scrape(waiting_adapters=frozenset({"cold"}))


async def in_flight_per_the_scheduler(pod: Pod) -> None:
    pod.scheduler.inflight.add("r-1", NAME, "cold", pod.clock.now())


async def back_in_a_gpu_slot(pod: Pod) -> None:
    pod.route("cold")


@pytest.mark.parametrize(
    "keep",
    [used_recently, running_on_the_pod, waiting_on_the_pod, in_flight_per_the_scheduler, back_in_a_gpu_slot],
    ids=lambda f: f.__name__,
)
async def test_an_adapter_in_use_or_resident_is_kept(keep: Keep) -> None:
    pod = await pod_with_cold_adapter()
    await keep(pod)
    assert "cold" not in {u.adapter for u in await pod.unloader().tick()}
    assert "cold" in pod.pods.registered[ADDRESS]


async def test_a_preloaded_adapter_or_preload_strategy_all_is_never_idle_unloaded() -> None:
    pod = await pod_with_cold_adapter(strategy="all")
    assert await pod.unloader().tick() == []
    preloaded = await pod_with_cold_adapter(preloaded=True)
    assert preloaded.loader.owned()[(ADDRESS, "cold")] == "preload"
    assert await preloaded.unloader().tick() == []


async def test_idle_unload_zero_disables_idle_unloading() -> None:
    pod = await pod_with_cold_adapter()
    assert await pod.unloader(idle_s=0.0).tick() == []


async def test_a_catalogue_removal_unloads_what_we_loaded_but_never_a_static_adapter() -> None:
    pod = await pod_with_cold_adapter()
    pod.catalog.current = Catalog({"cold": "/cold"})
    unloaded = await pod.unloader(idle_s=0.0).tick()
    assert unloaded == [Unloaded(ADDRESS, "other", "removed")]
    assert pod.pods.registered[ADDRESS] == {"static-one", "cold"}


async def test_a_removal_with_requests_in_flight_waits_for_them() -> None:
    pod = await pod_with_cold_adapter()
    pod.catalog.current = Catalog({})
    pod.scheduler.inflight.add("r-1", NAME, "other", pod.clock.now())
    unloader = pod.unloader(idle_s=0.0)
    assert await unloader.tick() == [Unloaded(ADDRESS, "cold", "removed")]
    pod.scheduler.inflight.remove("r-1")
    assert await unloader.tick() == [Unloaded(ADDRESS, "other", "removed")]


async def test_work_per_tick_is_bounded_oldest_first() -> None:
    pod = await pod_with_cold_adapter()
    names = [f"extra-{i}" for i in range(5)]
    pod.catalog.current = Catalog({**PATHS, **{n: f"/{n}" for n in names}})
    for name in names:  # one request each, a second apart, none holding a slot
        await pod.loader.ensure_loaded(ADDRESS, name)
        pod.clock.advance(1.0)
    pod.clock.advance(IDLE_S)
    unloader = pod.unloader(max_per_tick=4)
    first = [u.adapter for u in await unloader.tick()]
    assert first == ["cold", "extra-0", "extra-1", "extra-2"]
    assert [u.adapter for u in await unloader.tick()] == ["extra-3", "extra-4"]


async def test_a_failed_unload_is_retried_after_a_delay() -> None:
    pod = await pod_with_cold_adapter()
    pod.pods.refuse[(ADDRESS, "cold")] = SidecarCallError("FAILED_PRECONDITION", "HTTP 500: busy")
    unloader = pod.unloader()
    assert await unloader.tick() == [] and unloader.unload_failures == 1
    del pod.pods.refuse[(ADDRESS, "cold")]
    assert await unloader.tick() == []  # not yet
    pod.clock.advance(unloader.tick_s * 4)
    assert await unloader.tick() == [Unloaded(ADDRESS, "cold", "idle")]


async def test_a_pod_that_left_the_pool_is_forgotten() -> None:
    pod = await pod_with_cold_adapter()
    pod.store.replace_pods(())
    assert await pod.unloader().tick() == []
    assert dict(pod.loader.owned()) == {}
    assert pod.pods.verbs().count(("unload", "cold")) == 0


async def test_a_negative_idle_time_is_refused() -> None:
    pod = await pod_with_cold_adapter()
    with pytest.raises(ValueError, match="idle_s"):
        pod.unloader(idle_s=-1.0)


@pytest.mark.parametrize("preloaded", [False, True], ids=["on-demand", "preloaded"])
async def test_with_the_planned_strategy_a_cold_adapter_goes_unless_the_pod_is_its_planned_home(
    preloaded: bool,
) -> None:
    pod = await pod_with_cold_adapter("planned", preloaded=preloaded)
    pod.scheduler.plan.plan_homes("cold", (NAME,), 1)  # the only pod: the plan makes it the adapter's home
    unloader = pod.unloader()
    assert await unloader.tick() == []
    plan = pod.scheduler.plan
    # A pod joins that the hash ranks above this one for "cold": the plan moves the adapter there.
    other = next(
        p for p in (f"pod-{i}-rank-0" for i in range(1, 50)) if placement.ranking("cold", (p, NAME))[0] == p
    )
    plan.plan_homes("cold", (other, NAME), 1)
    assert await unloader.tick() == [Unloaded(ADDRESS, "cold", "idle")]
