"""The ext_proc gRPC server: one `StreamHandler` per `Process` stream, on grpc.aio.

Options that matter (measured against Envoy 1.40): a 64 MiB receive limit (BUFFERED bodies and large
FDX chunks),
and `grpc.so_reuseport` 0 so a stale EPP on the same port makes the bind fail loudly.

`Process` is registered as a stream-request, unary-response method: every reply but the last is
written as it is ready, and the last one is the method's return value, which grpc sends in one
batch with the OK status. When the EPP leaves a stream after routing, that makes the reply that
lets the request go upstream and the close reach Envoy in one write, so Envoy has stopped
consulting the EPP before the model server can answer: no response byte is handed to a stream
that is already over. (Yielded one by one, the status follows in a write of its own, and
response bytes that reach Envoy in between are lost: with a model server that answers at once, 6
to 94 of every 100 responses, the more the busier the EPP's loop.) On the wire the method is the
same bidirectional stream.
"""

from __future__ import annotations

import logging
import pathlib
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2_grpc
from prometheus_client.core import CounterMetricFamily

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

PROCESS_METHOD = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"

SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", wire.GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", wire.GRPC_MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
)


@dataclass(slots=True)
class StreamCounts:
    """What the ext_proc streams cost, counted since start: the messages Envoy sent and the replies,
    and how each stream ended for the EPP (`StreamHandler.ending`)."""

    received: int = 0
    sent: int = 0
    endings: dict[str, int] = field(default_factory=dict)


class StreamCountsCollector:
    """`StreamCounts` as Prometheus counters: `inference_extension_ext_proc_streams_total{ending}` and
    `inference_extension_ext_proc_messages_total{direction}` (received from the data plane, sent
    back). Messages per stream show whether the response passes through the EPP (one message per
    chunk) or not (about three)."""

    def __init__(self, counts: StreamCounts) -> None:
        self._counts = counts

    def collect(self) -> Iterator[CounterMetricFamily]:
        counts = self._counts
        streams = CounterMetricFamily(
            "inference_extension_ext_proc_streams",
            "ext_proc streams that ended, by how they ended for the EPP",
            labels=["ending"],
        )
        for ending, count in sorted(counts.endings.items()):
            streams.add_metric([ending], count)
        yield streams
        messages = CounterMetricFamily(
            "inference_extension_ext_proc_messages",
            "ext_proc messages, received from the data plane and sent back",
            labels=["direction"],
        )
        messages.add_metric(["received"], counts.received)
        messages.add_metric(["sent"], counts.sent)
        yield messages


class ExternalProcessor(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """`envoy.service.ext_proc.v3.ExternalProcessor/Process` backed by the director."""

    def __init__(self, options: StreamOptions) -> None:
        self._options = options
        self.counts = StreamCounts()

    async def Process(  # the gRPC method name
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext[pb.ProcessingRequest, pb.ProcessingResponse],
    ) -> AsyncIterator[pb.ProcessingResponse]:
        """Every reply of one stream, in order (the servicer shape; see `process_last_with_status`)."""
        async for reply, _ in self.replies(request_iterator, context):
            yield reply

    async def process_last_with_status(
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext[pb.ProcessingRequest, bytes],
    ) -> bytes:
        """The registered handler: writes each reply, and returns the stream's last one (sent with
        the OK status in one batch). A stream the data plane ended first returns an empty reply,
        which nothing reads."""
        async for reply, last in self.replies(request_iterator, context):
            payload: bytes = reply.SerializeToString()
            if last:
                return payload
            await context.write(payload)
        return b""

    async def replies(
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext[pb.ProcessingRequest, pb.ProcessingResponse],
    ) -> AsyncIterator[tuple[pb.ProcessingResponse, bool]]:
        """Each reply, and whether it is the stream's last (the EPP ends the stream after it)."""
        handler = StreamHandler(self._options, peer=context.peer())
        counts = self.counts
        try:
            async for message in _decoded(request_iterator, context):
                counts.received += 1
                # The request id on this message's log lines; set and reset inline (not a
                # context manager) because it happens for every message.
                bound = request_id_var.set(handler.request_id or "-")
                try:
                    answer = handler.handle(message)
                    if isinstance(answer, Pending):
                        # Waiting (a flow-control queue, an adapter load) holds only this stream.
                        for reply in answer.now:
                            counts.sent += 1
                            yield reply, False
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
                counts.sent += len(replies)
                done = handler.done
                for index, reply in enumerate(replies):
                    yield reply, done and index == len(replies) - 1
                if done:
                    return
        finally:
            ending = handler.ending
            counts.endings[ending] = counts.endings.get(ending, 0) + 1
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


class _ProcessHandler(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Serves `Process` as stream-request, unary-response (see the module docstring)."""

    def __init__(self, processor: ExternalProcessor) -> None:
        self._handler = grpc.stream_unary_rpc_method_handler(
            processor.process_last_with_status,
            request_deserializer=pb.ProcessingRequest.FromString,
            response_serializer=None,  # the handler writes and returns serialized replies
        )

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if handler_call_details.method == PROCESS_METHOD:
            return self._handler
        return None


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
    server.add_generic_rpc_handlers((_ProcessHandler(processor),))
    if access_log is not None:
        als_pb2_grpc.add_AccessLogServiceServicer_to_server(access_log, server)
    if health_servicer is not None:
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = bind(server, grpc_address(host, port), credentials)
    return server, bound
