"""Sidecar push state in `epp serve` (`--adapter-state-port`): one watch stream per pod.

`AdapterStatePush` follows the datastore's endpoint set: for every pod it dials the
adapter-state sidecar at `<podIP>:<port>` (a `SidecarWatcher`), and stops when the pod
leaves. Each pushed `State` becomes an `AdapterState` on the endpoint it describes
(`datastore.set_adapter_state`), which the datastore merges over the scraped metrics; when
the stream is lost the endpoint falls back to the plain scrape at once. The loader asks
`state(address)` for what a pod has registered (no `GET /v1/models` round trip) and runs
loads and unloads through the sidecar while its stream is up.

A pod without a sidecar, or something else on the port, only costs its own re-dials (capped
backoff): routing never waits on a sidecar, and a State that is not plausible is dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import grpc

from epp._proto import adapterstate_pb2 as pb
from epp._proto import adapterstate_pb2_grpc as pb_grpc
from epp.clock import Clock
from epp.picker.adapters.loader import SidecarCallError
from epp.picker.adapters.sidecar_client import SidecarWatcher
from epp.picker.datastore.store import Datastore
from epp.picker.datastore.types import AdapterState, Endpoint, format_address

log = logging.getLogger(__name__)

MAX_ADAPTERS_PER_STATE = 10_000  # more names than any model server registers: not a real State
MAX_SLOTS = 4096
# Codes that mean "the sidecar is not there now": the caller falls back to HTTP.
_UNREACHABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})


@dataclass(slots=True)
class _Link:
    """One pod's sidecar: its watcher task and the endpoints its States apply to."""

    watcher: SidecarWatcher
    endpoints: tuple[Endpoint, ...]
    task: asyncio.Task[None] | None = None
    applied_to: set[str] = field(default_factory=set)  # endpoint names carrying its state now
    unmatched_logged: bool = False


class AdapterStatePush:
    """Watches every pod's adapter-state sidecar and keeps the datastore's push state current."""

    def __init__(
        self,
        datastore: Datastore,
        clock: Clock,
        *,
        port: int,
        call_timeout_s: float = 120.0,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 5.0,
    ) -> None:
        if not 0 < port < 65536:
            raise ValueError(f"adapter-state port must be in 1..65535, got {port}")
        self._datastore = datastore
        self._clock = clock
        self._port = port
        self._call_timeout_s = call_timeout_s
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._group: asyncio.TaskGroup | None = None
        self._links: dict[str, _Link] = {}  # sidecar address -> link
        self._states: dict[str, AdapterState] = {}  # endpoint address -> pushed state
        self._link_of: dict[str, _Link] = {}  # endpoint address -> the link that pushes it
        self.states_received = 0
        self.states_dropped = 0
        datastore.on_endpoints_changed(self._sync)

    # -- for the loader --------------------------------------------------------------------

    def state(self, address: str) -> AdapterState | None:
        """The pushed state of the endpoint at `address`; None while no stream is up for it."""
        return self._states.get(address)

    async def load(self, address: str, adapter: str, path: str) -> bool | None:
        """Load through the pod's sidecar: True if loaded now, False if it already was, None when
        no sidecar stream is up (use HTTP). Raises `SidecarCallError` when the sidecar refuses."""
        stub = self._stub(address)
        if stub is None:
            return None
        try:
            reply = await stub.Load(pb.LoadRequest(adapter=adapter, path=path), timeout=self._call_timeout_s)
        except grpc.aio.AioRpcError as error:
            return self._call_failed(error)
        return bool(reply.loaded_now)

    async def unload(self, address: str, adapter: str) -> bool | None:
        """Unload through the pod's sidecar: True if unloaded, False if it was not registered,
        None when no sidecar stream is up. Raises `SidecarCallError` when the sidecar refuses."""
        stub = self._stub(address)
        if stub is None:
            return None
        try:
            reply = await stub.Unload(pb.UnloadRequest(adapter=adapter), timeout=self._call_timeout_s)
        except grpc.aio.AioRpcError as error:
            return self._call_failed(error)
        return bool(reply.unloaded)

    # -- for observability -----------------------------------------------------------------

    def states(self) -> Mapping[str, AdapterState]:
        """Endpoint address → pushed state, for the endpoints on push state now."""
        return MappingProxyType(self._states)

    def sidecars(self) -> tuple[str, ...]:
        """Sidecar addresses being watched (dialled or streaming)."""
        return tuple(self._links)

    # -- running ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Watch sidecars until cancelled; watchers follow `datastore.on_endpoints_changed`."""
        if self._group is not None:
            raise RuntimeError("AdapterStatePush.run is already running")
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                try:
                    self._sync()
                    await asyncio.Event().wait()
                finally:
                    self._group = None
        finally:
            for link in self._links.values():
                self._clear(link)
            self._links.clear()

    def _sync(self) -> None:
        group = self._group
        if group is None:
            return
        wanted: dict[str, list[Endpoint]] = {}
        for endpoint in self._datastore.endpoints():
            wanted.setdefault(format_address(endpoint.ip, self._port), []).append(endpoint)
        for address, link in list(self._links.items()):
            if tuple(wanted.get(address, ())) != link.endpoints:
                if link.task is not None:
                    link.task.cancel()
                self._clear(link)
                del self._links[address]
        for address, endpoints in wanted.items():
            if address in self._links:
                continue
            link = _Link(watcher=self._watcher(address), endpoints=tuple(endpoints))
            self._links[address] = link
            link.task = group.create_task(link.watcher.run(), name=f"adapter-state:{address}")

    def _watcher(self, address: str) -> SidecarWatcher:
        return SidecarWatcher(
            address,
            clock=self._clock,
            on_state=self._on_state,
            on_lost=self._on_lost,
            backoff_initial_s=self._backoff_initial_s,
            backoff_max_s=self._backoff_max_s,
        )

    # -- one State -------------------------------------------------------------------------

    def _on_state(self, address: str, message: pb.State) -> None:
        link = self._links.get(address)
        if link is None:
            return
        self.states_received += 1
        pushed = self._parse(address, message)
        if pushed is None:
            self.states_dropped += 1
            return
        target = self._target(link, message.model_server_port)
        if target is None:
            if not link.unmatched_logged:
                link.unmatched_logged = True
                log.warning(
                    "sidecar state matches none of the pod's endpoints; scraping only",
                    extra={
                        "address": address,
                        "model_server_port": message.model_server_port,
                        "endpoints": [e.address for e in link.endpoints],
                    },
                )
            return
        for name in link.applied_to - {target.name}:
            self._drop(link, name)
        link.applied_to = {target.name}
        self._states[target.address] = pushed
        self._link_of[target.address] = link
        self._datastore.set_adapter_state(target.name, pushed)

    def _parse(self, address: str, message: pb.State) -> AdapterState | None:
        registered = frozenset(message.registered)
        running = frozenset(message.running)
        waiting = frozenset(message.waiting)
        active = frozenset(message.active)
        if not (running or waiting):
            running = active  # a sidecar that reports `active` only
        sizes = (len(registered), len(running), len(waiting))
        if max(sizes) > MAX_ADAPTERS_PER_STATE or not 0 <= message.max_slots <= MAX_SLOTS:
            log.warning(
                "implausible sidecar state dropped",
                extra={"address": address, "adapters": max(sizes), "max_slots": message.max_slots},
            )
            return None
        return AdapterState(
            received_at=self._clock.now(),
            registered=registered,
            running_adapters=running,
            waiting_adapters=waiting,
            max_lora=message.max_slots,
            version=message.version,
        )

    @staticmethod
    def _target(link: _Link, model_server_port: int) -> Endpoint | None:
        """The endpoint a State describes: the one on its model server's port, else the pod's only
        one (a proxy may sit between the pool's port and the model server); None if ambiguous."""
        for endpoint in link.endpoints:
            if endpoint.port == model_server_port:
                return endpoint
        return link.endpoints[0] if len(link.endpoints) == 1 else None

    def _on_lost(self, address: str) -> None:
        link = self._links.get(address)
        if link is not None and link.applied_to:
            log.info("sidecar state lost; scraping only", extra={"address": address})
            self._clear(link)

    def _clear(self, link: _Link) -> None:
        for name in list(link.applied_to):
            self._drop(link, name)
        link.applied_to.clear()

    def _drop(self, link: _Link, endpoint_name: str) -> None:
        for endpoint in link.endpoints:
            if endpoint.name == endpoint_name:
                self._states.pop(endpoint.address, None)
                self._link_of.pop(endpoint.address, None)
        self._datastore.set_adapter_state(endpoint_name, None)

    # -- calls -----------------------------------------------------------------------------

    def _stub(self, address: str) -> pb_grpc.AdapterStateStub | None:
        link = self._link_of.get(address)
        return link.watcher.stub if link is not None else None

    @staticmethod
    def _call_failed(error: grpc.aio.AioRpcError) -> None:
        if error.code() in _UNREACHABLE:
            return None
        raise SidecarCallError(error.code().name, error.details() or "")
