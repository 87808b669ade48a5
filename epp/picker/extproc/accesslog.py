"""`envoy.service.accesslog.v3.AccessLogService`: the gateway tells the EPP how each routed request ended.

Envoy's gRPC access logger (`envoy.access_loggers.http_grpc`) streams batches of
`HTTPAccessLogEntry` after requests complete. The entries we use carry the completion key the EPP
put in the `envoy.lb` dynamic metadata when it routed the request; each is turned into a
`Completion` (status, the endpoint that answered, body bytes, duration, time to first byte) for
`Completions`. Where the gateway's ext_proc filter drops that metadata, the key comes from the
request header the EPP set beside it, which the gateway's access log is configured to record.
Entries without a key (requests the EPP did not route) are skipped.

On drain (SIGTERM) every access-log stream is ended at its next message, so the gateway opens its
next one to an EPP that stays: a leaving EPP keeps no log stream the next one would be waiting on.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc
from google.protobuf import duration_pb2

from epp._proto.envoy.data.accesslog.v3 import accesslog_pb2
from epp._proto.envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from epp.picker import wire
from epp.picker.extproc.completions import Completion, Completions

log = logging.getLogger(__name__)


def completion_key(entry: accesslog_pb2.HTTPAccessLogEntry) -> str:
    """The EPP's completion key in the entry's `envoy.lb` metadata, else in its logged request
    header (a gateway whose ext_proc filter drops the metadata logs the header the EPP set beside
    it), or "" when there is neither."""
    metadata = entry.common_properties.metadata.filter_metadata
    if wire.LB_METADATA_NAMESPACE in metadata:
        fields = metadata[wire.LB_METADATA_NAMESPACE].fields
        if wire.COMPLETION_KEY in fields:
            return str(fields[wire.COMPLETION_KEY].string_value)
    return str(entry.request.request_headers.get(wire.COMPLETION_KEY_HEADER, ""))


def _seconds(common: accesslog_pb2.AccessLogCommon, name: str) -> float | None:
    if not common.HasField(name):
        return None
    duration: duration_pb2.Duration = getattr(common, name)
    return duration.seconds + duration.nanos / 1e9


def completion_of(entry: accesslog_pb2.HTTPAccessLogEntry) -> Completion:
    """What the entry says of how its request ended."""
    common = entry.common_properties
    response = entry.response
    status = response.response_code.value if response.HasField("response_code") else None
    served: str | None = None
    if common.HasField("upstream_remote_address"):
        socket = common.upstream_remote_address.socket_address
        if socket.address:
            host = f"[{socket.address}]" if ":" in socket.address else socket.address
            served = f"{host}:{socket.port_value}"
    return Completion(
        status=status or None,  # 0: no response was sent
        served_address=served,
        response_body_bytes=response.response_body_bytes,
        duration_s=_seconds(common, "time_to_last_downstream_tx_byte"),
        ttft_s=_seconds(common, "time_to_first_upstream_rx_byte"),
    )


class AccessLogReceiver(als_pb2_grpc.AccessLogServiceServicer):  # type: ignore[misc]
    """Feeds `Completions` from every access-log stream a gateway opens."""

    def __init__(self, completions: Completions) -> None:
        self._completions = completions
        self._draining = False

    def drain(self) -> None:
        """End every access-log stream at its next message, and any new one at its first."""
        self._draining = True

    async def StreamAccessLogs(  # the gRPC method name
        self,
        request_iterator: AsyncIterator[als_pb2.StreamAccessLogsMessage],
        context: grpc.aio.ServicerContext[als_pb2.StreamAccessLogsMessage, als_pb2.StreamAccessLogsResponse],
    ) -> als_pb2.StreamAccessLogsResponse:
        completions = self._completions
        peer = context.peer()
        completions.log_stream_opened(peer)
        try:
            async for message in request_iterator:
                for entry in message.http_logs.log_entry:
                    key = completion_key(entry)
                    if key:
                        completions.on_entry(key, completion_of(entry))
                if self._draining:
                    break
        finally:
            completions.log_stream_closed(peer)
        return als_pb2.StreamAccessLogsResponse()
