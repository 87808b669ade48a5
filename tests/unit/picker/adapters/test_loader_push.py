"""`AdapterLoader` with sidecar push state: what a pod has registered costs no I/O, loads go
through the sidecar while it is up, and unloads and loads of one pair never overlap."""

from __future__ import annotations

import asyncio

import pytest

from epp.clock import FakeClock
from epp.errors import EppError
from epp.picker.adapters.catalog import Catalog
from epp.picker.adapters.loader import REASON_FAILED, AdapterLoader, SidecarCallError
from tests.unit.picker.adapters.fakes import CatalogFile, FakePods

# Nothing listens here: a loader that reached for HTTP would fail.
ADDRESS = "127.0.0.1:9"
CATALOG = Catalog({"legal": "/loras/legal", "code": "/loras/code", "static-one": "/static"})


def make(pods: FakePods, catalog: Catalog = CATALOG) -> AdapterLoader:
    return AdapterLoader(CatalogFile(catalog), clock=pods.clock, pods=pods, load_timeout_s=5.0)


async def test_an_adapter_the_pod_reports_registered_is_not_loaded_and_not_owned() -> None:
    pods = FakePods(FakeClock(), registered={ADDRESS: {"static-one"}})
    loader = make(pods)
    result = await loader.ensure_loaded(ADDRESS, "static-one")
    assert result is not None and not result.loaded_now
    assert pods.calls == [] and loader.loads_started == 0 and loader.registered_hits == 1
    assert dict(loader.owned()) == {}
    await loader.close()


async def test_a_missing_adapter_is_loaded_once_through_the_sidecar_for_concurrent_requests() -> None:
    pods = FakePods(FakeClock(), registered={ADDRESS: set()}, gate=asyncio.Event())
    loader = make(pods)
    waiting = [asyncio.create_task(loader.ensure_loaded(ADDRESS, "legal")) for _ in range(5)]
    await asyncio.sleep(0.01)
    pods.gate.set()  # type: ignore[union-attr]  # set just above
    results = await asyncio.gather(*waiting)
    assert sum(1 for r in results if r is not None and r.loaded_now) == 5  # all share the one load
    assert pods.verbs() == [("load", "legal")]
    assert loader.sidecar_loads == 1 and dict(loader.owned()) == {(ADDRESS, "legal"): "demand"}
    assert loader.last_routed(ADDRESS, "legal") == pods.clock.now()
    await loader.close()


async def test_a_preload_is_owned_as_such_and_is_not_a_request() -> None:
    pods = FakePods(FakeClock(), registered={ADDRESS: set()})
    loader = make(pods)
    await loader.ensure_loaded(ADDRESS, "code", preload=True)
    assert dict(loader.owned()) == {(ADDRESS, "code"): "preload"}
    assert loader.last_routed(ADDRESS, "code") is None
    await loader.close()


async def test_a_sidecar_refusal_is_a_503_quoting_the_model_server() -> None:
    refusal = SidecarCallError("NOT_FOUND", "HTTP 404: No adapter found for /loras/legal")
    pods = FakePods(FakeClock(), registered={ADDRESS: set()}, refuse={(ADDRESS, "legal"): refusal})
    loader = make(pods)
    with pytest.raises(EppError) as caught:
        await loader.ensure_loaded(ADDRESS, "legal")
    assert caught.value.http_status == 503 and caught.value.reason == REASON_FAILED
    assert "No adapter found for /loras/legal" in caught.value.message
    assert dict(loader.owned()) == {}
    await loader.close()


async def test_without_a_sidecar_stream_the_load_goes_over_http() -> None:
    pods = FakePods(FakeClock(), reachable=False)
    loader = make(pods)
    with pytest.raises(EppError) as caught:
        await loader.ensure_loaded(ADDRESS, "legal")
    assert "/v1/load_lora_adapter" in caught.value.message  # the HTTP path was taken
    assert pods.calls == []
    await loader.close()


async def test_a_push_after_our_load_that_lacks_the_adapter_means_load_it_again() -> None:
    clock = FakeClock()
    pods = FakePods(clock, registered={ADDRESS: set()})
    loader = make(pods)
    await loader.ensure_loaded(ADDRESS, "legal")
    pods.registered[ADDRESS].clear()  # someone unloaded it (or the server restarted)
    clock.advance(1.0)
    again = await loader.ensure_loaded(ADDRESS, "legal")
    assert again is not None and again.loaded_now
    assert pods.verbs() == [("load", "legal"), ("load", "legal")]
    await loader.close()


async def test_a_request_during_an_unload_waits_for_it_then_loads_again() -> None:
    pods = FakePods(FakeClock(), registered={ADDRESS: set()})
    loader = make(pods)
    await loader.ensure_loaded(ADDRESS, "legal")
    pods.gate = asyncio.Event()
    unloading = asyncio.create_task(loader.unload(ADDRESS, "legal"))
    await asyncio.sleep(0)
    request = asyncio.create_task(loader.ensure_loaded(ADDRESS, "legal"))
    await asyncio.sleep(0.01)
    assert loader.is_unloading(ADDRESS, "legal") and not request.done()
    pods.gate.set()
    assert await unloading
    result = await request
    assert result is not None and result.loaded_now
    assert pods.verbs() == [("load", "legal"), ("unload", "legal"), ("load", "legal")]
    assert "legal" in pods.registered[ADDRESS]
    await loader.close()


async def test_forgetting_a_pod_drops_what_was_owned_there() -> None:
    pods = FakePods(FakeClock(), registered={ADDRESS: set(), "127.0.0.2:9": set()})
    loader = make(pods)
    await loader.ensure_loaded(ADDRESS, "legal")
    await loader.ensure_loaded("127.0.0.2:9", "legal")
    loader.retain(lambda address: address != ADDRESS)
    assert dict(loader.owned()) == {("127.0.0.2:9", "legal"): "demand"}
    assert loader.last_routed(ADDRESS, "legal") is None
    await loader.close()
