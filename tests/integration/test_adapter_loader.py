"""The on-demand adapter loader against real `epp sim` pods (vLLM's runtime LoRA API).

What a user sees: the first request for a catalogue adapter waits until the chosen pod has
it and is then served by it; N concurrent requests cause one load; a failed load is a
clear 503 and leaves the pod, other adapters and later requests working.
"""

from __future__ import annotations

import asyncio
import functools
import json
import pathlib
import random
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from epp._proto.envoy.config.core.v3 import base_pb2
from epp._proto.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from epp._proto.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.clock import FakeClock, SystemClock
from epp.errors import EppError
from epp.picker.adapters.catalog import Catalog
from epp.picker.adapters.hold import hold_for_adapter
from epp.picker.adapters.loader import REASON_FAILED, REASON_TIMEOUT, AdapterLoader
from epp.picker.adapters.preload import Preloader
from epp.picker.datastore.types import InferenceModel, Metrics
from epp.picker.director import Director
from epp.picker.extproc.stream import Pending, StreamHandler, StreamOptions
from epp.picker.lifecycle import Ending
from epp.tools.localstack import free_port, pick_pod_addresses
from testkit.waiting import eventually
from tests.support.fake_scheduler import FakeScheduler, pool_datastore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

START_WITHIN_S = 20.0


@dataclass(frozen=True, slots=True)
class SimPodClient:
    """A running `epp sim` process and what a test asks it over HTTP (the pod model is elsewhere)."""

    address: str
    process: subprocess.Popen[bytes]

    def get_json(self, path: str) -> object:
        with urllib.request.urlopen(f"http://{self.address}{path}", timeout=5) as response:
            return json.loads(response.read())

    def models(self) -> set[str]:
        payload = self.get_json("/v1/models")
        assert isinstance(payload, dict)
        return {m["id"] for m in payload["data"]}

    def complete(self, model: str) -> tuple[int, dict[str, object]]:
        body = json.dumps({"model": model, "prompt": "hi", "max_tokens": 2}).encode()
        request = urllib.request.Request(
            f"http://{self.address}/v1/completions", data=body, headers={"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())


def _start(host: str, port: int, *extra: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "epp", "sim", "--host", host, "--port", str(port), *extra]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_healthy(pod: SimPodClient) -> None:
    deadline = time.monotonic() + START_WITHIN_S
    while time.monotonic() < deadline:
        if pod.process.poll() is not None:
            raise RuntimeError(f"sim at {pod.address} exited with {pod.process.returncode}")
        try:
            with urllib.request.urlopen(f"http://{pod.address}/health", timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sim at {pod.address} not healthy within {START_WITHIN_S}s")


# Each pod kind: the flags that make it behave so.
POD_FLAGS: dict[str, tuple[str, ...]] = {
    "a": ("--lora-modules", "static-one=/static", "--lora-load-latency", "0.05"),
    "b": ("--lora-load-latency", "0.05"),
    "strict": ("--check-lora-paths", "--lora-load-latency", "0.01"),
    "no-runtime": ("--allow-runtime-lora-updating=false",),
    "slow": ("--lora-load-latency", "3"),
}


@pytest.fixture(scope="module")
def pods() -> Iterator[dict[str, SimPodClient]]:
    hosts, port = pick_pod_addresses(len(POD_FLAGS), random.Random())
    started: dict[str, SimPodClient] = {}
    try:
        for host, (kind, flags) in zip(hosts, POD_FLAGS.items(), strict=True):
            started[kind] = SimPodClient(f"{host}:{port}", _start(host, port, "--pod-name", kind, *flags))
        for pod in started.values():
            _wait_healthy(pod)
        yield started
    finally:
        for pod in started.values():
            pod.process.terminate()
        for pod in started.values():
            try:
                pod.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pod.process.kill()
                pod.process.wait(timeout=5)


def loader_for(paths: dict[str, str], load_timeout_s: float = 30.0) -> AdapterLoader:
    catalog = Catalog(paths)
    return AdapterLoader(lambda: catalog, clock=SystemClock(), load_timeout_s=load_timeout_s)


async def test_first_request_for_an_unregistered_adapter_loads_it_on_the_chosen_pod(
    pods: dict[str, SimPodClient],
) -> None:
    loader = loader_for({"legal-assistant-v2": "/loras/legal"})
    try:
        assert "legal-assistant-v2" not in pods["a"].models()
        status, _ = pods["a"].complete("legal-assistant-v2")
        assert status == 404  # what a client would get without the loader
        result = await loader.ensure_loaded(pods["a"].address, "legal-assistant-v2")
        assert result is not None and result.loaded_now
        assert "legal-assistant-v2" in pods["a"].models()
        assert "legal-assistant-v2" not in pods["b"].models()  # only the chosen pod
        status, body = pods["a"].complete("legal-assistant-v2")
        assert (status, body["model"]) == (200, "legal-assistant-v2")
        again = await loader.ensure_loaded(pods["a"].address, "legal-assistant-v2")
        assert again is not None and not again.loaded_now
        assert loader.loads_started == 1
    finally:
        await loader.close()


async def test_concurrent_requests_for_one_adapter_trigger_one_load(pods: dict[str, SimPodClient]) -> None:
    loader = loader_for({"code-reviewer-xl": "/loras/code"})
    try:
        results = await asyncio.gather(
            *(loader.ensure_loaded(pods["b"].address, "code-reviewer-xl") for _ in range(20))
        )
        assert loader.loads_started == 1
        assert all(r == results[0] for r in results)
        assert results[0] is not None and results[0].loaded_now
        assert "code-reviewer-xl" in pods["b"].models()
    finally:
        await loader.close()


async def test_an_adapter_already_registered_is_not_loaded_again(pods: dict[str, SimPodClient]) -> None:
    loader = loader_for({"static-one": "/static"})
    try:
        result = await loader.ensure_loaded(pods["a"].address, "static-one")
        assert result is not None and not result.loaded_now
        assert loader.loads_started == 0
    finally:
        await loader.close()


async def test_an_adapter_outside_the_catalogue_is_left_alone(pods: dict[str, SimPodClient]) -> None:
    loader = loader_for({})
    try:
        assert await loader.ensure_loaded(pods["a"].address, "anything") is None
        assert not loader.manages("anything")
        assert "anything" not in pods["a"].models()
    finally:
        await loader.close()


async def test_a_failed_load_is_a_clear_503_and_breaks_nothing_else(
    pods: dict[str, SimPodClient], tmp_path: pathlib.Path
) -> None:
    good = tmp_path / "good-lora"
    good.mkdir()
    (good / "adapter_config.json").write_text("{}")
    loader = loader_for({"broken": str(tmp_path / "missing"), "fine": str(good)})
    strict = pods["strict"]
    try:
        with pytest.raises(EppError) as caught:
            await loader.ensure_loaded(strict.address, "broken")
        error = caught.value
        assert (error.http_status, error.reason) == (503, REASON_FAILED)
        assert "'broken'" in error.message and strict.address in error.message
        assert "No adapter found" in error.message  # the server's own reason, quoted
        assert "broken" not in strict.models()
        result = await loader.ensure_loaded(strict.address, "fine")  # the pod still loads others
        assert result is not None and result.loaded_now
        status, _ = strict.complete("fine")
        assert status == 200
        with pytest.raises(EppError):
            await loader.ensure_loaded(strict.address, "broken")  # failures are retried, not cached
        assert loader.loads_started == 3
    finally:
        await loader.close()


async def test_runtime_updates_disabled_is_explained(pods: dict[str, SimPodClient]) -> None:
    loader = loader_for({"x": "/x"})
    try:
        with pytest.raises(EppError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING"):
            await loader.ensure_loaded(pods["no-runtime"].address, "x")
    finally:
        await loader.close()


async def test_an_unreachable_pod_is_a_503() -> None:
    loader = loader_for({"x": "/x"})
    try:
        with pytest.raises(EppError) as caught:
            await loader.ensure_loaded(f"127.0.0.1:{free_port()}", "x")
        assert (caught.value.http_status, caught.value.reason) == (503, REASON_FAILED)
    finally:
        await loader.close()


async def test_a_slow_load_times_out_with_its_own_reason(pods: dict[str, SimPodClient]) -> None:
    loader = loader_for({"slow-one": "/slow"}, load_timeout_s=0.3)
    try:
        with pytest.raises(EppError) as caught:
            await loader.ensure_loaded(pods["slow"].address, "slow-one")
        assert (caught.value.http_status, caught.value.reason) == (503, REASON_TIMEOUT)
        assert not loader.is_loading(pods["slow"].address, "slow-one")
    finally:
        await loader.close()


async def test_a_waiter_that_goes_away_does_not_cancel_the_load_for_others(
    pods: dict[str, SimPodClient],
) -> None:
    loader = loader_for({"shared-load": "/shared"})
    try:
        leaving = asyncio.create_task(loader.ensure_loaded(pods["b"].address, "shared-load"))
        staying = asyncio.create_task(loader.ensure_loaded(pods["b"].address, "shared-load"))
        await asyncio.sleep(0.01)
        assert loader.is_loading(pods["b"].address, "shared-load")
        leaving.cancel()
        result = await staying
        assert result is not None and result.loaded_now
        assert loader.loads_started == 1
        assert "shared-load" in pods["b"].models()
    finally:
        await loader.close()


async def test_preload_all_loads_every_catalogue_adapter_on_every_pod(pods: dict[str, SimPodClient]) -> None:
    """`preloadStrategy: all` over HTTP: both pods get every adapter; what a pod had is not ours."""
    hosts = [pods[kind].address.rpartition(":")[0] for kind in ("a", "b")]
    port = int(pods["a"].address.rpartition(":")[2])
    clock = FakeClock()
    store = pool_datastore(hosts, target_ports=(port,), clock=clock)
    for state in store.snapshot().endpoints:
        store.update_metrics(state.name, Metrics(updated_at=clock.now()))
    catalog = Catalog({"pre-1": "/p1", "pre-2": "/p2", "static-one": "/static"}, "all")
    loader = AdapterLoader(lambda: catalog, clock=SystemClock(), load_timeout_s=30.0)
    preloader = Preloader(loader, store, clock, concurrency=2)
    try:
        async with asyncio.timeout(30), asyncio.TaskGroup() as group:
            assert preloader.start_due(group) == 2  # the concurrency limit
            for _ in range(3000):  # bounded: the timeout above ends it first
                if not (preloader.pending or preloader.start_due(group)):
                    break
                await asyncio.sleep(0.01)
        for kind in ("a", "b"):
            assert {"pre-1", "pre-2"} <= pods[kind].models()
        assert len(preloader.done()) == 6 and preloader.loads_failed == 0
        assert (pods["a"].address, "static-one") not in loader.owned()  # pod a had it at boot
        assert loader.owned()[(pods["b"].address, "static-one")] == "preload"
    finally:
        await loader.close()


async def test_unload_removes_the_adapter(pods: dict[str, SimPodClient]) -> None:
    loader = loader_for({"to-unload": "/u"})
    try:
        await loader.ensure_loaded(pods["b"].address, "to-unload")
        assert await loader.unload(pods["b"].address, "to-unload")
        assert "to-unload" not in pods["b"].models()
        assert not await loader.unload(pods["b"].address, "to-unload")
        result = await loader.ensure_loaded(pods["b"].address, "to-unload")  # loads again on demand
        assert result is not None and result.loaded_now
    finally:
        await loader.close()


def _held_stream(
    loader: AdapterLoader, director: Director
) -> tuple[StreamHandler, list[pb.ProcessingResponse] | Pending]:
    """A stream whose request, for a catalogue adapter, is dispatched and then held for its load."""
    clock = SystemClock()
    options = StreamOptions(director, clock, hold=functools.partial(hold_for_adapter, loader))
    handler = StreamHandler(options)
    assert handler.handle(_headers()) == []
    return handler, handler.handle(_body("held-adapter"))


def _headers() -> pb.ProcessingRequest:
    message = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=":method", raw_value=b"POST")])
        )
    )
    message.protocol_config.request_body_mode = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
    message.protocol_config.response_body_mode = processing_mode_pb2.ProcessingMode.NONE
    return message


def _body(model: str) -> pb.ProcessingRequest:
    body = json.dumps({"model": model, "prompt": "hi", "max_tokens": 2}).encode()
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))


async def test_a_routed_request_is_held_until_its_pod_has_the_adapter(pods: dict[str, SimPodClient]) -> None:
    """The director picks, `hold_for_adapter` loads on the pick, the reply then sends it to that pod."""
    hosts = [pods["b"].address.rpartition(":")[0], pods["a"].address.rpartition(":")[0]]
    port = int(pods["a"].address.rpartition(":")[2])
    model = InferenceModel(name="held", namespace="default", model_name="held-adapter", pool_name="pool")
    store = pool_datastore(hosts, target_ports=(port,), models=[model])
    scheduler = FakeScheduler(max_endpoints=2)
    director = Director(store, scheduler, clock=FakeClock())
    loader = loader_for({"held-adapter": "/loras/held"})
    try:
        handler, answer = _held_stream(loader, director)
        assert isinstance(answer, Pending)  # waits for the load before any reply
        replies = await handler.resume()
    finally:
        await loader.close()
    life = handler.life
    assert life is not None and life.decision is not None
    destination = replies[0].request_headers.response.header_mutation.set_headers[0].header.raw_value.decode()
    assert destination == life.decision.primary.address  # the fallback lacks the adapter: dropped
    primary = next(p for p in pods.values() if p.address == destination)
    status, reply = primary.complete("held-adapter")
    assert (status, reply["model"]) == (200, "held-adapter")
    assert scheduler.completed == []  # served: it is still in flight until its response ends


async def test_a_failed_hold_is_a_503_and_releases_the_request(pods: dict[str, SimPodClient]) -> None:
    host, _, port = pods["no-runtime"].address.rpartition(":")
    model = InferenceModel(name="m", namespace="default", model_name="never-loads", pool_name="pool")
    scheduler = FakeScheduler()
    director = Director(
        pool_datastore([host], target_ports=(int(port),), models=[model]), scheduler, clock=FakeClock()
    )
    loader = loader_for({"never-loads": "/x"})
    try:
        handler = StreamHandler(
            StreamOptions(director, SystemClock(), hold=functools.partial(hold_for_adapter, loader))
        )
        handler.handle(_headers())
        assert isinstance(handler.handle(_body("never-loads")), Pending)
        replies = await handler.resume()
    finally:
        await loader.close()
    assert replies[0].immediate_response.status.code == 503
    handler.close()
    life = handler.life
    assert life is not None and life.ending is Ending.REFUSED
    assert scheduler.completed == [(life.key, life.decision.primary.name if life.decision else "")]


async def test_a_client_that_leaves_during_the_hold_is_released(pods: dict[str, SimPodClient]) -> None:
    host, _, port = pods["slow"].address.rpartition(":")
    model = InferenceModel(name="m", namespace="default", model_name="slow-one", pool_name="pool")
    scheduler = FakeScheduler()
    director = Director(
        pool_datastore([host], target_ports=(int(port),), models=[model]), scheduler, clock=FakeClock()
    )
    loader = loader_for({"slow-one": "/slow"})
    try:
        handler = StreamHandler(
            StreamOptions(director, SystemClock(), hold=functools.partial(hold_for_adapter, loader))
        )
        handler.handle(_headers())
        assert isinstance(handler.handle(_body("slow-one")), Pending)
        life = handler.life
        assert life is not None and life.decision is not None
        primary = life.decision.primary
        held = asyncio.create_task(handler.resume())
        await eventually(lambda: loader.is_loading(primary.address, "slow-one"), "the load to start")
        assert scheduler.completed == []
        held.cancel()
        with pytest.raises(asyncio.CancelledError):
            await held
        handler.close()  # the server closes the stream of a client that left
    finally:
        await loader.close()
    assert life.ending is Ending.CLIENT_GONE and life.outcome.status == 499
    assert scheduler.completed == [(life.key, primary.name)]
