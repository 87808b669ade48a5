"""The metrics refresher against real HTTP servers, one per pod on its own 127.0.0.N.

Pods share one port, as in Kubernetes. Healthy pods serve real vLLM captures; misbehaving
ones hang, answer 500, answer garbage or stream an endless body. The datastore is the real
one, fed pods as a source would.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import random
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from epp.clock import FakeClock, SystemClock
from epp.picker.datastore import Datastore, EndpointState, PodInfo, Pool
from epp.picker.scrape.parse import parse_metrics
from epp.picker.scrape.refresher import MetricsRefresher, ScrapePacing
from testkit.waiting import eventually

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0"
BUSY = (FIXTURES / "busy.txt").read_bytes()
NO_LORA = (FIXTURES / "no-lora.txt").read_bytes()
AFTER = (FIXTURES / "after.txt").read_bytes()
IDLE = (FIXTURES / "idle.txt").read_bytes()
INTERVAL_S = 0.05
POD_KEY = web.AppKey("pod", str)


@dataclass
class FakePod:
    """One model server's /metrics, with a chosen behaviour, and what it has been asked."""

    name: str
    ip: str
    behaviour: str  # "busy", "no-lora", "hang", "error", "garbage", "binary", "endless", "flaky", "then-idle"
    requests: int = 0
    accept_headers: list[str] = field(default_factory=list)
    failures_left: int = 3  # for "flaky": how many 500s before it recovers


class PodFarm:
    """Real aiohttp servers for a set of fake pods, all on one port."""

    def __init__(self) -> None:
        self.port = 0
        self.pods: dict[str, FakePod] = {}
        self.release = asyncio.Event()  # set at teardown so hung handlers return
        self._runners: list[web.AppRunner] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        pod = self.pods[request.app[POD_KEY]]
        pod.requests += 1
        pod.accept_headers.append(request.headers.get("Accept", ""))
        content_type = "text/plain; version=0.0.4; charset=utf-8"
        if pod.behaviour == "busy":
            return web.Response(body=BUSY, headers={"Content-Type": content_type})
        if pod.behaviour == "no-lora":
            return web.Response(body=NO_LORA, headers={"Content-Type": content_type})
        if pod.behaviour == "hang":
            await self.release.wait()
            return web.Response(status=503)
        if pod.behaviour == "error":
            return web.Response(status=500, text="Internal Server Error")
        if pod.behaviour == "garbage":
            return web.Response(text="<html><body>not metrics</body></html>", content_type="text/html")
        if pod.behaviour == "then-idle":
            # The first page shows max_lora; later ones are a fresh server's (no LoRA sample yet).
            return web.Response(
                body=AFTER if pod.requests == 1 else IDLE, headers={"Content-Type": content_type}
            )
        if pod.behaviour == "binary":
            return web.Response(body=b"\xff\xfe\x00garbage", content_type="application/octet-stream")
        if pod.behaviour == "endless":
            # Chunked, no Content-Length: only a cap on what is read stops the client.
            response = web.StreamResponse(headers={"Content-Type": content_type})
            await response.prepare(request)
            chunk = b"# filler line\n" * 4096
            with contextlib.suppress(ConnectionError):
                while not self.release.is_set():
                    await response.write(chunk)
            return response
        if pod.behaviour == "flaky":
            if pod.failures_left > 0:
                pod.failures_left -= 1
                return web.Response(status=500)
            return web.Response(body=BUSY, headers={"Content-Type": content_type})
        raise AssertionError(pod.behaviour)

    async def start(self, pods: list[FakePod]) -> None:
        self.port = free_port(pods[0].ip)
        for pod in pods:
            self.pods[pod.name] = pod
            app = web.Application()
            app[POD_KEY] = pod.name
            app.router.add_get("/metrics", self.handle)
            runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
            await runner.setup()
            await web.TCPSite(runner, pod.ip, self.port).start()
            self._runners.append(runner)

    async def stop(self) -> None:
        self.release.set()
        for runner in self._runners:
            await runner.cleanup()


def free_port(ip: str) -> int:
    with socket.socket() as probe:
        probe.bind((ip, 0))
        return int(probe.getsockname()[1])


@pytest.fixture
async def farm() -> AsyncIterator[PodFarm]:
    pod_farm = PodFarm()
    yield pod_farm
    await pod_farm.stop()


async def start_farm(farm: PodFarm, behaviours: dict[str, str]) -> Datastore:
    """Serve one pod per behaviour on 127.0.0.2, .3, …; return a datastore holding them."""
    pods = [
        FakePod(name, f"127.0.0.{i}", behaviour) for i, (name, behaviour) in enumerate(behaviours.items(), 2)
    ]
    for attempt in range(5):
        try:
            await farm.start(pods)
            break
        except OSError as err:  # another process took the probed port: try another
            if err.errno != errno.EADDRINUSE or attempt == 4:
                raise
            await farm.stop()
            farm.release = asyncio.Event()
    datastore = Datastore(SystemClock())
    datastore.set_pool(Pool(name="pool", namespace="ns", selector={"app": "vllm"}, target_ports=(farm.port,)))
    for pod in pods:
        datastore.upsert_pod(PodInfo(name=pod.name, namespace="ns", ip=pod.ip, labels={"app": "vllm"}))
    return datastore


@contextlib.asynccontextmanager
async def running(refresher: MetricsRefresher) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(refresher.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def state(datastore: Datastore, pod: str) -> EndpointState:
    found = datastore.snapshot().endpoint(f"{pod}-rank-0")
    assert found is not None, pod
    return found


def refresher_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("metrics-refresh:")]


async def test_metrics_arrive_and_failures_are_recorded(farm: PodFarm) -> None:
    datastore = await start_farm(
        farm,
        {
            "busy": "busy",
            "plain": "no-lora",
            "hung": "hang",
            "error": "error",
            "garbage": "garbage",
            "huge": "endless",
            "binary": "binary",
        },
    )
    refresher = MetricsRefresher(datastore, SystemClock(), ScrapePacing(interval_s=INTERVAL_S, timeout_s=1.0))
    async with running(refresher):
        failing = ("hung", "error", "garbage", "huge", "binary")
        await eventually(
            lambda: (
                state(datastore, "busy").metrics is not None
                and state(datastore, "plain").metrics is not None
                and all(state(datastore, pod).scrape_failures > 0 for pod in failing)
            ),
            "healthy pods scraped and every failing pod recorded",
        )
        busy = state(datastore, "busy").metrics
        assert busy is not None
        expected = parse_metrics(BUSY.decode(), busy.updated_at)
        assert busy == expected
        assert (busy.running_requests, busy.waiting_requests) == (8, 10)
        assert busy.active_adapters == {"lora-0", "lora-1"}
        plain = state(datastore, "plain").metrics
        assert plain is not None and not plain.lora_enabled and plain.served_model_name == "tiny-a"

        errors = {pod: state(datastore, pod).last_error for pod in failing}
        assert "within 1 s" in errors["hung"]
        assert "HTTP 500" in errors["error"]
        assert "no vllm:num_requests_waiting sample" in errors["garbage"]
        assert "exceeds the 4194304-byte limit" in errors["huge"]
        assert "body is not UTF-8" in errors["binary"]
        now = SystemClock().now()
        for pod in failing:
            assert state(datastore, pod).metrics is None
            assert not state(datastore, pod).is_fresh(now, staleness_threshold_s=10.0)
        assert state(datastore, "busy").is_fresh(now, staleness_threshold_s=10.0)

        stats = refresher.stats()
        assert stats["busy-rank-0"].scrapes_ok >= 1 and stats["busy-rank-0"].scrapes_failed == 0
        assert stats["busy-rank-0"].last_body_bytes == len(BUSY)
        assert stats["error-rank-0"].scrapes_failed >= 1 and stats["error-rank-0"].scrapes_ok == 0
        assert stats["busy-rank-0"].url == f"http://127.0.0.2:{farm.port}/metrics"
    # The classic text format is what the parser reads; we ask for it explicitly.
    assert farm.pods["busy"].accept_headers[0].startswith("text/plain;version=0.0.4")


async def test_a_hung_endpoint_does_not_delay_the_others(farm: PodFarm) -> None:
    datastore = await start_farm(farm, {"hung": "hang", "busy": "busy", "plain": "no-lora"})
    # The hung fetch's deadline is far beyond the test: it stays in flight throughout.
    refresher = MetricsRefresher(
        datastore, SystemClock(), ScrapePacing(interval_s=INTERVAL_S, timeout_s=60.0)
    )
    async with running(refresher):
        await eventually(lambda: farm.pods["hung"].requests == 1, "the hung pod received its request")
        await eventually(
            lambda: all(refresher.stats()[f"{pod}-rank-0"].scrapes_ok >= 5 for pod in ("busy", "plain")),
            "healthy pods scraped repeatedly while another hangs",
        )
        hung = refresher.stats()["hung-rank-0"]
        assert (hung.scrapes_ok, hung.scrapes_failed) == (0, 0)
        assert farm.pods["hung"].requests == 1


async def test_removed_endpoint_is_no_longer_scraped(farm: PodFarm) -> None:
    datastore = await start_farm(farm, {"gone": "busy", "kept": "busy"})
    refresher = MetricsRefresher(datastore, SystemClock(), ScrapePacing(interval_s=INTERVAL_S))
    async with running(refresher):
        await eventually(lambda: farm.pods["gone"].requests >= 2, "the pod is being scraped")
        datastore.delete_pod("ns", "gone")
        assert "gone-rank-0" not in refresher.stats()
        await asyncio.sleep(0)  # let the cancelled task unwind
        assert {t.get_name() for t in refresher_tasks()} == {"metrics-refresh:kept-rank-0"}
        requests_after_removal = farm.pods["gone"].requests
        kept_before = farm.pods["kept"].requests
        await eventually(
            lambda: farm.pods["kept"].requests >= kept_before + 5, "the other pod keeps being scraped"
        )
        assert farm.pods["gone"].requests == requests_after_removal


async def test_readdressed_endpoint_is_scraped_at_its_new_address(farm: PodFarm) -> None:
    datastore = await start_farm(farm, {"moving": "busy", "target": "no-lora"})
    refresher = MetricsRefresher(datastore, SystemClock(), ScrapePacing(interval_s=INTERVAL_S))
    async with running(refresher):
        await eventually(lambda: state(datastore, "moving").metrics is not None, "first address scraped")
        # The pod is recreated under the same name with the other server's IP.
        datastore.upsert_pod(PodInfo(name="moving", namespace="ns", ip="127.0.0.3", labels={"app": "vllm"}))
        assert refresher.stats()["moving-rank-0"].url == f"http://127.0.0.3:{farm.port}/metrics"
        await eventually(
            lambda: (m := state(datastore, "moving").metrics) is not None and not m.lora_enabled,
            "metrics from the new address",
        )


async def test_each_scrape_builds_on_the_previous_one(farm: PodFarm) -> None:
    datastore = await start_farm(farm, {"pod": "then-idle"})
    refresher = MetricsRefresher(datastore, SystemClock(), ScrapePacing(interval_s=INTERVAL_S))
    async with running(refresher):
        await eventually(lambda: farm.pods["pod"].requests >= 3, "several scrapes")
        await eventually(lambda: refresher.stats()["pod-rank-0"].scrapes_ok >= 3, "several scrapes parsed")
        metrics = state(datastore, "pod").metrics
        assert metrics is not None
        assert metrics.lora_enabled and not metrics.active_adapters
        assert metrics.max_lora == 2  # from the first page; the later ones do not say


async def test_recovery_is_logged_once_each_way(farm: PodFarm, caplog: pytest.LogCaptureFixture) -> None:
    datastore = await start_farm(farm, {"flaky": "flaky"})
    refresher = MetricsRefresher(datastore, SystemClock(), ScrapePacing(interval_s=INTERVAL_S))
    with caplog.at_level(logging.INFO, logger="epp.picker.scrape.refresher"):
        async with running(refresher):
            await eventually(lambda: state(datastore, "flaky").metrics is not None, "recovered pod scraped")
            await eventually(
                lambda: refresher.stats()["flaky-rank-0"].scrapes_ok >= 3, "several good scrapes"
            )
    stats = refresher.stats()  # empty once stopped
    assert stats == {}
    messages = [
        (r.levelname, r.getMessage()) for r in caplog.records if r.name == "epp.picker.scrape.refresher"
    ]
    assert messages == [("WARNING", "endpoint metrics unavailable"), ("INFO", "endpoint metrics recovered")]
    recovered = next(r for r in caplog.records if r.getMessage() == "endpoint metrics recovered")
    assert recovered.__dict__["failed_scrapes"] == 3
    assert state(datastore, "flaky").scrape_failures == 0


async def test_cancel_leaves_no_task_behind(farm: PodFarm) -> None:
    datastore = await start_farm(farm, {"a": "busy", "b": "hang", "c": "endless"})
    refresher = MetricsRefresher(
        datastore, SystemClock(), ScrapePacing(interval_s=INTERVAL_S, timeout_s=60.0)
    )
    task = asyncio.create_task(refresher.run())
    await eventually(lambda: len(refresher_tasks()) == 3 and farm.pods["b"].requests == 1, "all pods scraped")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert refresher_tasks() == []
    assert refresher.stats() == {}
    # Endpoint changes after the refresher stopped start nothing.
    datastore.delete_pod("ns", "a")
    assert refresher_tasks() == []


async def test_run_twice_at_once_is_refused(farm: PodFarm) -> None:
    datastore = await start_farm(farm, {"a": "busy"})
    refresher = MetricsRefresher(datastore, SystemClock(), ScrapePacing(interval_s=INTERVAL_S))
    async with running(refresher):
        await eventually(lambda: "a-rank-0" in refresher.stats(), "first run started")
        with pytest.raises(RuntimeError, match="already running"):
            await refresher.run()


class RecordingClock(FakeClock):
    """Fake time that records each sleep and parks the caller after `limit` of them."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.sleeps_s: list[float] = []
        self.limit = limit
        self.parked = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        self.sleeps_s.append(seconds)
        if len(self.sleeps_s) >= self.limit:
            self.parked.set()
            await asyncio.Event().wait()
        await super().sleep(seconds)


@pytest.mark.parametrize(
    ("behaviour", "expected_sleeps_s"),
    [
        # Failures: interval × 2^(n-1), jittered into [½, 1] of that, never under the interval, capped at 1 s.
        ("error", [(0.1, 0.1), (0.1, 0.2), (0.1, 0.4), (0.4, 0.8), (0.5, 1.0), (0.5, 1.0)]),
        # Successes: the interval (plus, once, a random phase below one interval).
        ("busy", [(0.1, 0.2), (0.1, 0.1), (0.1, 0.1), (0.1, 0.1)]),
    ],
    ids=["failures-back-off", "successes-keep-the-interval"],
)
async def test_scrape_schedule(
    farm: PodFarm, behaviour: str, expected_sleeps_s: list[tuple[float, float]]
) -> None:
    datastore = await start_farm(farm, {"pod": behaviour})
    clock = RecordingClock(limit=len(expected_sleeps_s))
    refresher = MetricsRefresher(
        datastore, clock, ScrapePacing(interval_s=0.1, backoff_cap_s=1.0), rng=random.Random(3)
    )
    async with running(refresher):
        await asyncio.wait_for(clock.parked.wait(), 15.0)
    assert len(clock.sleeps_s) == len(expected_sleeps_s)
    for slept_s, (low_s, high_s) in zip(clock.sleeps_s, expected_sleeps_s, strict=True):
        assert low_s - 1e-9 <= slept_s <= high_s + 1e-9, clock.sleeps_s
