"""The peer port's front door: mutual TLS, checked and counted here, in front of the gRPC server.

gRPC's own TLS (`ssl_server_credentials(require_client_auth=True)`) refuses a peer without a
valid certificate inside its core, before any Python code runs: such a peer could be neither
counted nor logged. So the port is an asyncio server that does the handshake itself (the pool's
CA required, HTTP/2 by ALPN), checks the client certificate names this pool, and only then
relays the connection's bytes to the exchange's gRPC server, which listens on a Unix socket in a
private directory and speaks plaintext to this process alone. Every refusal is classified
(`refusals.Refusal`), counted and logged.

The relay costs a read and a write per batch on the loop the EPP already runs; batches are
small and come every `--peer-interval`, so it is no measurable part of an EPP's CPU (see the
active-active benchmark in docs/cluster.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import Any

from epp.picker.listen import ListenError
from epp.picker.peers.credentials import PeerTls, certificate_names
from epp.picker.peers.refusals import PeerRefusals, Refusal

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 5.0
CHUNK_BYTES = 64 * 1024


def classify(error: BaseException) -> Refusal:
    """Why a TLS handshake on the peer port failed, from what `ssl` reports."""
    if isinstance(error, ssl.SSLCertVerificationError):
        return Refusal.UNTRUSTED_CERTIFICATE
    if isinstance(error, ssl.SSLError) and error.reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
        return Refusal.NO_CERTIFICATE
    return Refusal.HANDSHAKE


class PeerGate:
    """Accepts peer connections over mutual TLS and relays them to `backend` (a Unix socket).

    TLS runs over the connection's plain stream through `ssl.MemoryBIO` (`_TlsStream`), not the
    loop's `start_tls`: every byte the peer sent is in the stream's buffer, however early it came,
    and the handshake's failure is ours to classify on every event loop (uvloop included).
    """

    def __init__(
        self,
        tls: PeerTls,
        refusals: PeerRefusals,
        *,
        backend: str,
        handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
    ) -> None:
        self._context = tls.server_context()
        self._identity = tls.identity
        self._refusals = refusals
        self._backend = backend
        self._handshake_timeout_s = handshake_timeout_s
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self.relayed = 0  # connections let through

    def use(self, tls: PeerTls) -> None:
        """Handshakes from now on use renewed certificates; connections already up keep theirs."""
        self._context = tls.server_context()

    async def bind(self, host: str, port: int) -> int:
        """Take the port now (a taken one is a ListenError); accept only after `start`."""
        try:
            self._server = await asyncio.start_server(
                self._connection,
                host=host,
                port=port,
                start_serving=False,
                reuse_address=True,
                limit=2 * CHUNK_BYTES,
            )
        except OSError as err:
            raise ListenError(f"cannot listen on {host}:{port}: {err.strerror or err}") from err
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def start(self) -> None:
        assert self._server is not None, "bind first"
        await self._server.start_serving()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._open):
            writer.transport.abort()
        if self._server is not None:
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open.add(writer)
        try:
            tls = await self._admit(reader, writer)
            if tls is not None:
                await self._relay(tls)
        finally:
            self._open.discard(writer)
            writer.transport.abort()  # no lingering: the TLS side said goodbye or was refused

    async def _admit(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> _TlsStream | None:
        """The TLS handshake and the identity check; the secured stream, or None if refused."""
        peer = _peer_name(writer.get_extra_info("peername"))
        tls = _TlsStream(reader, writer, self._context)
        try:
            async with asyncio.timeout(self._handshake_timeout_s):
                await tls.handshake()
        except (OSError, EOFError, TimeoutError) as err:  # ssl.SSLError is an OSError
            self._refusals.refuse(classify(err), peer=peer, detail=_describe(err))
            return None
        names = certificate_names(tls.peercert())
        if self._identity not in names:
            self._refusals.refuse(
                Refusal.FOREIGN_IDENTITY,
                peer=peer,
                detail=f"certificate names {', '.join(names) or 'nothing'}, not {self._identity}",
            )
            return None
        return tls

    async def _relay(self, tls: _TlsStream) -> None:
        try:
            backend_reader, backend_writer = await asyncio.open_unix_connection(self._backend)
        except OSError as err:  # the gRPC server is stopping
            log.debug("peer exchange backend unavailable", extra={"error": str(err)})
            return
        self.relayed += 1
        pipes = [
            asyncio.create_task(_from_peer(tls, backend_writer)),
            asyncio.create_task(_to_peer(backend_reader, tls)),
        ]
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in pipes:
                pipe.cancel()
            backend_writer.close()
            await asyncio.gather(*pipes, return_exceptions=True)


class _TlsStream:
    """Server-side TLS over a plain stream: records in through `incoming`, out through `outgoing`.

    One task reads and one writes; each `_flush` hands every pending record to the transport
    without awaiting in between, so records leave in the order the TLS object made them.
    """

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, context: ssl.SSLContext
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)

    async def handshake(self) -> None:
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush()
                await self._receive()
            except ssl.SSLError:
                with contextlib.suppress(OSError):
                    await self._flush()  # the alert tells the peer why
                raise
        await self._flush()

    def peercert(self) -> dict[str, Any]:
        return dict(self._tls.getpeercert() or {})

    async def read(self) -> bytes:
        """Decrypted bytes; b"" once the peer closed (cleanly or not)."""
        while True:
            try:
                data = self._tls.read(CHUNK_BYTES)
            except ssl.SSLWantReadError:
                await self._flush()  # e.g. post-handshake messages
                try:
                    await self._receive()
                except EOFError:
                    return b""
                continue
            except ssl.SSLZeroReturnError:
                return b""
            await self._flush()
            return data

    async def write(self, data: bytes) -> None:
        self._tls.write(data)
        await self._flush()

    async def _receive(self) -> None:
        data = await self._reader.read(CHUNK_BYTES)
        if not data:
            raise EOFError("the peer closed the connection during TLS")
        self._incoming.write(data)

    async def _flush(self) -> None:
        if self._outgoing.pending:
            self._writer.write(self._outgoing.read())
            await self._writer.drain()


async def _from_peer(tls: _TlsStream, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await tls.read():
            sink.write(data)
            await sink.drain()


async def _to_peer(source: asyncio.StreamReader, tls: _TlsStream) -> None:
    with contextlib.suppress(OSError):
        while data := await source.read(CHUNK_BYTES):
            await tls.write(data)


def _describe(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return "no TLS handshake within the timeout"
    return str(error) or type(error).__name__


def _peer_name(address: object) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = str(address[0]), address[1]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return str(address)
