"""The EPP's side of the adapter-state sidecar: one watch stream per pod, re-dialled on loss.

`SidecarWatcher.run()` dials the pod's sidecar, calls `on_state(address, state)` for each
pushed `State` and, when the stream ends or fails (sidecar restart, pod churn), calls
`on_lost(address)` (the caller falls back to scraping) and re-dials after a capped,
doubling backoff. Every new stream begins with a full State, so nothing is missed across a
restart on either side. Cancelling `run()` closes the channel.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc

from epp._proto import adapterstate_pb2 as pb
from epp._proto import adapterstate_pb2_grpc as pb_grpc
from epp.clock import Clock

log = logging.getLogger(__name__)


class SidecarWatcher:
    def __init__(
        self,
        address: str,
        *,
        clock: Clock,
        on_state: Callable[[str, pb.State], None],
        on_lost: Callable[[str], None] = lambda _address: None,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 5.0,
    ) -> None:
        self._address = address
        self._clock = clock
        self._on_state = on_state
        self._on_lost = on_lost
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self.streams_opened = 0

    async def run(self) -> None:
        backoff_s = self._backoff_initial_s
        while True:
            got_state = await self._watch_once()
            self._on_lost(self._address)
            if got_state:
                backoff_s = self._backoff_initial_s
            await self._clock.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, self._backoff_max_s)

    async def _watch_once(self) -> bool:
        got_state = False
        async with grpc.aio.insecure_channel(self._address) as channel:
            stub = pb_grpc.AdapterStateStub(channel)
            try:
                self.streams_opened += 1
                async for state in stub.Watch(pb.WatchRequest()):
                    got_state = True
                    self._on_state(self._address, state)
            except grpc.aio.AioRpcError as error:
                log.info(
                    "sidecar stream ended",
                    extra={"address": self._address, "code": error.code().name},
                )
        return got_state
