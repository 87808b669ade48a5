"""The scheduler's LoRA residency model agrees with what a real vLLM reports.

The model is fed exactly what the EPP would feed it: `on_routed` for every request sent to the
real server, and real scrapes parsed by `epp.picker.scrape.parse`. At each step its view is compared
with the server's: slot count from `max_lora`, the adapters vLLM shows in flight, a third
adapter held back (`reason="deferred"`) while both slots are busy, and which adapters hold the
slots after the drain.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import time

from epp.picker.datastore.types import Endpoint, EndpointState, Metrics
from epp.picker.scheduling.inflight import InflightTracker
from epp.picker.scheduling.residency import ResidencyModel
from epp.picker.scrape.parse import parse_metrics
from testkit.waiting import poll_until
from tests.realvllm.client import RealPod, completion, idle, scrape

LONG_TOKENS = 300
# Long enough (≈ 1 s) that a scrape every 50 ms sees the deferred adapter while it runs.
DEFERRED_TOKENS = 60


class Observer:
    """Routes requests to one real pod and keeps a ResidencyModel in step with it."""

    def __init__(self, pod: RealPod) -> None:
        self.pod = pod
        self.endpoint = Endpoint(f"{pod.name}-rank-0", pod.name, "default", pod.host, pod.port)
        self.inflight = InflightTracker()
        self.model = ResidencyModel(self.inflight)
        self.metrics: Metrics | None = None
        self._ids = itertools.count()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=8)
        self._pending: dict[str, concurrent.futures.Future[object]] = {}

    @property
    def name(self) -> str:
        return self.endpoint.name

    def send(self, adapter: str, max_tokens: int) -> str:
        request_id = f"r{next(self._ids)}"
        self.model.on_routed(self.name, adapter)
        self.inflight.add(request_id, self.name, adapter, time.monotonic())
        self._pending[request_id] = self._pool.submit(completion, self.pod.url, adapter, max_tokens)
        return request_id

    def scrape(self) -> Metrics:
        """Retire finished requests, then fold one real scrape into the model."""
        for request_id, future in list(self._pending.items()):
            if future.done():
                assert future.result().status == 200  # type: ignore[attr-defined]
                self.inflight.remove(request_id)
                del self._pending[request_id]
        self.metrics = parse_metrics(scrape(self.pod), time.time(), previous=self.metrics)
        self.model.observe(EndpointState(endpoint=self.endpoint, metrics=self.metrics))
        return self.metrics

    def pending(self) -> int:
        return len(self._pending)

    def gpu(self) -> set[str]:
        pod = self.model.pod(self.name)
        assert pod is not None
        return set(pod.gpu)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def test_residency_model_tracks_real_slots(real_pods: list[RealPod]) -> None:
    pod = real_pods[0]
    assert poll_until(lambda: idle([pod]), within_s=60)
    observer = Observer(pod)
    try:
        for adapter in ("lora-0", "lora-0", "lora-1", "lora-1"):
            observer.send(adapter, LONG_TOKENS)
        assert poll_until(lambda: observer.scrape().running_requests == 4, within_s=30)
        state = observer.model.pod(observer.name)
        assert state is not None
        assert state.slots == 2  # learnt from the real max_lora, not the default
        assert observer.metrics is not None
        assert observer.metrics.active_adapters == {"lora-0", "lora-1"}
        assert observer.gpu() == {"lora-0", "lora-1"}

        # A third adapter while both slots are busy: vLLM defers it, the model evicts nothing.
        observer.send("lora-2", DEFERRED_TOKENS)
        assert poll_until(lambda: observer.scrape().deferred_requests == 1, within_s=30, interval_s=0.05)
        assert "lora-2" not in observer.metrics.active_adapters
        assert {"lora-0", "lora-1"} <= observer.gpu()
        assert observer.model.victim(observer.name, state) is None
        assert observer.name in observer.model.homes("lora-0")
        assert observer.name in observer.model.homes("lora-1")

        # vLLM gives lora-2 a slot once one adapter's requests finish; the model follows.
        assert poll_until(
            lambda: "lora-2" in observer.scrape().active_adapters, within_s=60, interval_s=0.05
        ), "lora-2 never ran"
        assert "lora-2" in observer.gpu()

        assert poll_until(
            lambda: (observer.scrape().running_requests, observer.pending()) == (0, 0), within_s=60
        )
        # Drained: as in vLLM, two adapters hold the two slots and lora-2, the last to run, is one.
        assert not observer.metrics.active_adapters
        assert len(observer.gpu()) == state.slots == 2
        assert "lora-2" in observer.gpu()
    finally:
        observer.close()
