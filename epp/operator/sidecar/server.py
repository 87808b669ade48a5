"""The adapter-state sidecar: watch one model server, push its adapter state, load on request.

Runs in the model-server pod and talks to the server over localhost. Every
`poll_interval_s` it reads `GET /v1/models` (registered adapters: entries with a `parent`)
and `/metrics` (`vllm:lora_requests_info`: active adapters, max_lora); when that state
changes, every `Watch` stream gets a new `State` (a full one, with the load events since the
previous). `Load`/`Unload` go to the server's runtime LoRA API and are reflected at once.
A model server that does not answer leaves the last state in place (the EPP still sees the
stream, and falls back to scraping if the stream itself goes away).
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import grpc

from epp._proto import adapterstate_pb2 as pb
from epp._proto import adapterstate_pb2_grpc as pb_grpc
from epp.clock import Clock
from epp.picker.adapters.loader import ALREADY_LOADED, LOAD_PATH, MODELS_PATH, UNLOAD_PATH, server_message
from epp.picker.scrape.parse import MetricsParseError, parse_metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PodAdapters:
    registered: frozenset[str] = frozenset()
    running: frozenset[str] = frozenset()
    waiting: frozenset[str] = frozenset()
    max_slots: int = 0

    @property
    def active(self) -> frozenset[str]:
        return self.running | self.waiting


MAX_EVENTS = 1024  # events kept for watchers that have not read them yet; older ones are dropped


@dataclass(slots=True)
class StateBoard:
    """The latest adapter state, its version and recent events by the version they came with;
    wakes watchers.

    A watcher gets every event published since the State it last read, not only the newest
    State's: the poller and a Load can publish twice before a slow watcher reads once, and an
    event must not vanish under the second publish.
    """

    current: PodAdapters = PodAdapters()
    model_server_port: int = 0
    version: int = 0
    events: list[tuple[int, pb.AdapterEvent]] = field(default_factory=list)  # (version, event)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def publish(self, state: PodAdapters, events: Iterable[pb.AdapterEvent] = ()) -> None:
        new_events = list(events)
        if state == self.current and not new_events and self.version > 0:
            return
        async with self.changed:
            self.current = state
            self.version += 1
            self.events.extend((self.version, event) for event in new_events)
            del self.events[:-MAX_EVENTS]
            self.changed.notify_all()

    async def next_after(self, version: int) -> pb.State:
        """The state once its version differs from `version` (at once if it already does), with
        the events since `version`; a new watcher (`version` 0) gets the newest State's only."""
        async with self.changed:
            await self.changed.wait_for(lambda: self.version != version)
            return self.message(since=version or self.version - 1)

    def message(self, *, since: int = 0) -> pb.State:
        return pb.State(
            registered=sorted(self.current.registered),
            active=sorted(self.current.active),
            max_slots=self.current.max_slots,
            version=self.version,
            events=[event for at, event in self.events if at > since],
            running=sorted(self.current.running),
            waiting=sorted(self.current.waiting),
            model_server_port=self.model_server_port,
        )


class AdapterStateService(pb_grpc.AdapterStateServicer):  # type: ignore[misc]  # generated, untyped
    def __init__(
        self,
        model_server_url: str,
        *,
        clock: Clock,
        poll_interval_s: float = 0.5,
        request_timeout_s: float = 120.0,
    ) -> None:
        self._base = model_server_url.rstrip("/")
        self._clock = clock
        self._poll_interval_s = poll_interval_s
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self.board = StateBoard(model_server_port=_port_of(self._base))
        self.watch_streams = 0  # Watch calls since start (an EPP restart shows as one more)

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- polling ---------------------------------------------------------------------------

    async def poll_forever(self) -> None:
        while True:
            await self.poll_once()
            await self._clock.sleep(self._poll_interval_s)

    async def poll_once(self, events: Iterable[pb.AdapterEvent] = ()) -> None:
        state = await self._read_state()
        if state is not None:
            await self.board.publish(state, events)

    async def _read_state(self) -> PodAdapters | None:
        try:
            async with self._http().get(f"{self._base}{MODELS_PATH}") as response:
                models: Any = await response.json(content_type=None) if response.status == 200 else None
            async with self._http().get(f"{self._base}/metrics") as response:
                metrics_text = await response.text() if response.status == 200 else ""
        except (aiohttp.ClientError, ValueError, TimeoutError) as error:
            log.warning("model server not readable", extra={"url": self._base, "error": str(error)})
            return None
        data = models.get("data") if isinstance(models, dict) else None
        if not isinstance(data, list):
            return None
        registered = frozenset(str(m["id"]) for m in data if isinstance(m, dict) and m.get("parent"))
        running: frozenset[str] = frozenset()
        waiting: frozenset[str] = frozenset()
        max_slots = self.board.current.max_slots
        if metrics_text:
            try:
                metrics = parse_metrics(metrics_text, self._clock.now())
                running, waiting = metrics.running_adapters, metrics.waiting_adapters
                max_slots = metrics.max_lora
            except MetricsParseError as error:
                log.warning("model server metrics unreadable", extra={"error": str(error)})
        return PodAdapters(registered, running, waiting, max_slots)

    # -- gRPC ------------------------------------------------------------------------------

    async def Watch(  # gRPC method name
        self, request: pb.WatchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.State]:
        self.watch_streams += 1
        log.info("watch stream opened", extra={"peer": context.peer(), "streams": self.watch_streams})
        sent = 0
        while True:
            message = await self.board.next_after(sent)
            sent = message.version
            yield message

    async def Load(
        self, request: pb.LoadRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.LoadReply:
        if not request.adapter or not request.path:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "adapter and path are required")
        body = {"lora_name": request.adapter, "lora_path": request.path, "load_inplace": False}
        status, text = await self._post(LOAD_PATH, body, context)
        if status == 200 or (status == 400 and ALREADY_LOADED in text):
            loaded_now = status == 200
            event = pb.AdapterEvent(kind=pb.AdapterEvent.LOADED, adapter=request.adapter)
            await self.poll_once([event] if loaded_now else [])
            return pb.LoadReply(loaded_now=loaded_now)
        message = server_message(text)
        failed = pb.AdapterEvent(kind=pb.AdapterEvent.LOAD_FAILED, adapter=request.adapter, message=message)
        await self.poll_once([failed])
        code = grpc.StatusCode.NOT_FOUND if status == 404 else grpc.StatusCode.FAILED_PRECONDITION
        await context.abort(code, f"HTTP {status}: {message}")
        raise AssertionError("abort raises")  # pragma: no cover

    async def Unload(
        self, request: pb.UnloadRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.UnloadReply:
        status, text = await self._post(UNLOAD_PATH, {"lora_name": request.adapter}, context)
        if status == 404:
            return pb.UnloadReply(unloaded=False)
        if status != 200:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"HTTP {status}: {server_message(text)}")
        event = pb.AdapterEvent(kind=pb.AdapterEvent.UNLOADED, adapter=request.adapter)
        await self.poll_once([event])
        return pb.UnloadReply(unloaded=True)

    async def _post(
        self, route: str, body: dict[str, Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> tuple[int, str]:
        try:
            async with self._http().post(f"{self._base}{route}", json=body) as response:
                return response.status, await response.text()
        except (aiohttp.ClientError, TimeoutError) as error:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"model server unreachable: {error}")
            raise AssertionError("abort raises") from error  # pragma: no cover


# The EPP pings every 10 s to notice a vanished peer; gRPC's default server policy would
# answer pings that frequent on a quiet stream with GOAWAY.
SERVER_OPTIONS = (
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.keepalive_permit_without_calls", 1),
)


def _port_of(url: str) -> int:
    try:
        port = urllib.parse.urlsplit(url).port
    except ValueError:
        return 0
    return port or 0


async def serve(service: AdapterStateService, host: str, port: int) -> tuple[grpc.aio.Server, int]:
    """Start the gRPC server; returns it and the bound port (0 picks a free one)."""
    server = grpc.aio.server(options=SERVER_OPTIONS)
    pb_grpc.add_AdapterStateServicer_to_server(service, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    return server, bound
