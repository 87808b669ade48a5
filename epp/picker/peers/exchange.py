"""Peer exchange between active-active replicas: the gRPC side of `scheduling.shared` (the replicated ledger).

`epp serve --peers NAME:PORT` (the EPP's headless Service, or a comma list of host:port) or
`--peer-selector LABELS` (the replicas' Pods, read from the Kubernetes API) serves
`lora_epp.peers.v1.PeerExchange` on `--peer-port` and, every `--peer-interval`
(100 ms), sends each peer one batch of what this replica routed and finished since the last
one. The peers are looked up again every `resolve_every_s`, so replicas that come and go are
found; this process's own address is recognised by its reply (its own id) and left out.

Failure behaviour (see docs/architecture.md): a batch that is not delivered within the
interval is dropped and the next one to that peer is a reset (our whole in-flight set), so
a slow or partitioned peer catches up in one message; a peer heard from by nobody for
`peer_timeout_s` is forgotten with its requests; a batch for another pool is refused (and
counted, `refusals`). The port speaks mutual TLS (`gate`, `credentials`) unless `--peer-insecure`;
the NetworkPolicy in `manifests/epp-active-active/` fences it to the EPP's own pods either way.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
from collections.abc import Awaitable, Callable, Sequence

import grpc
from aiohttp import web

from epp._proto import peers_pb2 as pb
from epp._proto import peers_pb2_grpc as pb_grpc
from epp.clock import Clock
from epp.errors import ConfigError
from epp.picker.peers.credentials import PeerTls
from epp.picker.peers.refusals import PeerRefusals, Refusal
from epp.picker.scheduling.shared import PeerBatch, PeerReplicator, PeerRouted

log = logging.getLogger(__name__)

SEND_TIMEOUT_S = 1.0


def process_id() -> str:
    """A fresh id for this process: peers tell a restarted replica by its new id."""
    return secrets.token_hex(8)


# `await pods()`: the IPs of the replicas' Pods now, from the Kubernetes API
# (`epp.kube.peers.PodAddresses`; the picker itself does not talk to Kubernetes).
PodAddresses = Callable[[], Awaitable[list[str]]]


def parse_peers(text: str) -> list[tuple[str, int]]:
    """`NAME:PORT[,NAME:PORT...]` → (host, port) pairs; a malformed entry is a ConfigError."""
    targets: list[tuple[str, int]] = []
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        host, sep, port = entry.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--peers: expected NAME:PORT entries, got {entry!r}")
        targets.append((host.strip("[]"), int(port)))
    if not targets:
        raise ConfigError("--peers: no NAME:PORT given")
    return targets


def to_proto(batch: PeerBatch, pool: str) -> pb.Batch:
    return pb.Batch(
        sender=batch.sender,
        pool=pool,
        reset=batch.reset,
        routed=[
            pb.Routed(
                key=r.key, endpoint=r.endpoint, adapter=r.adapter, age_ms=min(2**32 - 1, int(r.age_s * 1000))
            )
            for r in batch.routed
        ],
        finished=list(batch.finished),
    )


def from_proto(message: pb.Batch) -> PeerBatch:
    return PeerBatch(
        sender=message.sender,
        reset=message.reset,
        routed=tuple(PeerRouted(r.key, r.endpoint, r.adapter, r.age_ms / 1000.0) for r in message.routed),
        finished=tuple(message.finished),
    )


class PeerService(pb_grpc.PeerExchangeServicer):  # type: ignore[misc]
    """Receives the peers' batches and records them in this replica's ledger.

    `on_applied` runs after each batch: what peers finished may have freed capacity that
    flow control can hand on.
    """

    def __init__(
        self,
        shared: PeerReplicator,
        *,
        own_id: str,
        pool: str,
        clock: Clock,
        refusals: PeerRefusals,
        on_applied: Callable[[], None] | None = None,
    ) -> None:
        self._shared = shared
        self._own_id = own_id
        self._pool = pool
        self._clock = clock
        self._refusals = refusals
        self._on_applied = on_applied
        self.batches = 0

    async def Exchange(self, request: pb.Batch, context: grpc.aio.ServicerContext) -> pb.BatchReply:
        if request.pool != self._pool:
            self._refusals.refuse(
                Refusal.FOREIGN_POOL, peer=request.sender, detail=f"a batch for pool {request.pool!r}"
            )
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"this EPP serves pool {self._pool}, not {request.pool}"
            )
        if request.sender != self._own_id:  # our own batch, sent to our own address: nothing to learn
            self._shared.apply(from_proto(request), self._clock.now())
            self.batches += 1
            if self._on_applied is not None:
                self._on_applied()
        return pb.BatchReply(receiver=self._own_id)


class PeerSender:
    """Every interval: find the peers, send each its batch, forget the silent ones."""

    def __init__(
        self,
        shared: PeerReplicator,
        targets: Sequence[tuple[str, int]],
        *,
        own_id: str,
        pool: str,
        clock: Clock,
        interval_s: float = 0.1,
        resolve_every_s: float = 5.0,
        tls: PeerTls | None = None,
        pods: PodAddresses | None = None,
        pods_port: int = 0,
    ) -> None:
        if interval_s <= 0 or resolve_every_s <= 0:
            raise ValueError("interval_s and resolve_every_s must be positive")
        self._pods = pods
        self._pods_port = pods_port
        self._shared = shared
        self._targets = list(targets)
        self._own_id = own_id
        self._pool = pool
        self._clock = clock
        self._interval_s = interval_s
        self._resolve_every_s = resolve_every_s
        self._tls = tls
        self._credentials = tls.channel_credentials() if tls is not None else None
        self._channels: dict[str, tuple[grpc.aio.Channel, pb_grpc.PeerExchangeStub]] = {}
        self._self: set[str] = set()  # addresses that answered with our own id
        self._resolved_at: float | None = None
        self.sent = 0
        self.failures = 0

    async def run(self) -> None:
        try:
            while True:
                await self.tick()
                await self._clock.sleep(self._interval_s)
        finally:
            await self.close()

    async def tick(self) -> None:
        now = self._clock.now()
        if self._resolved_at is None or now - self._resolved_at >= self._resolve_every_s:
            self._resolved_at = now
            addresses = [a for a in await self._resolve() if a not in self._self]
            self._shared.set_peers(addresses)
            for address in [a for a in self._channels if a not in addresses]:
                channel, _ = self._channels.pop(address)
                await channel.close()
        await asyncio.gather(*(self._send(address) for address in self._shared.peers()))
        for sender in self._shared.expire(self._clock.now()):
            log.warning("peer EPP silent; its requests no longer count", extra={"peer": sender})

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel, _ in channels.values():
            await channel.close()

    async def use(self, tls: PeerTls) -> None:
        """Present renewed certificates from now on: channels reopen with them at the next send."""
        self._tls = tls
        self._credentials = tls.channel_credentials()
        await self.close()

    async def _resolve(self) -> list[str]:
        """Every peer's address now, as ip:port: the names resolved (one that does not resolve
        counts as none) and the Pods' IPs on `pods_port`."""
        loop = asyncio.get_running_loop()
        found: list[str] = []

        def add(ip: str, port: int) -> None:
            address = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
            if address not in found:
                found.append(address)

        for host, port in self._targets:
            try:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as error:
                log.warning("cannot resolve peers", extra={"peers": f"{host}:{port}", "error": str(error)})
                continue
            for *_, sockaddr in infos:
                add(str(sockaddr[0]), port)
        if self._pods is not None:
            for ip in await self._pods():
                add(ip, self._pods_port)
        return found

    async def _send(self, address: str) -> None:
        batch = self._shared.drain(address, self._own_id, self._clock.now())
        stub = self._stub(address)
        try:
            reply = await stub.Exchange(
                to_proto(batch, self._pool), timeout=min(SEND_TIMEOUT_S, 10 * self._interval_s)
            )
        except grpc.aio.AioRpcError as error:
            self.failures += 1
            self._shared.failed(address)
            log.debug("peer batch not delivered", extra={"peer": address, "error": error.code().name})
            return
        if reply.receiver == self._own_id:
            self._self.add(address)  # our own listener: leave it out from now on
            self._shared.set_peers([a for a in self._shared.peers() if a != address])
            return
        self.sent += 1
        self._shared.sent(address, reply.receiver)

    def _stub(self, address: str) -> pb_grpc.PeerExchangeStub:
        entry = self._channels.get(address)
        if entry is None:
            if self._tls is None or self._credentials is None:
                channel = grpc.aio.insecure_channel(address)
            else:
                channel = grpc.aio.secure_channel(
                    address, self._credentials, options=self._tls.channel_options()
                )
            entry = self._channels[address] = (channel, pb_grpc.PeerExchangeStub(channel))
        return entry[1]


def peers_route(
    shared: PeerReplicator,
    service: PeerService,
    sender: PeerSender,
    clock: Clock,
    *,
    own_id: str,
    refusals: PeerRefusals,
    tls: bool,
) -> web.RouteDef:
    """`GET /debug/peers`: this replica's id, the peers it sends to, what each peer has in flight,
    and what the exchange refused."""

    async def handler(_: web.Request) -> web.Response:
        now = clock.now()
        body = {
            "id": own_id,
            "sending_to": shared.peers(),
            "batches_sent": sender.sent,
            "send_failures": sender.failures,
            "batches_received": service.batches,
            "tls": tls,
            "refused": {reason.value: count for reason, count in refusals.counts.items()},
            "peers": [
                {"id": view.sender, "in_flight": view.in_flight, "heard_s_ago": round(view.heard_s_ago, 3)}
                for view in shared.peer_views(now)
            ],
        }
        return web.json_response(body)

    return web.get("/debug/peers", handler)
