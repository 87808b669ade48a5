"""gRPC health (grpc.health.v1) on its own plaintext port, as Kubernetes probes and Envoy expect.

`liveness` is SERVING once started. `readiness`, `""`, `inference-extension` and
`envoy.service.ext_proc.v3.ExternalProcessor` are SERVING only when the pool is synced (and,
with leader election, this replica leads). Other names: readiness status without leader
election, NOT_FOUND (SERVICE_UNKNOWN) with it, as upstream v1.x answers.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from epp.picker.listen import bind, grpc_address

log = logging.getLogger(__name__)

LIVENESS = "liveness"
READINESS_SERVICES = (
    "readiness",
    "",
    "inference-extension",
    "envoy.service.ext_proc.v3.ExternalProcessor",
)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class EppHealthServicer(health_aio.HealthServicer):  # type: ignore[misc]
    """The standard aio servicer, plus readiness for unnamed services when leader election is off."""

    def __init__(self, *, leader_election: bool) -> None:
        super().__init__()
        self._leader_election = leader_election

    async def Check(self, request: health_pb2.HealthCheckRequest, context: Any) -> Any:  # the gRPC name
        if not self._leader_election and request.service not in self._server_status:
            return health_pb2.HealthCheckResponse(status=self._server_status.get("readiness", NOT_SERVING))
        return await super().Check(request, context)


class Health:
    """Owns the health statuses; `update` is called whenever sync or leadership changes."""

    def __init__(self, *, leader_election: bool = False) -> None:
        self.servicer = EppHealthServicer(leader_election=leader_election)
        self._leader_election = leader_election
        self._ready: bool | None = None
        self._shut_down = False

    @property
    def ready(self) -> bool:
        return bool(self._ready)

    async def start(self) -> None:
        await self.servicer.set(LIVENESS, SERVING)
        await self._set_ready(False)

    async def update(self, *, synced: bool, leader: bool = True) -> None:
        ready = synced and (leader or not self._leader_election) and not self._shut_down
        if ready != self._ready:
            await self._set_ready(ready)

    async def shutdown(self) -> None:
        """Every service NOT_SERVING, for good (SIGTERM: let Envoy and Kubernetes drain us)."""
        if self._shut_down:
            return
        self._shut_down = True
        self._ready = False
        await self.servicer.enter_graceful_shutdown()
        log.info("readiness changed", extra={"ready": False})

    async def _set_ready(self, ready: bool) -> None:
        self._ready = ready
        status = SERVING if ready else NOT_SERVING
        for service in READINESS_SERVICES:
            await self.servicer.set(service, status)
        log.info("readiness changed", extra={"ready": ready})


def build_health_server(health: Health, *, host: str, port: int) -> tuple[grpc.aio.Server, int]:
    """A not-yet-started plaintext grpc.aio server for health; returns it and the bound port."""
    server = grpc.aio.server(options=(("grpc.so_reuseport", 0),))
    health_pb2_grpc.add_HealthServicer_to_server(health.servicer, server)
    bound = bind(server, grpc_address(host, port), None)
    return server, bound
