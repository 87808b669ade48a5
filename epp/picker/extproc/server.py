"""The ext_proc gRPC server: one `StreamHandler` per `Process` stream, on grpc.aio.

Options that matter (measured against Envoy 1.40): a 64 MiB receive limit (BUFFERED bodies and large
FDX chunks),
and `grpc.so_reuseport` 0 so a stale EPP on the same port makes the bind fail loudly.
"""

from __future__ import annotations

import logging
import pathlib
import threading
from collections.abc import AsyncIterator

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2_grpc

from epp import tls
from epp._proto.envoy.service.accesslog.v3 import als_pb2_grpc
from epp._proto.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp._proto.envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from epp.errors import ConfigError
from epp.picker import wire
from epp.picker.extproc.accesslog import AccessLogReceiver
from epp.picker.extproc.stream import Pending, ProtocolError, StreamHandler, StreamOptions
from epp.picker.listen import bind, grpc_address
from epp.picker.logs import bound_request_id, request_id_var

log = logging.getLogger(__name__)

SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", wire.GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", wire.GRPC_MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
)


class ExternalProcessor(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """`envoy.service.ext_proc.v3.ExternalProcessor/Process` backed by the director."""

    def __init__(self, options: StreamOptions) -> None:
        self._options = options

    async def Process(  # the gRPC method name
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext[pb.ProcessingRequest, pb.ProcessingResponse],
    ) -> AsyncIterator[pb.ProcessingResponse]:
        handler = StreamHandler(self._options, peer=context.peer())
        try:
            async for message in _decoded(request_iterator, context):
                # The request id on this message's log lines; set and reset inline (not a
                # context manager) because it happens for every message.
                bound = request_id_var.set(handler.request_id or "-")
                try:
                    answer = handler.handle(message)
                    if isinstance(answer, Pending):
                        # Waiting (a flow-control queue, an adapter load) holds only this stream.
                        for reply in answer.now:
                            yield reply
                        replies = await handler.resume()
                    else:
                        replies = answer
                except ProtocolError as err:
                    log.warning("ext_proc protocol error", extra={"error": str(err)})
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
                    return
                except Exception:  # the one per-request guard: log, answer 500, keep serving
                    log.exception("unexpected error while routing a request")
                    replies = handler.fail_internal()
                finally:
                    request_id_var.reset(bound)
                for reply in replies:
                    yield reply
                if handler.done:
                    return
        finally:
            with bound_request_id(handler.request_id or "-"):
                handler.close()


async def _decoded(
    request_iterator: AsyncIterator[pb.ProcessingRequest],
    context: grpc.aio.ServicerContext[pb.ProcessingRequest, pb.ProcessingResponse],
) -> AsyncIterator[pb.ProcessingRequest]:
    """The stream's messages; one that is not a valid ProcessingRequest ends it with INVALID_ARGUMENT."""
    try:
        async for message in request_iterator:
            yield message
    except DecodeError:
        log.warning("malformed ext_proc message")
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed ext_proc message")


class CertReloader:
    """A grpc certificate fetcher that re-reads `tls.crt`/`tls.key` when their mtimes change.

    grpc calls it before every TLS handshake (from its own threads), so it only stats the files.
    """

    def __init__(self, cert_dir: pathlib.Path) -> None:
        self._cert_dir = cert_dir
        self._lock = threading.Lock()
        self._mtimes = tls.cert_files_mtime(cert_dir)

    def initial(self) -> grpc.ServerCertificateConfiguration:
        pair = tls.load_key_pair(self._cert_dir)
        return grpc.ssl_server_certificate_configuration([(pair.key_pem, pair.cert_pem)])

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        mtimes = tls.cert_files_mtime(self._cert_dir)
        with self._lock:
            if mtimes is None or mtimes == self._mtimes:
                return None
            try:
                pair = tls.load_key_pair(self._cert_dir)
            except ConfigError as err:
                log.warning("keeping the current certificate", extra={"error": str(err)})
                return None
            self._mtimes = mtimes
        log.info("certificate reloaded", extra={"cert_path": str(self._cert_dir)})
        return grpc.ssl_server_certificate_configuration([(pair.key_pem, pair.cert_pem)])


def server_credentials(cert_path: pathlib.Path | None) -> grpc.ServerCredentials:
    """TLS credentials: files under `cert_path` (reloaded on change) or a fresh self-signed pair."""
    if cert_path is None:
        pair = tls.self_signed()
        return grpc.ssl_server_credentials([(pair.key_pem, pair.cert_pem)])
    reloader = CertReloader(cert_path)
    return grpc.dynamic_ssl_server_credentials(reloader.initial(), reloader)


def build_ext_proc_server(
    processor: ExternalProcessor,
    *,
    host: str,
    port: int,
    credentials: grpc.ServerCredentials | None,
    health_servicer: object | None = None,
    access_log: AccessLogReceiver | None = None,
) -> tuple[grpc.aio.Server, int]:
    """A not-yet-started grpc.aio server with the processor; returns it and the bound port.

    With `health_servicer`, grpc.health.v1 is served on this port too, for data planes whose
    EPP cluster health-checks the ext_proc port (GIE's reference Envoy config does). With
    `access_log`, the gateway's gRPC access logger can send its entries to the same address.
    """
    server = grpc.aio.server(options=SERVER_OPTIONS)
    pb_grpc.add_ExternalProcessorServicer_to_server(processor, server)
    if access_log is not None:
        als_pb2_grpc.add_AccessLogServiceServicer_to_server(access_log, server)
    if health_servicer is not None:
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = bind(server, grpc_address(host, port), credentials)
    return server, bound
