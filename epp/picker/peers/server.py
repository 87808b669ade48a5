"""The peer port: the exchange's gRPC server, behind the mutual-TLS gate or (with
`--peer-insecure`) plaintext on the port itself."""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import tempfile
from dataclasses import dataclass

import grpc

from epp._proto import peers_pb2_grpc as pb_grpc
from epp.picker.listen import bind, grpc_address
from epp.picker.peers.credentials import PeerTls
from epp.picker.peers.exchange import PeerService
from epp.picker.peers.gate import PeerGate
from epp.picker.peers.refusals import PeerRefusals


@dataclass(slots=True)
class PeerServer:
    """Bound when built (a taken port fails start-up); accepts after `start`."""

    grpc_server: grpc.aio.Server
    port: int
    gate: PeerGate | None = None
    socket_dir: pathlib.Path | None = None  # holds the gRPC server's Unix socket, behind the gate
    started: bool = False

    async def start(self) -> None:
        await self.grpc_server.start()
        self.started = True
        if self.gate is not None:
            await self.gate.start()

    async def stop(self) -> None:
        if self.gate is not None:
            await self.gate.close()
        if self.started:
            await self.grpc_server.stop(0)
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)


async def build_peer_server(
    service: PeerService, *, host: str, port: int, tls: PeerTls | None, refusals: PeerRefusals
) -> PeerServer:
    """With `tls`, the port is the gate and gRPC listens on a Unix socket only this user can
    reach (a 0700 directory); without, gRPC listens on the port in plaintext."""
    server = grpc.aio.server(options=(("grpc.so_reuseport", 0),))
    pb_grpc.add_PeerExchangeServicer_to_server(service, server)
    if tls is None:
        return PeerServer(server, bind(server, grpc_address(host, port), None))
    socket_dir = pathlib.Path(tempfile.mkdtemp(prefix="epp-peers-"))
    try:
        backend = str(socket_dir / "exchange.sock")
        bind(server, f"unix:{backend}", None)
        gate = PeerGate(tls, refusals, backend=backend)
        bound = await gate.bind(host, port)
    except BaseException:
        shutil.rmtree(socket_dir, ignore_errors=True)
        with contextlib.suppress(Exception):
            await server.stop(0)
        raise
    return PeerServer(server, bound, gate, socket_dir)
