"""Runs the pure Engine in real (or fake) time and hands each request its tokens."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence

from epp.clock import Clock
from epp.tools.sim.engine import Engine, FinishedRequest, TokenEvent
from epp.tools.sim.metrics import SimMetrics

log = logging.getLogger(__name__)


class EngineDriver:
    """Alternates plan_step → sleep(duration) → finish_step while there is work; idles otherwise."""

    def __init__(self, engine: Engine, metrics: SimMetrics, clock: Clock) -> None:
        self.engine = engine
        self.metrics = metrics
        self.clock = clock
        self._streams: dict[str, asyncio.Queue[TokenEvent]] = {}
        self._wake = asyncio.Event()
        self._ids = itertools.count(1)

    def submit(
        self, adapter: str | None, prompt: Sequence[str], max_tokens: int
    ) -> tuple[str, asyncio.Queue[TokenEvent]]:
        """Queue a request; its tokens arrive on the returned queue. Raises ValueError if it can never fit."""
        request_id = f"sim-{next(self._ids)}"
        self.engine.submit(request_id, adapter, prompt, max_tokens, self.clock.now())
        queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self._streams[request_id] = queue
        self.metrics.observe_stats(self.engine.stats)
        self._wake.set()
        return request_id, queue

    def release(self, request_id: str) -> None:
        """The caller is done with a request: abort it if it is still in the engine."""
        self._streams.pop(request_id, None)
        finished: FinishedRequest | None = self.engine.abort(request_id, self.clock.now())
        if finished is not None:
            self.metrics.observe_finished(finished)
            self.metrics.observe_stats(self.engine.stats)

    async def run(self) -> None:
        while True:
            if not self.engine.has_work():
                self._wake.clear()
                await self._wake.wait()
                continue
            plan = self.engine.plan_step(self.clock.now())
            self.metrics.observe_plan(plan)
            self.metrics.observe_step_stats(self.engine.stats)
            if plan.duration_s > 0:
                await self.clock.sleep(plan.duration_s)
            else:
                await asyncio.sleep(0)
            outcome = self.engine.finish_step(self.clock.now())
            self.metrics.observe_outcome(outcome)
            self.metrics.observe_step_stats(self.engine.stats)
            for token in outcome.tokens:
                queue = self._streams.get(token.request_id)
                if queue is not None:
                    queue.put_nowait(token)
