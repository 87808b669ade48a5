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
from dataclasses import dataclass, field
from typing import Protocol

from epp._proto.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from epp._proto.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
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


@dataclass(slots=True)
class _RequestState:
    """The request as it arrives, up to its routing decision."""

    mode: BodyMode | None = None  # the request body mode announced; None: the configured default
    headers: dict[str, str] = field(default_factory=dict)
    strip: list[str] = field(default_factory=list)  # client headers the routed reply removes
    generated_id: bool = False  # the request id is ours, so the reply sets it upstream
    body: bytearray = field(default_factory=bytearray)
    subset: list[str] | None = None  # the data plane's subset hint, when it sent one
    # What `prepare` picked (after the hold) or the error it got; `handle` answers with it.
    ahead: RoutingDecision | EppError | None = None
    decision: RoutingDecision | None = None  # set once the request is routed


@dataclass(slots=True)
class _ResponseState:
    """The response as it passes through: its status, size and the usage it reports."""

    mode: BodyMode | None = None  # the response body mode announced; None: as the request's
    status: int | None = None
    sse: bool = False
    # A non-streaming body held to its end to read its usage, unless it grows too large to hold.
    buffer: bytearray = field(default_factory=bytearray)
    passthrough: bool = False
    sse_tail: bytes = b""  # an SSE line split across chunks, kept for the next one
    usage: Usage | None = None
    body_bytes: int = 0
    first_body_at_s: float | None = None  # on the options' clock, for TTFT


@dataclass(slots=True)
class _Outcome:
    """How the request ended, and what makes sure the director and `on_finished` hear it once."""

    served: str | None = None  # envoy.lb served endpoint, when the data plane reports it
    error: EppError | None = None
    completion_key: str = ""  # the key its access-log entry comes back with; "" when none will
    logged: Completion | None = None  # an access-log entry that came while the stream was open
    completed: bool = False  # the director was told
    closed: bool = False  # `close` ran: reported, or waiting on the access log


class StreamHandler:
    """Serves one ext_proc stream. Not thread-safe; lives on the event loop.

    `peer` is the data plane's grpc peer string: its access-log stream, if it has one, comes
    from the same host.
    """

    # Slots: the handler's attributes are read on every message of every stream.
    __slots__ = ("_options", "_outcome", "_peer", "_request", "_response", "context", "done", "request_id")

    def __init__(self, options: StreamOptions, *, peer: str = "") -> None:
        self._options = options
        self._peer = peer
        self.context = RequestContext()
        self.request_id = ""
        # Nothing more to do on this stream (an ImmediateResponse was sent, or the request was
        # routed and no response follows): the server ends it.
        self.done = False
        self._request = _RequestState()
        self._response = _ResponseState()
        self._outcome = _Outcome()

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
        return self._options.hold is not None and not self.done and self._request.decision is None

    async def prepare(self, message: pb.ProcessingRequest) -> None:
        """Pick ahead of `handle` when `message` completes the request and an adapter may need loading.

        Only the pick moves here, because it may wait on the hold: `handle` still takes the
        message and answers it, with this pick (or its error) instead of picking again.
        Without a loader, or for any other message, this does nothing.
        """
        hold = self._options.hold
        if hold is None or not self.wants_prepare:
            return
        self._read_protocol_config(message)
        self._read_subset_hint(message)
        request = self._request
        kind = message.WhichOneof("request")
        if kind == "request_body":
            chunk = message.request_body
            data = chunk.body
            try:
                if not self._body_ends(data, chunk.end_of_stream):
                    return
            except EppError:
                return  # `handle` answers it
            body = bytes(request.body) + data
        elif kind == "request_trailers" and self._trailers_end_body():
            body = bytes(request.body)
        else:
            return
        try:
            request.ahead = await hold(self._pick(body))
        except EppError as err:
            request.ahead = err

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
        outcome = self._outcome
        if outcome.closed:
            return
        outcome.closed = True
        key, completions = outcome.completion_key, self._options.completions
        if self._request.decision is None or outcome.completed or key == "" or completions is None:
            self._finish(FinishedBy.RESPONSE if outcome.completed else FinishedBy.STREAM_END)
        elif outcome.logged is not None:
            self._finish_from_log(outcome.logged)
        elif completions.receives_from(self._peer):
            completions.wait(key, self._peer)
        else:
            completions.forget(key)
            self._finish(FinishedBy.STREAM_END)

    def _finish_from_log(self, completion: Completion | None) -> None:
        """The access-log entry for this request came (or, with None, never will)."""
        outcome = self._outcome
        if not outcome.closed:
            outcome.logged = completion  # the stream is still open: `close` uses it
            return
        if completion is None:
            self._finish(FinishedBy.EXPIRED)
            return
        self._response.status = completion.status
        if completion.served_address:
            outcome.served = completion.served_address
        self._response.body_bytes = completion.response_body_bytes
        self._finish(FinishedBy.ACCESS_LOG, completion)

    def _finish(self, finished_by: FinishedBy, completion: Completion | None = None) -> None:
        """Tell the director (once) and report the stream."""
        self._complete()
        outcome, response, options = self._outcome, self._response, self._options
        if outcome.completion_key and options.completions is not None:
            options.completions.forget(outcome.completion_key)
        decision = self._request.decision
        if decision is not None and log.isEnabledFor(logging.DEBUG):
            log.debug(
                "request finished",
                extra={
                    "request_id": self.request_id,
                    "status": response.status,
                    "served": outcome.served,
                    "finished_by": finished_by.value,
                },
            )
        if options.on_finished is None:
            return
        ttft_s = None
        if completion is not None:
            ttft_s = completion.ttft_s
        elif decision is not None and response.first_body_at_s is not None:
            ttft_s = response.first_body_at_s - decision.request.arrival_s
        options.on_finished(
            StreamRecord(
                request_id=self.request_id,
                decision=decision,
                error=outcome.error,
                response_status=response.status,
                streaming_response=response.sse,
                usage=response.usage,
                request_body_bytes=len(self._request.body),
                response_body_bytes=response.body_bytes,
                ttft_s=ttft_s,
                duration_s=completion.duration_s if completion is not None else None,
                finished_by=finished_by if decision is not None else None,
                served_address=outcome.served,
                context=self.context,
            )
        )

    @property
    def mode(self) -> BodyMode:
        mode = self._request.mode
        return mode if mode is not None else self._options.settings.default_body_mode

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
        if self._request.mode is not None or not message.HasField("protocol_config"):
            return
        config = message.protocol_config
        mode = body_mode_from_proto(config.request_body_mode)
        if mode is None:
            log.warning(
                "unsupported request body mode, using the configured default",
                extra={"request_body_mode": _BodySendMode.BodySendMode.Name(config.request_body_mode)},
            )
            mode = self._options.settings.default_body_mode
        self._request.mode = mode
        self._response.mode = body_mode_from_proto(config.response_body_mode)

    def _read_subset_hint(self, message: pb.ProcessingRequest) -> None:
        if not message.HasField("metadata_context"):
            return
        metadata = message.metadata_context.filter_metadata
        served = messages.struct_field(metadata, wire.LB_METADATA_NAMESPACE, wire.SERVED_ENDPOINT_KEY)
        if isinstance(served, str) and served:
            self._outcome.served = served
        value = messages.struct_field(metadata, wire.SUBSET_HINT_NAMESPACE, wire.SUBSET_HINT_KEY)
        if value is None:
            return
        if isinstance(value, str):
            self._request.subset = [value]
        elif isinstance(value, list):
            self._request.subset = [v for v in value if isinstance(v, str)]
        else:
            self._request.subset = []  # present but unusable: nothing is eligible (503)

    # -- request path ----------------------------------------------------------------------
    #
    # `handle` and `prepare` share the rules below: when the body ends (`_body_ends`,
    # `_trailers_end_body`) and how a pick is made (`_pick`). Only `handle` takes messages,
    # records the decision (`_route`) and builds replies.

    def _on_request_headers(self, headers: pb.HttpHeaders) -> list[pb.ProcessingResponse]:
        request = self._request
        request.headers = header_map = messages.header_map(headers)
        header_bytes = sum(len(k) + len(v) for k, v in header_map.items())
        given_id = header_map.get(wire.REQUEST_ID_HEADER, "")
        self.request_id = given_id or str(uuid.uuid4())
        request.generated_id = not given_id
        if header_bytes > self._options.settings.max_header_bytes:
            raise EppError(ErrorCode.BAD_REQUEST, "request headers too large", reason="headers-too-large")
        request.strip = [
            name
            for name in header_map
            if name in wire.STRIPPED_CLIENT_HEADERS and name != wire.DESTINATION_ENDPOINT_HEADER
        ]
        mode = self.mode
        if headers.end_of_stream or mode is BodyMode.NONE:
            return [self._route_headers_only()]
        if mode is BodyMode.BUFFERED:
            remove = list(request.strip)
            if wire.DESTINATION_ENDPOINT_HEADER in header_map:
                remove.append(wire.DESTINATION_ENDPOINT_HEADER)
            return [
                messages.request_headers_reply(set_headers=self._request_id_headers(), remove_headers=remove)
            ]
        return []  # FULL_DUPLEX_STREAMED: the headers reply waits for the body

    def _body_ends(self, data: bytes, end_of_stream: bool) -> bool:
        """Whether a body message carrying `data` completes the request, which is then routed on it.

        BUFFERED routes on its one whole-body message (BUFFERED_PARTIAL may end without
        end_of_stream). Raises for a message the stream cannot take.
        """
        request = self._request
        if request.decision is not None:
            raise ProtocolError("request body after the request was routed")
        if len(request.body) + len(data) > self._options.settings.max_request_body_bytes:
            raise EppError(ErrorCode.BAD_REQUEST, "request body too large", reason="body-too-large")
        return end_of_stream or self.mode is BodyMode.BUFFERED

    def _trailers_end_body(self) -> bool:
        """Whether trailers complete the request: a streamed body that did not say it ended."""
        return self._request.decision is None and self.mode is BodyMode.FULL_DUPLEX_STREAMED

    def _on_request_body(self, body: pb.HttpBody) -> list[pb.ProcessingResponse]:
        data = body.body
        ends = self._body_ends(data, body.end_of_stream)
        self._request.body.extend(data)
        return self._route_body() if ends else []

    def _on_request_trailers(self) -> list[pb.ProcessingResponse]:
        replies = self._route_body() if self._trailers_end_body() else []
        replies.append(messages.empty_request_trailers_reply())
        return replies

    def _pick(self, body: bytes | None) -> RoutingDecision:
        request = self._request
        return self._options.router.route(
            request_id=self.request_id,
            headers=request.headers,
            body=body,
            subset=request.subset,
            context=self.context,
        )

    def _route(self, body: bytes | None) -> RoutingDecision:
        """The decision for the request (picked now, or by `prepare`), recorded as routed."""
        request = self._request
        ahead = request.ahead
        if ahead is None:
            decision = self._pick(body)
        elif isinstance(ahead, EppError):
            raise ahead
        else:
            decision = ahead
        request.decision = decision
        completions = self._options.completions
        if completions is not None:
            self._outcome.completion_key = completions.expect(self._finish_from_log)
        if self._response.mode is BodyMode.NONE:
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
        destination = self._route(None).destination
        return messages.request_headers_reply(
            set_headers=messages.routing_headers(destination, None, self._routed_headers()),
            remove_headers=self._request.strip,
            destination=destination,
            completion_key=self._outcome.completion_key,
        )

    def _route_body(self) -> list[pb.ProcessingResponse]:
        """Route on the whole body: BUFFERED answers with the body; streamed sends headers, then the body."""
        decision = self._route(bytes(self._request.body))
        destination = decision.destination
        if self.mode is BodyMode.BUFFERED:
            return [
                messages.buffered_request_body_reply(
                    decision.body, destination, self._routed_headers(), self._outcome.completion_key
                )
            ]
        headers = messages.request_headers_reply(
            set_headers=messages.routing_headers(destination, len(decision.body), self._routed_headers()),
            remove_headers=self._request.strip,
            destination=destination,
            completion_key=self._outcome.completion_key,
        )
        return [headers, *messages.chunked_request_body(decision.body)]

    def _routed_headers(self) -> list[tuple[str, str]]:
        headers = self._request_id_headers()
        headers.extend(self.context.upstream_headers)
        return headers

    def _request_id_headers(self) -> list[tuple[str, str]]:
        return [(wire.REQUEST_ID_HEADER, self.request_id)] if self._request.generated_id else []

    # -- response path ---------------------------------------------------------------------

    def _on_response_headers(self, headers: pb.HttpHeaders) -> list[pb.ProcessingResponse]:
        response = self._response
        response_headers = messages.header_values(headers, _RESPONSE_HEADERS_READ)
        try:
            response.status = int(response_headers.get(":status", "200"))
        except ValueError:
            response.status = None
        response.sse = wire.SSE_CONTENT_TYPE in response_headers.get("content-type", "")
        if headers.end_of_stream:
            self._end_response()
        return [messages.response_headers_reply()]

    def _on_response_body(self, body: pb.HttpBody) -> list[pb.ProcessingResponse]:
        response = self._response
        data = body.body
        end = body.end_of_stream
        if data and response.first_body_at_s is None:
            clock = self._options.clock
            if clock is not None:
                response.first_body_at_s = clock.now()
        response.body_bytes += len(data)
        mode = response.mode if response.mode is not None else self.mode
        if mode is not BodyMode.FULL_DUPLEX_STREAMED:
            if response.sse:
                self._read_sse_usage(data)
            elif end:
                response.usage = parse_json_usage(data) or response.usage
            if end:
                self._end_response()
            return [messages.empty_response_body_reply()]
        if response.sse or response.passthrough:
            if response.sse:
                self._read_sse_usage(data)
            if end:
                self._end_response()
            return [messages.streamed_response_body(data, end)]
        held = response.buffer
        held.extend(data)
        if len(held) > self._options.settings.max_buffered_response_bytes:
            # Too large to inspect: hand back what we hold and pass the rest through.
            response.passthrough = True
            whole = bytes(held)
            held.clear()
            if end:
                self._end_response()
                return messages.chunked_response_body(whole)
            return [messages.streamed_response_body(c, False) for c, _ in messages.chunks(whole)]
        if not end:
            return []
        whole = bytes(held)
        held.clear()
        response.usage = parse_json_usage(whole) or response.usage
        self._end_response()
        return messages.chunked_response_body(whole)

    def _read_sse_usage(self, chunk: bytes) -> None:
        response = self._response
        tail = response.sse_tail
        data = tail + chunk if tail else chunk
        end = data.rfind(b"\n") + 1  # complete lines end here
        response.sse_tail = data[end:][-65536:]  # an unfinished line waits for the next chunk
        # Only the last chunk of a stream carries usage: every other one costs two scans in C.
        if end and data.find(b'"usage"', 0, end) >= 0:
            for line in data[:end].split(b"\n"):
                usage = parse_sse_usage(line)
                if usage is not None:
                    response.usage = usage

    def _complete(self) -> None:
        """Tell the director the request finished (once): at response end, else at stream close."""
        decision, outcome = self._request.decision, self._outcome
        if decision is None or outcome.completed:
            return
        outcome.completed = True
        self._options.router.complete(
            decision, served_address=outcome.served, status=self._response.status or 200
        )

    def _end_response(self) -> None:
        self._complete()
        response = self._response
        if response.sse and response.sse_tail:
            usage = parse_sse_usage(response.sse_tail)
            if usage is not None:
                response.usage = usage
            response.sse_tail = b""

    # -- errors ----------------------------------------------------------------------------

    def _fail(self, err: EppError) -> pb.ProcessingResponse:
        self._outcome.error = err
        self._response.status = err.http_status
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
