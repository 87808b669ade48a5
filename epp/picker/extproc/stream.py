"""The per-stream state machine: one `StreamHandler` per ext_proc `Process` stream (one HTTP request).

`handle(message)` takes one `ProcessingRequest` and returns the replies to send, in order. It
is synchronous: routing is pure CPU work, so a slow or stalled peer only holds its own stream.

FULL_DUPLEX_STREAMED defers the headers reply until the body has ended, then sends headers
(destination, Content-Length, metadata) and the body back in 62000-byte chunks. BUFFERED
answers headers at once and routes on the whole-body message. The mode comes from
`protocol_config` on the first message, else the configured default.

When the data plane announces that no response body follows (`response_body_mode: NONE`, the
default of every Envoy config we generate), the stream ends as soon as the request is routed
(`done`), so an EPP that stops or dies cannot cut a response. The request then finishes when the
gateway's access-log entry for it arrives (`Completions`), or at once when that gateway sends none.
When the response does pass through, it finishes at the response's end, as before.
"""

from __future__ import annotations

import enum
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.clock import Clock
from epp.errors import EppError, ErrorCode
from epp.picker import wire
from epp.picker.context import RequestContext
from epp.picker.director import RoutingDecision
from epp.picker.extproc import messages
from epp.picker.extproc.completions import Completion, Completions
from epp.picker.outcome import FinishedBy, StreamRecord, Usage

log = logging.getLogger(__name__)

_BodySendMode = processing_mode_pb2.ProcessingMode


class BodyMode(enum.Enum):
    FULL_DUPLEX_STREAMED = "FULL_DUPLEX_STREAMED"
    BUFFERED = "BUFFERED"
    NONE = "NONE"  # no body will come: route on headers


def body_mode_from_proto(value: int) -> BodyMode | None:
    """The mode the data plane announced; None for modes we cannot serve (STREAMED, GRPC)."""
    if value == _BodySendMode.FULL_DUPLEX_STREAMED:
        return BodyMode.FULL_DUPLEX_STREAMED
    if value in (_BodySendMode.BUFFERED, _BodySendMode.BUFFERED_PARTIAL):
        return BodyMode.BUFFERED
    if value == _BodySendMode.NONE:
        return BodyMode.NONE
    return None


@dataclass(frozen=True, slots=True)
class StreamSettings:
    default_body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED
    max_request_body_bytes: int = wire.DEFAULT_MAX_REQUEST_BODY_BYTES
    max_header_bytes: int = wire.DEFAULT_MAX_HEADER_BYTES
    # A non-streaming response body larger than this is passed through unparsed instead of buffered.
    max_buffered_response_bytes: int = wire.DEFAULT_MAX_REQUEST_BODY_BYTES


class Router(Protocol):
    """What a stream needs of the picker: a decision for a request, and word when it finished."""

    def route(
        self,
        *,
        request_id: str,
        headers: Mapping[str, str],
        body: bytes | None,
        subset: Sequence[str] | None = None,
        context: RequestContext | None = None,
    ) -> RoutingDecision: ...

    def complete(self, decision: RoutingDecision, *, served_address: str | None, status: int) -> None: ...


# A step between the pick and the reply that may wait (only this stream waits): the composition
# root plugs in on-demand adapter loading this way. It returns the decision to send, or raises
# `EppError` for the stream to answer.
Hold = Callable[[RoutingDecision], Awaitable[RoutingDecision]]


@dataclass(frozen=True, slots=True)
class StreamOptions:
    """What every stream of one server shares: the router, limits and the hooks around a stream."""

    router: Router
    settings: StreamSettings = StreamSettings()
    on_finished: Callable[[StreamRecord], None] | None = None
    clock: Clock | None = None  # only to time the first response byte (TTFT); None: not timed
    # When set, `prepare` picks ahead of `handle` and awaits the hold before answering.
    hold: Hold | None = None
    # Finishing requests from the gateway's access log; None: each finishes when its stream ends.
    completions: Completions | None = None


# The only response headers the stream reads (status for metrics, content type for SSE).
_RESPONSE_HEADERS_READ = frozenset({":status", "content-type"})


class ProtocolError(Exception):
    """A message the ext_proc contract does not allow here; the server ends the stream with a gRPC error."""


class StreamHandler:
    """Serves one ext_proc stream. Not thread-safe; lives on the event loop.

    `peer` is the data plane's grpc peer string: its access-log stream, if it has one, comes
    from the same host.
    """

    def __init__(self, options: StreamOptions, *, peer: str = "") -> None:
        self._router = options.router
        self._settings = options.settings
        self._hold = options.hold
        self.context = RequestContext()
        self._completions = options.completions
        self._peer = peer
        self._completion_key = ""
        self._logged: Completion | None = None  # an access-log entry that came while the stream was open
        self._prepared: RoutingDecision | None = None
        self._prepared_error: EppError | None = None
        self._on_finished = options.on_finished
        self._clock = options.clock
        self._first_response_body_at_s: float | None = None
        self._mode: BodyMode | None = None
        self._response_mode: BodyMode | None = None
        self.request_id = ""
        self._headers: dict[str, str] = {}
        self._strip: list[str] = []
        self._generated_request_id = False
        self._body = bytearray()
        self._subset: list[str] | None = None
        self._served: str | None = None  # envoy.lb served endpoint, when the data plane reports it
        self._decision: RoutingDecision | None = None
        self._error: EppError | None = None
        self._request_done = False
        self._status: int | None = None
        self._sse = False
        self._response_buffer = bytearray()
        self._passthrough = False
        self._sse_tail = b""
        self._usage: Usage | None = None
        self._response_bytes = 0
        self._finished = False
        self._completed = False
        # Nothing more to do on this stream (an ImmediateResponse was sent, or the request was
        # routed and no response follows): the server ends it.
        self.done = False

    # -- entry points ----------------------------------------------------------------------

    def handle(self, message: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        """Replies to one message; an `EppError` becomes an ImmediateResponse and ends the stream."""
        if self.done:
            return []
        self._read_protocol_config(message)
        self._read_subset_hint(message)
        try:
            return self._dispatch(message)
        except EppError as err:
            return [self._fail(err)]

    @property
    def wants_prepare(self) -> bool:
        """Whether `prepare` may pick ahead (an adapter loader is set and the request is not routed)."""
        return self._hold is not None and not self.done and not self._request_done

    async def prepare(self, message: pb.ProcessingRequest) -> None:
        """Pick ahead of `handle` when `message` completes the request and an adapter may need loading.

        The pick (or its error) is kept for `handle`, which then answers without picking again.
        Without a loader, or for any other message, this does nothing.
        """
        if self._hold is None or self.done or self._request_done:
            return
        self._read_protocol_config(message)
        self._read_subset_hint(message)
        kind = message.WhichOneof("request")
        if kind == "request_body":
            chunk = message.request_body
            if len(self._body) + len(chunk.body) > self._settings.max_request_body_bytes:
                return  # `handle` answers 400
            if self.mode is not BodyMode.BUFFERED and not chunk.end_of_stream:
                return
            body = bytes(self._body) + chunk.body
        elif kind == "request_trailers" and self.mode is BodyMode.FULL_DUPLEX_STREAMED:
            body = bytes(self._body)
        else:
            return
        try:
            decision = self._router.route(
                request_id=self.request_id,
                headers=self._headers,
                body=body,
                subset=self._subset,
                context=self.context,
            )
            self._prepared = await self._hold(decision)
        except EppError as err:
            self._prepared_error = err

    def fail_internal(self) -> list[pb.ProcessingResponse]:
        """The reply for an unexpected error while handling a message (500)."""
        if self.done:
            return []
        return [self._fail(EppError(ErrorCode.INTERNAL, "internal error", reason="internal"))]

    def close(self) -> None:
        """The stream ended (EOF, cancel, after an ImmediateResponse or once routed): report once.

        A routed request whose response did not pass through waits for its access-log entry when
        the gateway sends one; otherwise it finishes now.
        """
        if self._finished:
            return
        self._finished = True
        key, completions = self._completion_key, self._completions
        if self._decision is None or self._completed or key == "" or completions is None:
            self._finish(FinishedBy.RESPONSE if self._completed else FinishedBy.STREAM_END)
        elif self._logged is not None:
            self._finish_from_log(self._logged)
        elif completions.receives_from(self._peer):
            completions.wait(key, self._peer)
        else:
            completions.forget(key)
            self._finish(FinishedBy.STREAM_END)

    def _finish_from_log(self, completion: Completion | None) -> None:
        """The access-log entry for this request came (or, with None, never will)."""
        if not self._finished:
            self._logged = completion  # the stream is still open: `close` uses it
            return
        if completion is None:
            self._finish(FinishedBy.EXPIRED)
            return
        self._status = completion.status
        if completion.served_address:
            self._served = completion.served_address
        self._response_bytes = completion.response_body_bytes
        self._finish(FinishedBy.ACCESS_LOG, completion)

    def _finish(self, finished_by: FinishedBy, completion: Completion | None = None) -> None:
        """Tell the director (once) and report the stream."""
        self._complete()
        if self._completion_key and self._completions is not None:
            self._completions.forget(self._completion_key)
        decision = self._decision
        if decision is not None and log.isEnabledFor(logging.DEBUG):
            log.debug(
                "request finished",
                extra={
                    "request_id": self.request_id,
                    "status": self._status,
                    "served": self._served,
                    "finished_by": finished_by.value,
                },
            )
        if self._on_finished is None:
            return
        ttft_s = None
        if completion is not None:
            ttft_s = completion.ttft_s
        elif decision is not None and self._first_response_body_at_s is not None:
            ttft_s = self._first_response_body_at_s - decision.request.arrival_s
        self._on_finished(
            StreamRecord(
                request_id=self.request_id,
                decision=decision,
                error=self._error,
                response_status=self._status,
                streaming_response=self._sse,
                usage=self._usage,
                request_body_bytes=len(self._body),
                response_body_bytes=self._response_bytes,
                ttft_s=ttft_s,
                duration_s=completion.duration_s if completion is not None else None,
                finished_by=finished_by if decision is not None else None,
                served_address=self._served,
                context=self.context,
            )
        )

    @property
    def mode(self) -> BodyMode:
        return self._mode if self._mode is not None else self._settings.default_body_mode

    # -- dispatch --------------------------------------------------------------------------

    def _dispatch(self, message: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        kind = message.WhichOneof("request")
        if kind == "request_headers":
            return self._on_request_headers(message.request_headers)
        if kind == "request_body":
            return self._on_request_body(message.request_body)
        if kind == "request_trailers":
            return self._on_request_trailers()
        if kind == "response_headers":
            return self._on_response_headers(message.response_headers)
        if kind == "response_body":
            return self._on_response_body(message.response_body)
        if kind == "response_trailers":
            self._end_response()
            return [messages.empty_response_trailers_reply()]
        raise ProtocolError(f"unexpected ext_proc message {kind!r}")

    def _read_protocol_config(self, message: pb.ProcessingRequest) -> None:
        if self._mode is not None or not message.HasField("protocol_config"):
            return
        config = message.protocol_config
        mode = body_mode_from_proto(config.request_body_mode)
        if mode is None:
            log.warning(
                "unsupported request body mode, using the configured default",
                extra={"request_body_mode": _BodySendMode.BodySendMode.Name(config.request_body_mode)},
            )
            mode = self._settings.default_body_mode
        self._mode = mode
        self._response_mode = body_mode_from_proto(config.response_body_mode)

    def _read_subset_hint(self, message: pb.ProcessingRequest) -> None:
        if not message.HasField("metadata_context"):
            return
        metadata = message.metadata_context.filter_metadata
        served = messages.struct_field(metadata, wire.LB_METADATA_NAMESPACE, wire.SERVED_ENDPOINT_KEY)
        if isinstance(served, str) and served:
            self._served = served
        value = messages.struct_field(metadata, wire.SUBSET_HINT_NAMESPACE, wire.SUBSET_HINT_KEY)
        if value is None:
            return
        if isinstance(value, str):
            self._subset = [value]
        elif isinstance(value, list):
            self._subset = [v for v in value if isinstance(v, str)]
        else:
            self._subset = []  # present but unusable: nothing is eligible (503)

    # -- request path ----------------------------------------------------------------------

    def _on_request_headers(self, headers: pb.HttpHeaders) -> list[pb.ProcessingResponse]:
        self._headers = messages.header_map(headers)
        header_bytes = sum(len(k) + len(v) for k, v in self._headers.items())
        self.request_id = self._headers.get(wire.REQUEST_ID_HEADER, "") or str(uuid.uuid4())
        self._generated_request_id = (
            wire.REQUEST_ID_HEADER not in self._headers or not self._headers[wire.REQUEST_ID_HEADER]
        )
        if header_bytes > self._settings.max_header_bytes:
            raise EppError(ErrorCode.BAD_REQUEST, "request headers too large", reason="headers-too-large")
        self._strip = [
            name
            for name in self._headers
            if name in wire.STRIPPED_CLIENT_HEADERS and name != wire.DESTINATION_ENDPOINT_HEADER
        ]
        if headers.end_of_stream or self.mode is BodyMode.NONE:
            return [self._route_headers_only()]
        if self.mode is BodyMode.BUFFERED:
            remove = list(self._strip)
            if wire.DESTINATION_ENDPOINT_HEADER in self._headers:
                remove.append(wire.DESTINATION_ENDPOINT_HEADER)
            return [
                messages.request_headers_reply(set_headers=self._request_id_headers(), remove_headers=remove)
            ]
        return []  # FULL_DUPLEX_STREAMED: the headers reply waits for the body

    def _on_request_body(self, body: pb.HttpBody) -> list[pb.ProcessingResponse]:
        if self._request_done:
            raise ProtocolError("request body after the request was routed")
        if len(self._body) + len(body.body) > self._settings.max_request_body_bytes:
            raise EppError(ErrorCode.BAD_REQUEST, "request body too large", reason="body-too-large")
        self._body.extend(body.body)
        if self.mode is BodyMode.BUFFERED:
            # One whole-body message; BUFFERED_PARTIAL may end without end_of_stream, so route now.
            return [self._route_buffered()]
        if not body.end_of_stream:
            return []
        return self._route_streamed()

    def _on_request_trailers(self) -> list[pb.ProcessingResponse]:
        replies: list[pb.ProcessingResponse] = []
        if not self._request_done and self.mode is BodyMode.FULL_DUPLEX_STREAMED:
            replies.extend(self._route_streamed())
        replies.append(messages.empty_request_trailers_reply())
        return replies

    def _route(self, body: bytes | None) -> RoutingDecision:
        if self._prepared_error is not None:
            raise self._prepared_error
        if self._prepared is not None:
            decision = self._prepared
        else:
            decision = self._router.route(
                request_id=self.request_id,
                headers=self._headers,
                body=body,
                subset=self._subset,
                context=self.context,
            )
        self._decision = decision
        self._request_done = True
        if self._completions is not None:
            self._completion_key = self._completions.expect(self._finish_from_log)
        if self._response_mode is BodyMode.NONE:
            self.done = True  # no response follows: end the stream now
        if log.isEnabledFor(logging.DEBUG):  # the fields cost more than the call when it is off
            log.debug(
                "request routed",
                extra={
                    "destination": decision.destination,
                    "model": decision.request.target_model,
                    "reason": decision.result.reason,
                },
            )
        return decision

    def _route_headers_only(self) -> pb.ProcessingResponse:
        decision = self._route(None)
        destination = decision.destination
        return messages.request_headers_reply(
            set_headers=messages.routing_headers(destination, None, self._routed_headers()),
            remove_headers=self._strip,
            destination=destination,
            completion_key=self._completion_key,
        )

    def _route_streamed(self) -> list[pb.ProcessingResponse]:
        decision = self._route(bytes(self._body))
        destination = decision.destination
        headers = messages.request_headers_reply(
            set_headers=messages.routing_headers(destination, len(decision.body), self._routed_headers()),
            remove_headers=self._strip,
            destination=destination,
            completion_key=self._completion_key,
        )
        return [headers, *messages.chunked_request_body(decision.body)]

    def _route_buffered(self) -> pb.ProcessingResponse:
        decision = self._route(bytes(self._body))
        return messages.buffered_request_body_reply(
            decision.body, decision.destination, self._routed_headers(), self._completion_key
        )

    def _routed_headers(self) -> list[tuple[str, str]]:
        headers = self._request_id_headers()
        headers.extend(self.context.upstream_headers)
        return headers

    def _request_id_headers(self) -> list[tuple[str, str]]:
        return [(wire.REQUEST_ID_HEADER, self.request_id)] if self._generated_request_id else []

    # -- response path ---------------------------------------------------------------------

    def _on_response_headers(self, headers: pb.HttpHeaders) -> list[pb.ProcessingResponse]:
        response_headers = messages.header_values(headers, _RESPONSE_HEADERS_READ)
        try:
            self._status = int(response_headers.get(":status", "200"))
        except ValueError:
            self._status = None
        self._sse = wire.SSE_CONTENT_TYPE in response_headers.get("content-type", "")
        if headers.end_of_stream:
            self._end_response()
        return [messages.response_headers_reply()]

    def _response_body_mode(self) -> BodyMode:
        if self._response_mode is not None:
            return self._response_mode
        return self.mode

    def _on_response_body(self, body: pb.HttpBody) -> list[pb.ProcessingResponse]:
        if body.body and self._first_response_body_at_s is None and self._clock is not None:
            self._first_response_body_at_s = self._clock.now()
        self._response_bytes += len(body.body)
        if self._response_body_mode() is not BodyMode.FULL_DUPLEX_STREAMED:
            self._read_usage(body.body, end=body.end_of_stream)
            if body.end_of_stream:
                self._end_response()
            return [messages.empty_response_body_reply()]
        if self._sse or self._passthrough:
            if self._sse:
                self._read_sse_usage(body.body)
            if body.end_of_stream:
                self._end_response()
            return [messages.streamed_response_body(body.body, body.end_of_stream)]
        self._response_buffer.extend(body.body)
        if len(self._response_buffer) > self._settings.max_buffered_response_bytes:
            # Too large to inspect: hand back what we hold and pass the rest through.
            self._passthrough = True
            held = bytes(self._response_buffer)
            self._response_buffer.clear()
            if body.end_of_stream:
                self._end_response()
                return messages.chunked_response_body(held)
            return [messages.streamed_response_body(c, False) for c, _ in messages.chunks(held)]
        if not body.end_of_stream:
            return []
        whole = bytes(self._response_buffer)
        self._response_buffer.clear()
        self._usage = parse_json_usage(whole) or self._usage
        self._end_response()
        return messages.chunked_response_body(whole)

    def _read_usage(self, chunk: bytes, *, end: bool) -> None:
        if self._sse:
            self._read_sse_usage(chunk)
        elif end:
            self._usage = parse_json_usage(chunk) or self._usage

    def _read_sse_usage(self, chunk: bytes) -> None:
        data = self._sse_tail + chunk if self._sse_tail else chunk
        end = data.rfind(b"\n") + 1  # complete lines end here
        self._sse_tail = data[end:][-65536:]  # an unfinished line waits for the next chunk
        # Only the last chunk of a stream carries usage: every other one costs two scans in C.
        if end and data.find(b'"usage"', 0, end) >= 0:
            for line in data[:end].split(b"\n"):
                usage = parse_sse_usage(line)
                if usage is not None:
                    self._usage = usage

    def _complete(self) -> None:
        """Tell the director the request finished (once): at response end, else at stream close."""
        if self._decision is None or self._completed:
            return
        self._completed = True
        self._router.complete(self._decision, served_address=self._served, status=self._status or 200)

    def _end_response(self) -> None:
        self._complete()
        if self._sse and self._sse_tail:
            usage = parse_sse_usage(self._sse_tail)
            if usage is not None:
                self._usage = usage
            self._sse_tail = b""

    # -- errors ----------------------------------------------------------------------------

    def _fail(self, err: EppError) -> pb.ProcessingResponse:
        self._error = err
        self._status = err.http_status
        self.done = True
        log.info(
            "request rejected",
            extra={"code": err.code.wire_name, "status": err.http_status, "reason": err.reason},
        )
        return messages.immediate_error(err)


def _usage_from(payload: object) -> Usage | None:
    if not isinstance(payload, dict):
        return None
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None

    def count(key: str) -> int:
        value = usage.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    return Usage(count("prompt_tokens"), count("completion_tokens"), count("total_tokens"))


def parse_json_usage(body: bytes) -> Usage | None:
    """`usage` of a non-streaming OpenAI response; None when absent or not JSON."""
    try:
        return _usage_from(json.loads(body))
    except (ValueError, UnicodeDecodeError, RecursionError):  # deep nesting: not a usage body
        return None


def parse_sse_usage(line: bytes) -> Usage | None:
    """`usage` from one SSE `data: {...}` line (present with `stream_options.include_usage`)."""
    line = line.strip()
    if not line.startswith(b"data:"):
        return None
    data = line[5:].strip()
    if not data or data == b"[DONE]" or b'"usage"' not in data:
        return None
    return parse_json_usage(data)
