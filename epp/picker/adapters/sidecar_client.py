"""The EPP's side of the adapter-state sidecar: one watch stream per pod, re-dialled on loss.

`SidecarWatcher.run()` dials the pod's sidecar, calls `on_state(address, state)` for each
pushed `State` and, when the stream ends or fails (sidecar restart, pod churn), calls
`on_lost(address)` (the caller falls back to scraping) and re-dials after a capped,
doubling backoff. Every new stream begins with a full State, so nothing is missed across a
restart on either side. While a stream is up, `stub` is a client on the same connection
(for Load/Unload). HTTP/2 keepalive pings notice a peer that vanished without closing
(a node lost), so a dead stream does not pass for a quiet one. Cancelling `run()` closes
the channel.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc

from epp._proto import adapterstate_pb2 as pb
from epp._proto import adapterstate_pb2_grpc as pb_grpc
from epp.clock import Clock

log = logging.getLogger(__name__)

KEEPALIVE_TIME_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 5_000
CHANNEL_OPTIONS = (
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),  # a quiet stream is normal: keep pinging
    ("grpc.max_receive_message_length", 4 * 1024 * 1024),
)


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
        self.stub: pb_grpc.AdapterStateStub | None = None  # set while a stream delivers states

    @property
    def address(self) -> str:
        return self._address

    async def run(self) -> None:
        backoff_s = self._backoff_initial_s
        failures = 0
        while True:
            got_state = await self._watch_once(quiet=failures > 0)
            self._on_lost(self._address)
            if got_state:
                backoff_s = self._backoff_initial_s
                failures = 0
            else:
                failures += 1
            await self._clock.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, self._backoff_max_s)

    async def _watch_once(self, *, quiet: bool) -> bool:
        got_state = False
        async with grpc.aio.insecure_channel(self._address, options=CHANNEL_OPTIONS) as channel:
            stub = pb_grpc.AdapterStateStub(channel)
            try:
                self.streams_opened += 1
                async for state in stub.Watch(pb.WatchRequest()):
                    if not got_state:
                        got_state = True
                        self.stub = stub
                        log.info("sidecar stream up", extra={"address": self._address})
                    self._on_state(self._address, state)
            except grpc.aio.AioRpcError as error:
                # A pod without a sidecar refuses every dial: say so once, then only at debug.
                level = logging.DEBUG if quiet and not got_state else logging.INFO
                log.log(
                    level,
                    "sidecar stream ended",
                    extra={"address": self._address, "code": error.code().name},
                )
            finally:
                self.stub = None
        return got_state
