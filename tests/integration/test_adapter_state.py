"""Sidecar push state, preload-all and cold-adapter unloading, end to end: real `epp sim` pods,
an `epp sidecar` next to each, `epp serve --adapter-state-port`, and Envoy in front.

What a user sees: the EPP knows what each pod has registered from its sidecar and loads
nothing for it; when sidecars die it routes on scraped metrics alone and loads over HTTP;
after an EPP restart every sidecar gets a new stream and the EPP has the state again;
`preloadStrategy: all` puts every adapter on every pod, `planned` an adapter on the pods the
placement plan gives it; an adapter loaded on demand and left
cold is unloaded while static ones stay; junk on the sidecar port never stops routing.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp._proto import adapterstate_pb2 as pb
from epp._proto import adapterstate_pb2_grpc as pb_grpc
from epp.tools.localstack import LocalStack, SimOptions, StackOptions
from testkit import faults
from testkit.waiting import wait_until
from tests.integration.conftest import _started, completion
from tests.support.epp_metrics import epp_metric

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def debug_adapters(stack: LocalStack) -> dict[str, object]:
    url = f"http://127.0.0.1:{stack.epp_metrics_port}/debug/adapters"
    with urllib.request.urlopen(url, timeout=5) as response:
        payload: dict[str, object] = json.loads(response.read())
    return payload


def pushed(stack: LocalStack) -> dict[str, set[str]]:
    """Endpoint address -> adapters its sidecar reports registered, for endpoints on push state."""
    entries = debug_adapters(stack)["pushed"]
    assert isinstance(entries, list)
    return {e["endpoint"]: set(e["registered"]) for e in entries}


def epp_counter(stack: LocalStack, family: str, **labels: str) -> float:
    url = f"http://127.0.0.1:{stack.epp_metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    total = 0.0
    for metrics in text_string_to_metric_families(text):
        for sample in metrics.samples:
            if sample.name == f"{family}_total" and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def registered_on(stack: LocalStack, pod_name: str) -> set[str]:
    pod = next(p for p in stack.pods if p.name == pod_name)
    with urllib.request.urlopen(f"{pod.url}/v1/models", timeout=5) as response:
        payload = json.loads(response.read())
    return {m["id"] for m in payload["data"] if m.get("parent")}


def sidecar_load(stack: LocalStack, pod_name: str, adapter: str) -> None:
    """Register `adapter` on a pod through its sidecar, behind the EPP's back."""
    pod = next(p for p in stack.pods if p.name == pod_name)
    with grpc.insecure_channel(f"{pod.ip}:{stack.sidecar_port}") as channel:
        stub = pb_grpc.AdapterStateStub(channel)
        stub.Load(pb.LoadRequest(adapter=adapter, path=f"/{adapter}"), timeout=10)


def catalogue(directory: Path, strategy: str, names: tuple[str, ...]) -> Path:
    path = directory / "adapters.yaml"
    entries = "".join(f"- {{name: {n}, path: /loras/{n}}}\n" for n in names)
    path.write_text(f"preloadStrategy: {strategy}\nadapters:\n{entries}")
    return path


def stack_options(catalog: Path, *, pods: int, max_loras: int = 2, **serve: str) -> StackOptions:
    extra = ("--adapter-catalog", str(catalog), *(x for k, v in serve.items() for x in (f"--{k}", v)))
    return StackOptions(
        pods=pods,
        sim=SimOptions(adapters=("static-one",), max_loras=max_loras, lora_load_latency_s=0.05),
        sidecars=True,
        extra_serve_args=extra,
    )


@pytest.fixture(scope="module")
def push_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    catalog = catalogue(tmp_path_factory.mktemp("push"), "demand", ("pushed-one", "fresh-one"))
    yield from _started(stack_options(catalog, pods=2))


def test_what_a_sidecar_reports_registered_is_used_and_not_loaded_again(push_stack: LocalStack) -> None:
    addresses = {p.address for p in push_stack.pods}
    wait_until(lambda: set(pushed(push_stack)) == addresses, "every pod on push state")
    for pod in push_stack.pods:
        sidecar_load(push_stack, pod.name, "pushed-one")
    wait_until(
        lambda: all("pushed-one" in held for held in pushed(push_stack).values()),
        "the EPP sees the adapter from the sidecars' pushes",
    )
    loads_before = epp_counter(push_stack, "inference_extension_adapter_loads")
    reply = completion(push_stack, "pushed-one")
    assert reply.status == 200, reply.body
    assert epp_counter(push_stack, "inference_extension_adapter_loads") == loads_before
    assert epp_counter(push_stack, "inference_extension_adapter_push_registered_hits") >= 1


def test_a_load_goes_through_the_sidecar_while_its_stream_is_up(push_stack: LocalStack) -> None:
    reply = completion(push_stack, "fresh-one")
    assert reply.status == 200, reply.body
    assert "fresh-one" in registered_on(push_stack, reply.pod)
    assert epp_counter(push_stack, "inference_extension_adapter_loads", via="sidecar") >= 1


@pytest.fixture
def broken_sidecars(tmp_path: Path) -> Iterator[LocalStack]:
    catalog = catalogue(tmp_path, "demand", ("after-fallback",))
    yield from _started(stack_options(catalog, pods=2))


def test_without_sidecars_the_epp_scrapes_loads_over_http_and_survives_junk(
    broken_sidecars: LocalStack,
) -> None:
    stack = broken_sidecars
    wait_until(lambda: len(pushed(stack)) == 2, "every pod on push state")
    for pod in stack.pods:
        faults.kill_sidecar(stack, pod.name)
    wait_until(lambda: pushed(stack) == {}, "every pod back on scraping")
    reply = completion(stack, "after-fallback")
    assert reply.status == 200, reply.body
    assert epp_counter(stack, "inference_extension_adapter_loads", via="http") == 1
    # Something that is not a sidecar takes one pod's sidecar port: it answers every dial with junk.
    junk_pod = stack.pods[0]
    with junk_server(junk_pod.ip, stack.sidecar_port) as answered:
        wait_until(lambda: answered() >= 2, "the EPP re-dials the junk port")
        replies = [completion(stack, "base") for _ in range(6)]
        assert [r.status for r in replies] == [200] * 6
        assert pushed(stack) == {}
    stack.start_sidecar(stack.pods[1].name)
    wait_until(lambda: set(pushed(stack)) == {stack.pods[1].address}, "a restarted sidecar is used again")


@contextlib.contextmanager
def junk_server(host: str, port: int) -> Iterator[Callable[[], int]]:
    """A TCP listener that answers every connection with bytes no gRPC client can read;
    yields a function giving how many connections it has answered."""
    answered = [0]
    stopped = threading.Event()
    with socket.create_server((host, port)) as sock:
        sock.settimeout(0.2)

        def serve() -> None:
            while not stopped.is_set():
                try:
                    conn, _ = sock.accept()
                except TimeoutError:
                    continue
                with conn:
                    answered[0] += 1
                    conn.sendall(b"HTTP/1.1 418 I'm a teapot\r\n\r\n\x00\xff garbage \xff\x00" * 4)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            yield lambda: answered[0]
        finally:
            stopped.set()
            thread.join(timeout=5)


@pytest.fixture(scope="module")
def one_slot_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    catalog = catalogue(tmp_path_factory.mktemp("idle"), "demand", ("cold-a", "warm-b", "static-one"))
    options = stack_options(catalog, pods=1, max_loras=1, **{"adapter-idle-unload": "1s"})
    yield from _started(options)


def test_a_cold_on_demand_adapter_is_unloaded_and_a_static_one_stays(one_slot_stack: LocalStack) -> None:
    stack = one_slot_stack
    pod = stack.pods[0].name
    for model in ("static-one", "cold-a", "warm-b"):  # warm-b takes cold-a's only GPU slot
        reply = completion(stack, model)
        assert reply.status == 200, reply.body
        # Let a scrape show the adapter idle again, so the next one evicts it rather than
        # waiting for a slot (the residency model keeps an adapter that looks active).
        time.sleep(0.3)
    # Both on-demand adapters were loaded (static-one the pod had already). Whether cold-a is
    # still registered by now depends on how long the requests took: its idle second may be over.
    assert epp_counter(stack, "inference_extension_adapter_loads") == 2
    wait_until(lambda: "cold-a" not in registered_on(stack, pod), "the cold adapter unloaded")
    # Not a wait for something to happen: 1.5 s of unloader ticks in which nothing else may go.
    time.sleep(1.5)
    assert {"warm-b", "static-one"} <= registered_on(stack, pod)
    assert epp_counter(stack, "inference_extension_adapter_unloads", reason="idle") == 1
    assert completion(stack, "cold-a").status == 200  # asked for again: loaded again


def test_sidecar_streams_reconnect_after_an_epp_restart(one_slot_stack: LocalStack) -> None:
    stack = one_slot_stack
    pod = stack.pods[0]
    wait_until(lambda: pod.address in pushed(stack), "the pod on push state")
    faults.restart_epp(stack)
    wait_until(
        lambda: "static-one" in pushed(stack).get(pod.address, set()),
        "the restarted EPP has the pod's state again",
    )
    opened = faults.sidecar_log(stack, pod.name).count("watch stream opened")
    assert opened >= 2, faults.sidecar_log(stack, pod.name)


@pytest.fixture(scope="module")
def preload_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    catalog = catalogue(tmp_path_factory.mktemp("all"), "all", ("all-1", "all-2", "all-3"))
    yield from _started(stack_options(catalog, pods=2))


def test_preload_all_puts_every_adapter_on_every_pod(preload_stack: LocalStack) -> None:
    stack = preload_stack
    wanted = {"all-1", "all-2", "all-3"}
    wait_until(
        lambda: all(wanted <= registered_on(stack, p.name) for p in stack.pods), "every adapter on every pod"
    )
    # One load per adapter per pod: through the sidecar once its stream is up, over HTTP before.
    assert epp_counter(stack, "inference_extension_adapter_loads") == 6
    for adapter in sorted(wanted):
        assert completion(stack, adapter).status == 200


@pytest.fixture(scope="module")
def planned_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    catalog = catalogue(tmp_path_factory.mktemp("planned"), "planned", ("plan-1", "plan-2"))
    yield from _started(stack_options(catalog, pods=3))


def test_preload_planned_puts_an_adapter_on_its_planned_homes_ahead_of_requests(
    planned_stack: LocalStack,
) -> None:
    """Two requests for plan-1, one after the other: the second is planned with all traffic so
    far on plan-1, so the plan gives it all three pods. Two requests reach two pods at most; the
    rest get plan-1 from the preloader. plan-2, never asked for, goes nowhere."""
    stack = planned_stack
    assert completion(stack, "plan-1").status == 200
    assert completion(stack, "plan-1").status == 200
    wait_until(
        lambda: all("plan-1" in registered_on(stack, p.name) for p in stack.pods), "plan-1 on every pod"
    )

    def owned(origin: str) -> float:
        return epp_metric(stack, "inference_extension_adapter_owned", origin=origin)

    # A pod lists the adapter as its load answers; the EPP counts it as its own once it reads that
    # answer, a moment later.
    wait_until(lambda: owned("preload") + owned("demand") == 3, "three loads owned")
    assert owned("preload") >= 1
    assert not any("plan-2" in registered_on(stack, p.name) for p in stack.pods)
