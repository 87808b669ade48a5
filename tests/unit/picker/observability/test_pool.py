"""`/debug/pool.json` and `/debug/pool`, built from a real director (the `default` policy's
scheduler, flow control's slot gate, the observer's decision log) over a datastore of scraped pods."""

from __future__ import annotations

import base64
import collections
import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from epp.clock import FakeClock
from epp.picker.admission import build_admission
from epp.picker.datastore.types import Metrics, PodInfo
from epp.picker.director import Director
from epp.picker.flowcontrol import FlowControlSettings, build_flow_control
from epp.picker.flowcontrol.capacity import SlotGate
from epp.picker.lifecycle import Ending, KeyMint, RequestLife, Stage
from epp.picker.observability.decisions import DecisionLog
from epp.picker.observability.flow import flow_control_view
from epp.picker.observability.http import build_app, start_http
from epp.picker.observability.metrics import EppMetrics
from epp.picker.observability.observer import Observer
from epp.picker.observability.pool import POOL_VIEW_VERSION, pool_routes, pool_view
from epp.picker.scheduling.build import build_scheduler
from tests.support.fake_scheduler import pool_datastore, scrape_lora_slots

IPS_3 = ("10.0.0.1", "10.0.0.2", "10.0.0.3")


class Harness:
    """A director as `epp serve` builds it for the `default` policy, over pods scraped with
    `max_lora` slots each."""

    def __init__(self, pod_ips: Sequence[str] = IPS_3, *, max_lora: int = 2, flow: bool = True) -> None:
        self.clock = FakeClock()
        self.store = pool_datastore(pod_ips, clock=self.clock)
        self.max_lora = max_lora
        scrape_lora_slots(self.store, self.clock.now(), max_lora=max_lora)
        scheduler = build_scheduler(policy="default", seed=1)
        flow_control = build_flow_control(
            FlowControlSettings(enabled=flow), scheduler.state, build_admission().detector
        )
        self.decisions = DecisionLog(64)
        observer = Observer(EppMetrics(CollectorRegistry()), self.decisions, self.clock)
        self.director = Director(
            self.store, scheduler, flow=flow_control, clock=self.clock, observer=observer, keys=KeyMint("t")
        )

    def send(self, adapter: str) -> RequestLife:
        life = self.director.mint(f"req-{adapter}")
        life.waiter = lambda _: None
        self.director.arrive(life, headers={}, body=json.dumps({"model": adapter}).encode())
        return life

    def finish(self, life: RequestLife) -> None:
        life.finish(Ending.RESPONSE, self.clock.now())

    def view(self, **kwargs: int) -> Any:
        """The view as a client reads it: through JSON (which also proves it serialises as it is)."""
        return json.loads(
            json.dumps(pool_view(self.director, self.store, self.decisions, self.clock, **kwargs))
        )


def endpoints(view: Any) -> dict[str, Any]:
    return {endpoint["name"]: endpoint for pod in view["pods"] for endpoint in pod["endpoints"]}


def adapters(view: Any) -> dict[str, Any]:
    return {row["name"]: row for row in view["adapters"]}


def primary(life: RequestLife) -> str:
    """The endpoint `life` was sent to (it may have finished since)."""
    assert life.decision is not None, life.stage
    return life.decision.primary.name


def in_flight_by_endpoint(lives: Sequence[RequestLife]) -> dict[str, collections.Counter[str]]:
    """What each endpoint should show in flight: the adapters of the requests routed there."""
    expected: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for life in lives:
        assert life.request is not None
        expected[primary(life)][life.request.target_model] += 1
    return expected


def assert_in_flight(view: Any, lives: Sequence[RequestLife]) -> None:
    expected = in_flight_by_endpoint(lives)
    for name, row in endpoints(view).items():
        counts = expected.get(name, collections.Counter())
        assert row["in_flight"] == sum(counts.values())
        assert row["in_flight_by_adapter"] == dict(counts)
        shown = {entry["adapter"]: entry["in_flight"] for entry in row["gpu"]}
        for adapter, count in counts.items():
            assert shown[adapter] == count, (name, adapter)
    totals: collections.Counter[str] = collections.Counter()
    for counts in expected.values():
        totals.update(counts)
    for name, row in adapters(view).items():
        assert row["in_flight"] == totals[name]
        assert row["in_flight_by_endpoint"] == {
            endpoint: counts[name] for endpoint, counts in expected.items() if counts[name]
        }


def test_each_endpoint_shows_its_slots_adapters_and_requests_in_flight() -> None:
    harness = Harness()
    lives = [harness.send(adapter) for adapter in ("a1", "a2", "a1", "a3")]
    view = harness.view()
    assert view["version"] == POOL_VIEW_VERSION
    assert view["pool"] == {"name": "pool", "namespace": "default"}
    assert [pod["name"] for pod in view["pods"]] == ["pod-0", "pod-1", "pod-2"]
    assert [pod["ready"] for pod in view["pods"]] == [True, True, True]
    rows = endpoints(view)
    assert {row["address"] for row in rows.values()} == {f"{ip}:8000" for ip in IPS_3}
    assert {row["slots"] for row in rows.values()} == {harness.max_lora}
    assert all(row["fresh"] for row in rows.values())
    assert_in_flight(view, lives)
    for life in lives:  # every adapter sits in a GPU slot where it was sent
        assert life.request is not None
        assert primary(life) in adapters(view)[life.request.target_model]["gpu"]

    harness.finish(lives[0])
    assert_in_flight(harness.view(), lives[1:])


def test_a_pod_that_is_not_ready_is_listed_without_endpoints_and_other_pools_pods_are_not() -> None:
    harness = Harness()
    harness.store.upsert_pod(
        PodInfo(name="pod-9", namespace="default", ip="10.0.0.9", labels={"app": "vllm"}, ready=False)
    )
    harness.store.upsert_pod(PodInfo(name="other", namespace="default", ip="10.0.1.1", labels={"app": "x"}))
    pods = {pod["name"]: pod for pod in harness.view()["pods"]}
    assert set(pods) == {"pod-0", "pod-1", "pod-2", "pod-9"}
    assert pods["pod-9"]["ready"] is False and pods["pod-9"]["endpoints"] == []
    assert pods["pod-9"]["ip"] == "10.0.0.9"


def test_an_adapter_evicted_from_its_gpu_slot_shows_in_the_host_tier() -> None:
    harness = Harness(("10.0.0.1",), max_lora=1)
    first = harness.send("a1")
    harness.finish(first)
    second = harness.send("a2")  # the only slot: a1 leaves it for a2
    assert primary(second) == primary(first)
    view = harness.view()
    row = endpoints(view)[primary(first)]
    assert [entry["adapter"] for entry in row["gpu"]] == ["a2"]
    assert row["host"] == ["a1"]
    assert adapters(view)["a1"]["host"] == [primary(first)] and adapters(view)["a1"]["gpu"] == []
    assert adapters(view)["a2"]["gpu"] == [primary(first)]


def test_an_adapter_the_scrape_shows_running_sits_in_a_gpu_slot_before_any_request_of_ours() -> None:
    harness = Harness()
    name = "pod-1-rank-0"
    harness.store.update_metrics(
        name,
        Metrics(
            updated_at=harness.clock.now(),
            lora_enabled=True,
            max_lora=3,
            running_adapters=frozenset({"x"}),
            waiting_adapters=frozenset({"y"}),
            running_requests=4,
            waiting_requests=1,
            kv_cache_usage=0.25,
        ),
    )
    view = harness.view()
    row = endpoints(view)[name]
    assert row["slots"] == 3
    assert row["gpu"] == [
        {
            "adapter": "x",
            "in_flight": 0,
            "running": True,
            "waiting": False,
            "waiting_for_slot": False,
            "planned_home": False,
        }
    ]
    assert (row["running_adapters"], row["waiting_adapters"]) == (["x"], ["y"])
    assert (row["running_requests"], row["waiting_requests"], row["kv_cache_usage"]) == (4, 1, 0.25)
    assert adapters(view)["x"]["running_on"] == [name]
    assert adapters(view)["y"]["waiting_on"] == [name] and adapters(view)["y"]["gpu"] == []


def test_planned_homes_are_the_plans_and_marked_on_the_slots() -> None:
    harness = Harness()
    lives = [harness.send(adapter) for adapter in ("a1", "a2", "a3", "a4")]
    view = harness.view()
    logged = {entry.key: entry for entry in harness.decisions.recent()}
    for life in lives:
        assert life.request is not None
        adapter = life.request.target_model
        planned = list(logged[life.key].planned_homes)
        assert planned, "the default policy plans every adapter's homes"
        assert adapters(view)[adapter]["planned_homes"] == planned
        [entry] = [e for e in endpoints(view)[primary(life)]["gpu"] if e["adapter"] == adapter]
        assert entry["planned_home"] == (primary(life) in planned)


def test_requests_waiting_in_flow_control_show_in_the_queues() -> None:
    harness = Harness(("10.0.0.1",), max_lora=1)
    held = harness.send("a1")
    waiting = harness.send("a2")  # the one slot is held by a1's request in flight
    assert held.stage is Stage.DISPATCHED and waiting.stage is Stage.QUEUED
    harness.clock.advance(1.5)
    flow = harness.view()["flow_control"]
    assert flow["enabled"] is True and flow["queued"] == 1
    [band] = flow["bands"]
    assert band["requests"] == 1 and band["oldest_wait_s"] == 1.5
    [lane] = flow["lanes"]
    assert (lane["target_model"], lane["requests"]) == ("a2", 1)

    harness.finish(held)  # the slot frees: the waiting request goes, the queue empties
    assert primary(waiting) == primary(held)
    assert harness.view()["flow_control"]["queued"] == 0


def test_without_flow_control_the_view_says_so() -> None:
    harness = Harness(flow=False)
    harness.send("a1")
    assert harness.view()["flow_control"] == {"enabled": False}


@pytest.mark.parametrize("limit", [0, 2, 5], ids=["none", "two", "all"])
def test_the_newest_decisions_come_first_with_their_reasons(limit: int) -> None:
    harness = Harness()
    lives = [harness.send(adapter) for adapter in ("a1", "a2", "a1", "a3", "a2")]
    decisions = harness.view(decisions_limit=limit)["decisions"]
    assert [d["key"] for d in decisions] == [life.key for life in reversed(lives)][:limit]
    sent_to = {life.key: harness.store.snapshot().endpoint(primary(life)) for life in lives}
    logged = {entry.key: entry for entry in harness.decisions.recent()}
    for entry in decisions:
        assert entry["outcome"] == "routed" and entry["reason"]
        assert entry["candidates"] == len(logged[entry["key"]].candidates) and "scores" not in entry
        target = sent_to[entry["key"]]
        assert target is not None and entry["chosen"][0] == target.address
    assert harness.view()["decisions_capacity"] == 64


def test_building_the_view_changes_no_routing() -> None:
    """Two identical directors route the same requests; one is looked at after every request."""
    watched, unwatched = Harness(), Harness()
    sequence = ("a1", "a2", "a3", "a1", "a4", "a2", "a5", "a1")
    for adapter in sequence:
        first = watched.view()
        assert watched.view() == first
        assert primary(watched.send(adapter)) == primary(unwatched.send(adapter))
    assert watched.view()["pods"] == unwatched.view()["pods"]


def csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


async def test_the_routes_serve_the_view_and_a_self_contained_page() -> None:
    harness = Harness()
    harness.send("a1")
    routes = pool_routes(harness.director, harness.store, harness.decisions, harness.clock)
    runner, port = await start_http(
        build_app(CollectorRegistry(), extra_routes=routes), host="127.0.0.1", port=0
    )
    base = f"http://127.0.0.1:{port}/debug"
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/pool.json") as response:
                assert response.status == 200
                served = await response.json()
            assert served == harness.view()
            async with session.get(f"{base}/pool.json?decisions=0") as response:
                assert (await response.json())["decisions"] == []
            for bad in ("x", "-1", "65"):
                async with session.get(f"{base}/pool.json?decisions={bad}") as response:
                    assert response.status == 400, bad
                    assert "decisions must" in (await response.json())["error"]
            async with session.get(f"{base}/pool") as response:
                assert response.status == 200
                assert response.content_type == "text/html"
                policy = response.headers["Content-Security-Policy"]
                page = await response.text()
    finally:
        await runner.cleanup()
    [script] = re.findall(r"<script>(.*?)</script>", page, re.S)
    [style] = re.findall(r"<style>(.*?)</style>", page, re.S)
    # The browser runs the inline script and style only because the policy names their hashes.
    assert f"script-src {csp_hash(script)}" in policy and f"style-src {csp_hash(style)}" in policy
    assert "connect-src 'self'" in policy and "default-src 'none'" in policy
    assert not re.search(r"""(src|href)\s*=|https?://|@import|url\(""", page), "no external assets"
    assert "fetch(url" in script and '"pool.json"' in script


def test_reading_the_views_changes_nothing_the_gate_decides_by() -> None:
    """GET /debug/flow-control and /debug/pool.json only read: what the slot gate keeps (its rooms,
    the batch sizes it learned, the slots it remembers, its overload hold) is the same after them."""
    harness = Harness()
    scrape_lora_slots(harness.store, harness.clock.now(), max_lora=2, waiting=10, running=7)
    flow = harness.director.flow
    assert flow is not None
    gate = flow.gate
    assert isinstance(gate, SlotGate)

    def kept() -> tuple[object, ...]:
        return (
            dict(gate._batch_size),
            dict(gate._max_lora),
            set(gate._rooms),
            gate._valid_until,
            gate._tight_until,
            dict(gate.draining),
        )

    before = kept()
    view = flow_control_view(harness.director, harness.store, harness.clock)
    harness.view()
    assert kept() == before
    shown = view["endpoints"]
    assert isinstance(shown, list) and [endpoint["headroom"] for endpoint in shown] == [False, False, False]
    assert view["overload"] is None  # these settings turn the judge off
