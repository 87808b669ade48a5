"""`epp serve`: the composition root. Builds every part from the flags and runs them on one loop.

One `asyncio.TaskGroup` holds the pool source, the metrics refresher, leader election and the
readiness watcher; the ext_proc, health and metrics servers are started before it and stopped
after it. SIGTERM/SIGINT drains: health turns NOT_SERVING at once, the EPP keeps routing (and
dispatching from its queues) for `--drain-period` while the gateway's health checks notice and stop
sending it new streams, then sends every request still queued, and each that would queue from
then on, to its best pod whatever the load (the pod queues it); ext_proc `stop(grace)` stops
taking streams and lets open ones finish, everything else is cancelled, exit 0. The picker
itself is `epp.picker.assembly`'s, built from the settings by `picker_spec`. Start-up errors print
one line on stderr: 2 for bad configuration, 1 when a port cannot be bound.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import sys
import uuid
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import grpc
from aiohttp import web
from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry

from epp.clock import Clock, SystemClock
from epp.errors import ConfigError
from epp.picker.adapters.catalog import FileCatalog
from epp.picker.adapters.hold import hold_for_adapter
from epp.picker.adapters.loader import AdapterLoader
from epp.picker.adapters.observe import AdapterCollector, AdapterParts, adapters_route
from epp.picker.adapters.preload import Preloader
from epp.picker.adapters.push import AdapterStatePush
from epp.picker.adapters.unload import ColdAdapterUnloader
from epp.picker.assembly import DEFAULT_POLICY, Assembly, PeerSpec, PickerSpec, assemble
from epp.picker.datastore.store import Datastore
from epp.picker.director import DecisionObserver, Director
from epp.picker.extproc.accesslog import AccessLogReceiver
from epp.picker.extproc.completions import Completions
from epp.picker.extproc.server import (
    ExternalProcessor,
    StreamCountsCollector,
    build_ext_proc_server,
    server_credentials,
)
from epp.picker.extproc.stream import StreamOptions, StreamSettings
from epp.picker.flowcontrol.settings import PUMP_INTERVAL_S
from epp.picker.lifecycle import RequestLife, Stage
from epp.picker.listen import ListenError
from epp.picker.logs import configure_logging
from epp.picker.observability import tracing
from epp.picker.observability.auth import bearer_auth_middleware, read_token_file
from epp.picker.observability.decisions import DecisionLog, decisions_route
from epp.picker.observability.flow import flow_control_route
from epp.picker.observability.health import Health, build_health_server
from epp.picker.observability.http import build_app, start_http
from epp.picker.observability.metrics import EppMetrics, PoolCollector
from epp.picker.observability.observer import Observer
from epp.picker.observability.pool import pool_routes
from epp.picker.peers import (
    PeerRefusals,
    PeerSender,
    PeerServer,
    PeerService,
    PeerTls,
    PeerTlsFiles,
    PeerTlsRenewal,
    PodAddresses,
    build_peer_server,
    load_peer_tls,
    parse_peers,
    peer_identity,
    peers_route,
    process_id,
)
from epp.picker.scheduling.shared import PeerReplicator
from epp.picker.scheduling.state import SchedulerState
from epp.serve import settings as serve_settings
from epp.serve.settings import ServeSettings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from epp.kube.leader import LeaderElector

log = logging.getLogger(__name__)

READINESS_POLL_S = 0.5
PENDING_MARGIN_S = 30.0  # beyond a queue's TTL, what an adapter load may still take
UNBOUNDED_PENDING_S = 120.0  # no TTL: the longest our shipped Envoy configs let a message wait


class _Runnable(Protocol):
    async def run(self) -> None: ...


@dataclass(frozen=True, slots=True)
class BoundPorts:
    grpc: int
    health: int
    metrics: int
    peer: int = 0  # the peer exchange's port; 0 without `--peers`


def configure_parser(parser: argparse.ArgumentParser) -> None:
    serve_settings.configure_parser(parser)


def run(args: argparse.Namespace) -> int:
    try:
        settings = serve_settings.settings_from_args(args)
    except ConfigError as err:
        print(f"epp serve: {err}", file=sys.stderr)
        return 2
    configure_logging(verbosity=settings.logging.verbosity, log_format=settings.logging.log_format)
    try:
        with _runner() as runner:
            runner.run(serve(settings))
    except ListenError as err:
        print(f"epp serve: {err}", file=sys.stderr)
        return 1
    except ConfigError as err:
        print(f"epp serve: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


def _runner() -> asyncio.Runner:
    """uvloop when importable (≈20% more streams per core in FDX), else the default loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


async def serve(
    settings: ServeSettings,
    *,
    clock: Clock | None = None,
    stop: asyncio.Event | None = None,
    on_started: Callable[[BoundPorts], None] | None = None,
) -> None:
    """Run until `stop` is set (or SIGTERM/SIGINT); raises ConfigError / ListenError at start-up."""
    stop = stop if stop is not None else asyncio.Event()
    with _signals_set(stop):
        await _serve(
            settings,
            clock=clock if clock is not None else SystemClock(),
            stop=stop,
            on_started=on_started,
        )


async def _serve(
    settings: ServeSettings,
    *,
    clock: Clock,
    stop: asyncio.Event,
    on_started: Callable[[BoundPorts], None] | None,
) -> None:
    """Build, bind, start, run until stopped, then drain and take everything down in order."""
    # Read first: a missing token file is a start-up error, before anything starts.
    metrics_token = (
        read_token_file(settings.observability.metrics_auth_token_file)
        if settings.observability.metrics_auth_token_file
        else None
    )
    parts = _build_parts(settings, clock)
    servers = await _open_servers(settings, parts, clock, metrics_token)
    try:
        await servers.start()
        _log_serving(settings, servers.ports, parts.director)
        if on_started is not None:
            on_started(servers.ports)
        await _run_tasks(
            servers.lifecycle(stop, settings.drain.drain_period_s, parts.director, parts.router),
            parts.datastore,
            parts.synced,
            parts.elector,
            parts.source,
            parts.refresher,
            *parts.adapters.runnables,
            parts.peers.sender if parts.peers is not None else None,
            _peer_renewal(parts, servers, clock),
        )
    finally:
        await servers.stop(settings.drain.grace_period_s)
        await parts.close()
        log.info("epp stopped")


@dataclass(frozen=True, slots=True)
class _Telemetry:
    """Metrics registry, decision observer and (with `--tracing`) the span exporter's provider."""

    registry: CollectorRegistry
    observer: Observer
    provider: TracerProvider | None


def _build_telemetry(settings: ServeSettings, datastore: Datastore, clock: Clock) -> _Telemetry:
    registry = _default_registry()
    registry.register(PoolCollector(datastore, clock))
    provider = tracing.build_tracer_provider() if settings.observability.tracing else None
    observer = Observer(
        EppMetrics(registry, pool=settings.pool.name),
        DecisionLog(settings.observability.decision_log_size),
        clock,
        tracer=tracing.decision_tracer(provider),
    )
    return _Telemetry(registry, observer, provider)


@dataclass(frozen=True, slots=True)
class _Parts:
    """Everything `serve` runs, built from the flags; nothing listens or runs yet, so a bad
    configuration fails here with no port taken."""

    datastore: Datastore
    telemetry: _Telemetry
    director: Director
    router: _ClosingRouter  # the director as ext_proc streams reach it
    source: _Runnable
    synced: Callable[[], bool]
    refresher: _Runnable
    elector: LeaderElector | None
    adapters: _Adapters
    peers: _Peers | None = None

    async def close(self) -> None:
        """Release what outlives the tasks: the adapter loader's session, queued trace spans."""
        if self.adapters.loader is not None:
            await self.adapters.loader.close()
        if self.telemetry.provider is not None:
            await asyncio.to_thread(self.telemetry.provider.shutdown)  # flushes queued spans off the loop


def _build_parts(settings: ServeSettings, clock: Clock) -> _Parts:
    datastore = Datastore(clock)
    telemetry = _build_telemetry(settings, datastore, clock)
    picker = build_picker(settings, datastore, clock, telemetry.observer)
    source, synced = _build_source(settings, datastore, clock)
    refresher = _build_refresher(settings, datastore, clock)
    elector = _build_elector(settings, clock)
    adapters = _build_adapters(settings, datastore, clock, picker.scheduler.state)
    if adapters.parts is not None:
        telemetry.registry.register(AdapterCollector(adapters.parts))
    peers = None
    if picker.peers is not None:
        peers = _build_peers(settings, picker.peers, clock, picker.director, telemetry.registry)
    return _Parts(
        datastore,
        telemetry,
        picker.director,
        _ClosingRouter(picker.director),
        source,
        synced,
        refresher,
        elector,
        adapters,
        peers,
    )


@dataclass(frozen=True, slots=True)
class _Peers:
    """Active-active: the peer exchange's receiving service and sending loop (`--peers`)."""

    service: PeerService
    sender: PeerSender
    route: web.RouteDef
    tls: PeerTls | None  # None: plaintext (`--peer-insecure`)
    refusals: PeerRefusals


def _build_peers(
    settings: ServeSettings,
    shared: PeerReplicator,
    clock: Clock,
    director: Director,
    registry: CollectorRegistry,
) -> _Peers:
    own_id = shared.own_id
    pool = f"{settings.pool.namespace}/{settings.pool.name}"
    tls = _peer_tls(settings)
    refusals = PeerRefusals(registry, clock)
    service = PeerService(
        shared, own_id=own_id, pool=pool, clock=clock, refusals=refusals, on_applied=director.pump
    )
    sender = PeerSender(
        shared,
        parse_peers(settings.peers.addresses) if settings.peers.addresses else [],
        own_id=own_id,
        pool=pool,
        clock=clock,
        interval_s=settings.peers.interval_s,
        tls=tls,
        pods=_peer_pods(settings) if settings.peers.selector else None,
        pods_port=settings.peers.port,
    )
    route = peers_route(shared, service, sender, clock, own_id=own_id, refusals=refusals, tls=tls is not None)
    return _Peers(service, sender, route, tls, refusals)


def _peer_pods(settings: ServeSettings) -> PodAddresses:
    """`--peer-selector`: the replicas' Pods, listed in the pool's namespace."""
    from epp.kube.api import AsyncKubeApi, load_api_client
    from epp.kube.peers import PodAddresses as KubePodAddresses

    api = AsyncKubeApi(load_api_client(settings.pool.kubeconfig))
    return KubePodAddresses(api, settings.pool.namespace, settings.peers.selector)


def _peer_renewal(parts: _Parts, servers: _Servers, clock: Clock) -> PeerTlsRenewal | None:
    """Renewed `--peer-tls-*` files, taken up by the peer port and the sender without a restart."""
    peers, server = parts.peers, servers.peer
    if peers is None or peers.tls is None or server is None or server.gate is None:
        return None
    gate, sender = server.gate, peers.sender

    async def apply(tls: PeerTls) -> None:
        gate.use(tls)
        await sender.use(tls)

    return PeerTlsRenewal(peers.tls, apply, clock=clock, registry=parts.telemetry.registry)


def _peer_tls(settings: ServeSettings) -> PeerTls | None:
    """The peer certificates, read and checked now; plaintext only when asked for by name.

    Which flags go together is settled when the flags are parsed (`settings_from_args`); what is
    left is what only reading the files can find.
    """
    ca, cert, key = settings.peers.tls_ca, settings.peers.tls_cert, settings.peers.tls_key
    if ca is not None and cert is not None and key is not None:
        identity = peer_identity(settings.pool.namespace, settings.pool.name)
        return load_peer_tls(PeerTlsFiles(ca, cert, key), identity)
    assert settings.peers.insecure, "--peers without --peer-tls-* needs --peer-insecure"
    log.warning(
        "peer exchange in plaintext (--peer-insecure): anyone who reaches the peer port can feed "
        "this replica routing events; keep a NetworkPolicy in front of it",
        extra={"peer_port": settings.peers.port},
    )
    return None


@dataclass(slots=True)
class _Servers:
    """The ext_proc, gRPC health and metrics listeners, and the health state they report.

    Every port is bound when this is built (a taken port fails start-up); the gRPC servers
    accept only after `start`. `stop` takes them down in drain order.
    """

    health: Health
    completions: Completions
    access_log: AccessLogReceiver
    ext_proc: grpc.aio.Server
    grpc_health: grpc.aio.Server
    http: web.AppRunner
    ports: BoundPorts
    peer: PeerServer | None = None  # the peer exchange, with `--peers`
    _started: list[grpc.aio.Server] = field(default_factory=list, init=False)

    async def start(self) -> None:
        for server in (self.grpc_health, self.ext_proc):
            await server.start()
            self._started.append(server)
        if self.peer is not None:
            await self.peer.start()

    def lifecycle(
        self, stop: asyncio.Event, drain_period_s: float, director: Director, router: _ClosingRouter
    ) -> _Lifecycle:
        return _Lifecycle(
            stop, self.health, drain_period_s, self.access_log, self.completions, director, router
        )

    async def stop(self, grace_s: float) -> None:
        """NOT_SERVING first; ext_proc gets `grace_s` for open streams to finish."""
        await self.health.shutdown()
        if self.ext_proc in self._started:
            await self.ext_proc.stop(grace_s)
        if self.grpc_health in self._started:
            await self.grpc_health.stop(0)
        if self.peer is not None:
            await self.peer.stop()
        await self.http.cleanup()


async def _open_servers(
    settings: ServeSettings, parts: _Parts, clock: Clock, metrics_token: str | None
) -> _Servers:
    health = Health(leader_election=parts.elector is not None)
    await health.start()
    completions = Completions(clock, wait_s=settings.listen.access_log_timeout_s)
    access_log = AccessLogReceiver(completions)
    processor = _build_processor(settings, parts, completions, clock)
    parts.telemetry.registry.register(StreamCountsCollector(processor.counts))
    credentials = server_credentials(settings.listen.cert_path) if settings.listen.secure_serving else None
    ext_server, grpc_port = build_ext_proc_server(
        processor,
        host=settings.listen.host,
        port=settings.listen.grpc_port,
        credentials=credentials,
        health_servicer=health.servicer,
        access_log=access_log,
    )
    health_server, health_port = build_health_server(
        health, host=settings.listen.host, port=settings.listen.grpc_health_port
    )
    peer_server, peer_port = None, 0
    if parts.peers is not None:
        peer_server = await build_peer_server(
            parts.peers.service,
            host=settings.listen.host,
            port=settings.peers.port,
            tls=parts.peers.tls,
            refusals=parts.peers.refusals,
        )
        peer_port = peer_server.port
    http_app = _build_http_app(parts, health, metrics_token, clock)
    runner, metrics_port = await start_http(
        http_app, host=settings.listen.host, port=settings.listen.metrics_port
    )
    ports = BoundPorts(grpc=grpc_port, health=health_port, metrics=metrics_port, peer=peer_port)
    return _Servers(health, completions, access_log, ext_server, health_server, runner, ports, peer_server)


def _build_processor(
    settings: ServeSettings, parts: _Parts, completions: Completions, clock: Clock
) -> ExternalProcessor:
    """The ext_proc handler: routes through the director; with a loader, holds a request for an
    adapter that is not loaded anywhere yet."""
    loader = parts.adapters.loader
    flow = parts.director.flow
    ttl_s = flow.queues.settings.request_ttl_s if flow is not None else 0.0
    return ExternalProcessor(
        StreamOptions(
            parts.router,
            clock,
            StreamSettings(
                default_body_mode=settings.listen.body_mode,
                max_request_body_bytes=settings.listen.max_request_body_bytes,
                max_header_bytes=settings.listen.max_header_bytes,
                # BUFFERED: a queued request's reply may take its whole TTL; ask Envoy for that
                # and a margin (up to its max_message_timeout, 120 s in the configs we ship).
                pending_timeout_s=ttl_s + PENDING_MARGIN_S if ttl_s > 0 else UNBOUNDED_PENDING_S,
            ),
            hold=functools.partial(hold_for_adapter, loader) if loader is not None else None,
            completions=completions,
        )
    )


def _build_http_app(
    parts: _Parts, health: Health, metrics_token: str | None, clock: Clock
) -> web.Application:
    """Metrics, readiness and the debug routes; behind a bearer token when one is configured."""
    http_app = build_app(
        parts.telemetry.registry,
        ready=lambda: health.ready,
        extra_routes=(
            decisions_route(parts.telemetry.observer.decisions),
            flow_control_route(parts.director, parts.datastore, clock),
            *pool_routes(parts.director, parts.datastore, parts.telemetry.observer.decisions, clock),
            *parts.adapters.routes,
            *((parts.peers.route,) if parts.peers is not None else ()),
        ),
    )
    if metrics_token is not None:
        http_app.middlewares.append(bearer_auth_middleware(metrics_token))
    return http_app


def _log_serving(settings: ServeSettings, ports: BoundPorts, director: Director) -> None:
    log.info(
        "epp serving",
        extra={
            "grpc_port": ports.grpc,
            "health_port": ports.health,
            "metrics_port": ports.metrics,
            "secure_serving": settings.listen.secure_serving,
            "scheduler": director.scheduler.name,
            "pool": f"{settings.pool.namespace}/{settings.pool.name}",
        },
    )


def _default_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    return registry


@dataclass(frozen=True, slots=True)
class _Lifecycle:
    """What starting, draining and stopping involve beside the runnables."""

    stop: asyncio.Event
    health: Health
    drain_period_s: float
    access_log: AccessLogReceiver
    completions: Completions
    director: Director
    router: _ClosingRouter


COMPLETION_SWEEP_S = 1.0


class _ClosingRouter:
    """The director as ext_proc streams reach it, queueing nothing once the EPP is leaving.

    At the end of the drain period nothing will dispatch from the queues any more, so what is
    still queued goes to its best endpoint at once, whatever the pool's load: the pods' own
    queues hold it, and the client gets its response instead of a refusal a rolling restart
    need not cause. A stream open after that (a body that comes late, a stream accepted before
    the listener stopped taking new ones) is placed the same way rather than filed in a queue
    that would be cut when the listener's grace period runs out.
    """

    def __init__(self, director: Director) -> None:
        self._director = director
        self._closed = False

    def mint(self, request_id: str = "") -> RequestLife:
        return self._director.mint(request_id)

    def arrive(
        self,
        life: RequestLife,
        *,
        headers: Mapping[str, str],
        body: bytes | None,
        subset: Sequence[str] | None = None,
    ) -> bytes:
        sent = self._director.arrive(life, headers=headers, body=body, subset=subset)
        if self._closed and life.stage is Stage.QUEUED:
            self._director.release_queues()  # only this request: the queues were empty
        return sent

    def close(self) -> None:
        """Dispatch every queued request now, and each that would queue from now on."""
        self._closed = True
        self._director.release_queues()


async def _run_tasks(
    lifecycle: _Lifecycle,
    datastore: Datastore,
    synced: Callable[[], bool],
    elector: LeaderElector | None,
    *runnables: _Runnable | None,
) -> None:
    class _Stop(Exception):
        pass

    health = lifecycle.health
    campaign: asyncio.Task[None] | None = None

    async def wait_for_stop() -> None:
        """On stop: NOT_SERVING, give up the lease (a standby takes over now, not at exit), keep
        routing through the drain period, then end the tasks."""
        await lifecycle.stop.wait()
        await health.shutdown()
        lifecycle.access_log.drain()
        if campaign is not None:
            campaign.cancel()  # the elector releases the lease as it ends
            await asyncio.wait([campaign])
        log.info("draining", extra={"drain_period_s": lifecycle.drain_period_s})
        await asyncio.sleep(lifecycle.drain_period_s)
        # Queued requests went on dispatching as capacity freed through the drain period; what is
        # left goes to its pods now, as does any request that would queue until the listener closes.
        lifecycle.router.close()
        raise _Stop

    async def sweep_completions() -> None:
        while True:
            await asyncio.sleep(COMPLETION_SWEEP_S)
            lifecycle.completions.expire()

    async def pump_queues() -> None:
        director = lifecycle.director
        while True:
            await asyncio.sleep(PUMP_INTERVAL_S)
            director.pump()

    async def watch_readiness() -> None:
        changed = asyncio.Event()
        if elector is not None:
            elector.on_change(lambda _leader: changed.set())
        while True:
            leader = True if elector is None else elector.is_leader
            await health.update(synced=synced() and datastore.pool_synced, leader=leader)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), READINESS_POLL_S)
            changed.clear()

    coroutines: list[Coroutine[Any, Any, None]] = [wait_for_stop(), watch_readiness(), sweep_completions()]
    if lifecycle.director.flow is not None:
        coroutines.append(pump_queues())
    coroutines.extend(r.run() for r in runnables if r is not None)
    try:
        async with asyncio.TaskGroup() as group:
            if elector is not None:
                campaign = group.create_task(elector.run())
            for coroutine in coroutines:
                group.create_task(coroutine)
    except* _Stop:
        pass


@contextlib.contextmanager
def _signals_set(stop: asyncio.Event) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread (tests): the caller sets `stop`
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


@dataclass(frozen=True, slots=True)
class _Adapters:
    """The adapter parts `serve` runs: loader (with a catalogue), push state, preload, unload."""

    loader: AdapterLoader | None = None
    parts: AdapterParts | None = None
    runnables: tuple[_Runnable, ...] = ()
    routes: tuple[web.RouteDef, ...] = ()


def _build_adapters(
    settings: ServeSettings, datastore: Datastore, clock: Clock, scheduler_state: SchedulerState | None
) -> _Adapters:
    """Sidecar push state with `--adapter-state-port`; loader, preloader and cold-adapter
    unloader with `--adapter-catalog`. A bad or missing catalogue is a start-up ConfigError."""
    push = None
    if settings.adapters.state_port:
        push = AdapterStatePush(datastore, clock, port=settings.adapters.state_port)
    if settings.adapters.catalog is None:
        return _Adapters(runnables=(push,) if push is not None else ())
    catalog = FileCatalog(settings.adapters.catalog)
    loader = AdapterLoader(catalog.current, clock=clock, pods=push)
    preloader = Preloader(loader, datastore, clock, scheduler=scheduler_state)
    unloader = ColdAdapterUnloader(
        loader, datastore, clock, idle_s=settings.adapters.idle_unload_s, scheduler=scheduler_state
    )
    parts = AdapterParts(loader, clock, push=push, preloader=preloader, unloader=unloader)
    runnables: tuple[_Runnable, ...] = (preloader, unloader) if push is None else (push, preloader, unloader)
    return _Adapters(loader, parts, runnables, (adapters_route(parts),))


def picker_spec(settings: ServeSettings) -> PickerSpec:
    """The picker `settings` ask for: their config (or named policy), seed, metrics staleness and,
    with `--peers`, a fresh id for this replica and the exchange interval."""
    text = settings.scheduling.picker_config_text
    peers = None
    if settings.peers.enabled:
        peers = PeerSpec(own_id=process_id(), interval_s=settings.peers.interval_s)
    return PickerSpec(
        config_text=text,
        policy=None if text is not None else (settings.scheduling.policy or DEFAULT_POLICY),
        seed=settings.scheduling.seed,
        staleness_threshold_s=settings.scrape.staleness_threshold_s,
        peers=peers,
    )


def build_picker(
    settings: ServeSettings, datastore: Datastore, clock: Clock, observer: DecisionObserver
) -> Assembly:
    """The picker over the configured scheduler (`epp.picker.assembly`), with flow control when
    the config turns it on; with `--peers`, the scheduler's ledger is replicated."""
    assembly = assemble(picker_spec(settings), datastore, clock=clock, observer=observer)
    if assembly.config is not None and assembly.config.ignored:
        ignored = {"sections": list(assembly.config.ignored)}
        log.warning("EndpointPickerConfig sections accepted and not applied", extra=ignored)
    return assembly


def build_director(
    settings: ServeSettings, datastore: Datastore, clock: Clock, observer: Observer
) -> tuple[Director, SchedulerState, PeerReplicator | None]:
    """`build_picker`'s director, scheduler state and peer replicator.

    Public so the hot-path benchmark measures exactly what `epp serve` runs."""
    assembly = build_picker(settings, datastore, clock, observer)
    return assembly.director, assembly.scheduler.state, assembly.peers


def _build_source(
    settings: ServeSettings, datastore: Datastore, clock: Clock
) -> tuple[_Runnable, Callable[[], bool]]:
    """The pool source and a "has it synced" test; a pool file is loaded (and checked) right here."""
    if settings.pool.file is not None:
        from epp.picker.sources.file import FileSource

        file_source = FileSource(
            settings.pool.file,
            datastore,
            pool_name=settings.pool.name,
            pool_namespace=settings.pool.namespace,
            clock=clock,
        )
        file_source.load()
        return file_source, lambda: True
    from epp.kube.watch import KubeSource, PoolRef

    kube_source = KubeSource(
        datastore,
        pool=PoolRef(name=settings.pool.name, namespace=settings.pool.namespace, group=settings.pool.group),
        kubeconfig=settings.pool.kubeconfig,
        clock=clock,
    )
    return kube_source, lambda: kube_source.synced.is_set() and not kube_source.denied


def _build_refresher(settings: ServeSettings, datastore: Datastore, clock: Clock) -> _Runnable:
    from epp.picker.scrape.refresher import MetricsRefresher, PageReading, ScrapePacing, ScrapeTarget

    return MetricsRefresher(
        datastore,
        clock,
        ScrapePacing(interval_s=settings.scrape.refresh_metrics_interval_s),
        target=ScrapeTarget(
            scheme=settings.scrape.scheme,
            port=settings.scrape.port,
            path=settings.scrape.path,
            insecure_skip_verify=settings.scrape.insecure_skip_verify,
        ),
        reading=PageReading(names=settings.scrape.metric_names),
    )


def _build_elector(settings: ServeSettings, clock: Clock) -> LeaderElector | None:
    if not settings.leader.enabled:
        return None
    from epp.kube.leader import LeaderElector, LeaseClaim

    # The pod's name (POD_NAME, which the chart sets from the downward API; else the host name,
    # which is the pod's name except under host networking) says which pod holds the Lease; the
    # suffix keeps two processes with one name from each taking the other's Lease for its own.
    identity = f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:12]}"
    return LeaderElector(
        claim=LeaseClaim(name=settings.lease_name, namespace=settings.pool.namespace, identity=identity),
        kubeconfig=settings.pool.kubeconfig,
        clock=clock,
    )


__all__ = ["BoundPorts", "build_director", "build_picker", "configure_parser", "picker_spec", "run", "serve"]
