"""The per-stream state machine: one `StreamHandler` per ext_proc `Process` stream (one HTTP request).

`handle(message)` takes one `ProcessingRequest` and returns the replies to send, in order. It
is synchronous: routing is pure CPU work, so a slow or stalled peer only holds its own stream.

FULL_DUPLEX_STREAMED defers the headers reply until the body has ended, then sends headers
(destination, Content-Length, metadata) and the body back in 62000-byte chunks. BUFFERED
answers headers at once and routes on the whole-body message. The mode comes from
`protocol_config` on the first message, else the configured default.

Each stream's request has a life (`epp.picker.lifecycle`), minted with the request headers. When
the body is complete it arrives at the director; if flow control queues it, or the composition
root's hold (on-demand adapter loading) must let it go first, `handle` answers PENDING and the
server awaits `resume` for the replies. A client that leaves meanwhile finishes the request as
gone: it leaves its queue, or its in-flight count, at once.

When the data plane announces that no response body follows (`response_body_mode: NONE`, the
default of every Envoy config we generate), the stream ends as soon as the request is routed
(`done`), so an EPP that stops or dies cannot cut a response. The request then finishes when the
gateway's access-log entry for it arrives (`Completions`), or at once when that gateway sends none.
When the response does pass through, it finishes at the response's end.

Gateways that build the ext_proc filter themselves (kgateway, Istio, Envoy AI Gateway) announce
response processing (`response_body_mode: FULL_DUPLEX_STREAMED`) and give no way to turn it off.
The EPP then leaves the stream after routing anyway (`LeavePolicy`): it closes it with OK, which
ext_proc defines as "go on without the processor", so the response never passes through the EPP.
By default it does so when that gateway sends its access log here, so the request still finishes
when it really ends. The close must reach Envoy before any response byte does, or the bytes Envoy
hands to the closed stream are lost: the last routing reply carries the body's last byte (so the
model server cannot answer before Envoy has read it), and the server sends that reply in one
write with the status (`server.py`). A request with trailers keeps the stream open: its trailers
reply would follow the last byte, so the close could not travel with it.
"""

from __future__ import annotations

import asyncio
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
from epp.picker.extproc import messages
from epp.picker.extproc.completions import Completions
from epp.picker.lifecycle import Ending, RequestLife, Stage, Usage

log = logging.getLogger(__name__)

CLIENT_CLOSED_REQUEST = 499  # nginx's "client closed request": a dispatched request whose client left

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


class LeavePolicy(enum.Enum):
    """Whether the EPP leaves a stream after routing when the data plane announced response events.

    AUTO: when the gateway the stream came from sends its access log to this EPP (the request then
    finishes from its entry); otherwise the response passes through and finishes it. ALWAYS: every
    time (without an access log the request finishes when its stream ends). NEVER: stay to the end
    of the response (token usage from the body; an EPP crash cuts the responses in flight).
    """

    AUTO = "auto"
    ALWAYS = "always"
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class StreamSettings:
    default_body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED
    max_request_body_bytes: int = wire.DEFAULT_MAX_REQUEST_BODY_BYTES
    max_header_bytes: int = wire.DEFAULT_MAX_HEADER_BYTES
    # A non-streaming response body larger than this is passed through unparsed instead of buffered.
    max_buffered_response_bytes: int = wire.DEFAULT_MAX_REQUEST_BODY_BYTES
    # In BUFFERED mode, how long the data plane is asked to wait for the reply of a request that
    # waits (in a flow-control queue, for an adapter load): its queue TTL and a margin.
    pending_timeout_s: float = 90.0
    leave: LeavePolicy = LeavePolicy.AUTO


class Router(Protocol):
    """What a stream needs of the picker: a life for each request, and its arrival (see `Director`)."""

    def mint(self, request_id: str = "") -> RequestLife: ...

    def arrive(
        self,
        life: RequestLife,
        *,
        headers: Mapping[str, str],
        body: bytes | None,
        subset: Sequence[str] | None = None,
    ) -> bytes: ...


# A wait between dispatch and the reply (only this stream waits): the composition root plugs in
# on-demand adapter loading this way. It may narrow `life.decision`; it raises `EppError` for the
# stream to answer.
Hold = Callable[[RequestLife], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class StreamOptions:
    """What every stream of one server shares: the router, limits and the waits around a request."""

    router: Router
    clock: Clock
    settings: StreamSettings = StreamSettings()
    hold: Hold | None = None
    # Finishing requests from the gateway's access log; None: each finishes when its stream ends.
    completions: Completions | None = None


# The only response headers the stream reads (status for metrics, content type for SSE).
_RESPONSE_HEADERS_READ = frozenset({":status", "content-type"})


class ProtocolError(Exception):
    """A message the ext_proc contract does not allow here; the server ends the stream with a gRPC error."""


@dataclass(frozen=True, slots=True)
class Pending:
    """`handle`'s answer when the request must wait (a flow-control queue, an adapter load): the
    server sends `now` at once (BUFFERED: ask the data plane to keep waiting), then awaits `resume`
    for the replies."""

    now: tuple[pb.ProcessingResponse, ...] = ()


PENDING = Pending()


@dataclass(slots=True)
class _RequestState:
    """The request as it arrives, up to its reply."""

    mode: BodyMode | None = None  # the request body mode announced; None: the configured default
    headers: dict[str, str] = field(default_factory=dict)
    strip: list[str] = field(default_factory=list)  # client headers the routed reply removes
    generated_id: bool = False  # the request id is ours, so the reply sets it upstream
    body: bytearray = field(default_factory=bytearray)
    subset: list[str] | None = None  # the data plane's subset hint, when it sent one
    routed_body: bytes = b""  # what goes upstream once dispatched (rewritten when the model was)
    headers_only: bool = False  # no body: the reply answers the request headers
    trailers: bool = False  # the body ended with trailers: their reply follows the routing replies
    # The routed replies were built: the request went on to its endpoints. Until then a dispatched
    # request (waiting in the hold, or let go by its queue but not yet answered) whose client
    # leaves is gone: nothing reached the data plane, so no response or access-log entry follows.
    sent_on: bool = False


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
    ended: bool = False  # the whole response passed through


class StreamHandler:
    """Serves one ext_proc stream. Not thread-safe; lives on the event loop.

    `peer` is the data plane's grpc peer string: its access-log stream, if it has one, comes
    from the same host.
    """

    # Slots: the handler's attributes are read on every message of every stream.
    __slots__ = ("_options", "_peer", "_request", "_response", "_served", "done", "left", "life")

    def __init__(self, options: StreamOptions, *, peer: str = "") -> None:
        self._options = options
        self._peer = peer
        self.life: RequestLife | None = None  # minted with the request headers
        # Nothing more to do on this stream (an ImmediateResponse was sent, or the request was
        # routed and no response follows): the server ends it.
        self.done = False
        # The stream was left after routing although the data plane announced response events.
        self.left = False
        self._request = _RequestState()
        self._response = _ResponseState()
        self._served: str | None = None  # envoy.lb served endpoint, when the data plane reports it

    @property
    def ending(self) -> str:
        """How the stream ended for the EPP: `left-after-routing` (the data plane would have sent
        the response), `request-only` (it sends none), `response` (the response passed through),
        or `other` (refused, or ended by the data plane before)."""
        if self.left:
            return "left-after-routing"
        if self._response.ended:
            return "response"
        if self._request.sent_on and self._response.mode is BodyMode.NONE:
            return "request-only"
        return "other"

    @property
    def request_id(self) -> str:
        return self.life.request_id if self.life is not None else ""

    # -- entry points ----------------------------------------------------------------------

    def handle(self, message: pb.ProcessingRequest) -> list[pb.ProcessingResponse] | Pending:
        """Replies to one message, or PENDING when the request waits (then `resume` answers).

        An `EppError` becomes an ImmediateResponse and ends the stream.
        """
        if self.done:
            return []
        self._read_protocol_config(message)
        self._read_subset_hint(message)
        try:
            return self._dispatch(message)
        except EppError as err:
            return [self._fail(err)]

    async def resume(self) -> list[pb.ProcessingResponse]:
        """The replies for a request `handle` left waiting: once it leaves its queue (dispatched, or
        refused) and, after dispatch, once the hold lets it go."""
        life = self.life
        assert life is not None
        try:
            # A queued request that was refused (its TTL, a drain) before this wait began is
            # answered at once: its waiter was told before it was set.
            if life.stage is Stage.QUEUED and life.error is None:
                left: asyncio.Future[None] = asyncio.get_running_loop().create_future()

                def wake(_: RequestLife) -> None:
                    if not left.done():
                        left.set_result(None)

                life.waiter = wake
                await left
            if life.error is not None:
                raise life.error
            hold = self._options.hold
            if hold is not None:
                await hold(life)
        except EppError as err:
            return [self._fail(err)]
        return self._routed_replies()

    def fail_internal(self) -> list[pb.ProcessingResponse]:
        """The reply for an unexpected error while handling a message (500)."""
        if self.done:
            return []
        return [self._fail(EppError(ErrorCode.INTERNAL, "internal error", reason="internal"))]

    def close(self) -> None:
        """The stream ended (EOF, cancel, after an ImmediateResponse or once routed): finish its
        request, unless it finishes later.

        A dispatched request whose response did not pass through waits for its access-log entry
        when the gateway sends one; otherwise it finishes now.
        """
        life = self.life
        if life is None or life.finished:
            return
        now = self._options.clock.now()
        if life.stage is not Stage.DISPATCHED or not self._request.sent_on:
            self._record_response(life)
            if life.error is not None:
                life.finish(Ending.REFUSED, now)
            else:
                if life.stage is Stage.DISPATCHED:
                    life.outcome.status = CLIENT_CLOSED_REQUEST
                life.finish(Ending.CLIENT_GONE, now)
            return
        completions = self._options.completions
        if self._response.ended or completions is None:
            self._finish(Ending.RESPONSE if self._response.ended else Ending.STREAM_END)
            return
        logged = completions.logged(life.key)
        if logged is not None:
            self._record_response(life)
            completions.finish(life, logged)
        elif completions.receives_from(self._peer):
            self._record_response(life)
            completions.wait(life, self._peer)
        else:
            completions.forget(life.key)
            self._finish(Ending.STREAM_END)

    def _finish(self, ending: Ending) -> None:
        life = self.life
        assert life is not None
        self._record_response(life)
        completions = self._options.completions
        if completions is not None:
            completions.forget(life.key)
        life.finish(ending, self._options.clock.now())

    def _record_response(self, life: RequestLife) -> None:
        """What the stream saw of the response, onto the request's outcome."""
        outcome, response = life.outcome, self._response
        if response.status is not None:
            outcome.status = response.status
        outcome.streaming = response.sse
        outcome.usage = response.usage
        outcome.response_body_bytes = response.body_bytes
        if self._served:
            outcome.served_address = self._served
        if response.first_body_at_s is not None and outcome.ttft_s is None:
            outcome.ttft_s = response.first_body_at_s - life.arrived_at

    @property
    def mode(self) -> BodyMode:
        mode = self._request.mode
        return mode if mode is not None else self._options.settings.default_body_mode

    # -- dispatch --------------------------------------------------------------------------

    def _dispatch(self, message: pb.ProcessingRequest) -> list[pb.ProcessingResponse] | Pending:
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
            self._served = served
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

    def _on_request_headers(self, headers: pb.HttpHeaders) -> list[pb.ProcessingResponse] | Pending:
        if self.life is not None:  # one HTTP request per stream: a second would orphan the first's life
            raise ProtocolError("request headers twice on one stream")
        request = self._request
        request.headers = header_map = messages.header_map(headers)
        header_bytes = sum(len(k) + len(v) for k, v in header_map.items())
        given_id = header_map.get(wire.REQUEST_ID_HEADER, "")
        self.life = self._options.router.mint(given_id or str(uuid.uuid4()))
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
            request.headers_only = True
            return self._route(None)
        if mode is BodyMode.BUFFERED:
            remove = list(request.strip)
            if wire.DESTINATION_ENDPOINT_HEADER in header_map:
                remove.append(wire.DESTINATION_ENDPOINT_HEADER)
            return [
                messages.request_headers_reply(set_headers=self._request_id_headers(), remove_headers=remove)
            ]
        return []  # FULL_DUPLEX_STREAMED: the headers reply waits for the body

    def _on_request_body(self, body: pb.HttpBody) -> list[pb.ProcessingResponse] | Pending:
        request = self._request
        if self.life is None:
            raise ProtocolError("request body before the request headers")
        if self._routing_started():
            raise ProtocolError("request body after the request was routed")
        data = body.body
        if len(request.body) + len(data) > self._options.settings.max_request_body_bytes:
            raise EppError(ErrorCode.BAD_REQUEST, "request body too large", reason="body-too-large")
        request.body.extend(data)
        # BUFFERED routes on its one whole-body message (BUFFERED_PARTIAL may end without end_of_stream).
        if body.end_of_stream or self.mode is BodyMode.BUFFERED:
            return self._route(bytes(request.body))
        return []

    def _on_request_trailers(self) -> list[pb.ProcessingResponse] | Pending:
        """Trailers end a streamed body that did not say it ended; otherwise they are just answered."""
        if not self._routing_started() and self.mode is BodyMode.FULL_DUPLEX_STREAMED:
            if self.life is None:
                raise ProtocolError("request trailers before the request headers")
            self._request.trailers = True
            return self._route(bytes(self._request.body))
        return [messages.empty_request_trailers_reply()]

    def _routing_started(self) -> bool:
        life = self.life
        return life is not None and life.stage is not Stage.ARRIVED

    def _route(self, body: bytes | None) -> list[pb.ProcessingResponse] | Pending:
        """The request is complete: it arrives at the director, then waits or is answered now."""
        life = self.life
        assert life is not None
        request = self._request
        request.routed_body = self._options.router.arrive(
            life, headers=request.headers, body=body, subset=request.subset
        )
        if life.stage is Stage.QUEUED or self._options.hold is not None:
            if self.mode is BodyMode.BUFFERED:
                return Pending((messages.keep_waiting(self._options.settings.pending_timeout_s),))
            return PENDING
        return self._routed_replies()

    def _routed_replies(self) -> list[pb.ProcessingResponse]:
        """The replies that send a dispatched request on to its endpoints."""
        life = self.life
        assert life is not None
        decision = life.decision
        assert decision is not None
        request = self._request
        completions = self._options.completions
        key = completions.expect(life) if completions is not None else ""
        request.sent_on = True
        if self._response.mode is BodyMode.NONE:
            self.done = True  # no response follows: end the stream now
        elif self._leaves():
            self.done = self.left = True
        destination = decision.destination
        if log.isEnabledFor(logging.DEBUG):  # the fields cost more than the call when it is off
            log.debug(
                "request routed",
                extra={
                    "destination": destination,
                    "model": decision.request.target_model,
                    "reason": decision.result.reason,
                },
            )
        if request.headers_only:
            return [
                messages.request_headers_reply(
                    set_headers=messages.routing_headers(destination, None, self._routed_headers(key)),
                    remove_headers=request.strip,
                    destination=destination,
                    completion_key=key,
                )
            ]
        body = request.routed_body
        if self.mode is BodyMode.BUFFERED:
            return [messages.buffered_request_body_reply(body, destination, self._routed_headers(key), key)]
        replies = [
            messages.request_headers_reply(
                set_headers=messages.routing_headers(destination, len(body), self._routed_headers(key)),
                remove_headers=request.strip,
                destination=destination,
                completion_key=key,
            ),
            *messages.chunked_request_body(body),
        ]
        if self.left and len(body) > 1:
            # The last byte alone ends the body: the model server cannot answer before Envoy has
            # read this reply, and the close travels in the same write.
            replies[-1:] = [
                *(messages.streamed_request_body(c, False) for c, _ in messages.chunks(body[:-1])),
                messages.streamed_request_body(body[-1:], True),
            ]
        if request.trailers:
            # The trailers reply ends the body: a last chunk marked end_of_stream would make the
            # data plane finish (and close this stream) before it lets the trailers go upstream.
            last = replies[-1].request_body.response.body_mutation.streamed_response
            last.end_of_stream = False
            replies.append(messages.empty_request_trailers_reply())
        return replies

    def _leaves(self) -> bool:
        """Whether to leave this routed stream although response events would follow."""
        policy = self._options.settings.leave
        if policy is LeavePolicy.NEVER or self._request.trailers:
            return False
        if policy is LeavePolicy.ALWAYS:
            return True
        completions = self._options.completions
        return completions is not None and completions.receives_from(self._peer)

    def _routed_headers(self, completion_key: str) -> list[tuple[str, str]]:
        headers = self._request_id_headers()
        if self.life is not None:
            headers.extend(self.life.upstream_headers)
        if completion_key:  # beside the metadata, for access logs that see headers only
            headers.append((wire.COMPLETION_KEY_HEADER, completion_key))
        return headers

    def _request_id_headers(self) -> list[tuple[str, str]]:
        if not self._request.generated_id or self.life is None:
            return []
        return [(wire.REQUEST_ID_HEADER, self.life.request_id)]

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
            response.first_body_at_s = self._options.clock.now()
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

    def _end_response(self) -> None:
        """The whole response passed through: the request finishes now (once)."""
        response = self._response
        if response.ended:
            return
        response.ended = True
        self.done = True  # nothing follows a response's end: its reply is the stream's last
        if response.sse and response.sse_tail:
            usage = parse_sse_usage(response.sse_tail)
            if usage is not None:
                response.usage = usage
            response.sse_tail = b""
        life = self.life
        if life is not None and life.stage is Stage.DISPATCHED and not life.finished:
            self._finish(Ending.RESPONSE)

    # -- errors ----------------------------------------------------------------------------

    def _fail(self, err: EppError) -> pb.ProcessingResponse:
        life = self.life
        if life is not None:
            life.refuse(err)
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
