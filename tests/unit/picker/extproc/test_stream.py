"""The per-stream state machine, driven with hand-built ProcessingRequest messages."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import uuid
from typing import Any

import pytest

from epp._proto.envoy.config.core.v3 import base_pb2
from epp._proto.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from epp._proto.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.clock import FakeClock
from epp.errors import EppError, ErrorCode
from epp.picker.admission import build_admission
from epp.picker.datastore.types import Metrics
from epp.picker.director import Director
from epp.picker.extproc.completions import Completion, Completions
from epp.picker.extproc.stream import (
    PENDING,
    BodyMode,
    Hold,
    LeavePolicy,
    Pending,
    ProtocolError,
    StreamHandler,
    StreamOptions,
    StreamSettings,
    parse_sse_usage,
)
from epp.picker.flowcontrol import FlowControlSettings, build_flow_control
from epp.picker.lifecycle import Ending, KeyMint, RequestLife, Stage, Usage
from tests.support.fake_scheduler import pool_datastore
from tests.unit.picker.extproc.support import LedgerScheduler, RecordingObserver

Mode = processing_mode_pb2.ProcessingMode
BODY = b'{"model":"m","prompt":"hello"}'
GATEWAY = "ipv4:10.0.0.9:41234"
KEY_PREFIX = "epp-test"


def headers_message(
    headers: dict[str, str] | None = None,
    *,
    end_of_stream: bool = False,
    request_mode: int | None = None,
    response_mode: int | None = None,
    subset: object = None,
) -> pb.ProcessingRequest:
    all_headers = {":method": "POST", ":path": "/v1/completions", **(headers or {})}
    message = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in all_headers.items()]
            ),
            end_of_stream=end_of_stream,
        )
    )
    if request_mode is not None:
        message.protocol_config.request_body_mode = request_mode
        message.protocol_config.response_body_mode = (
            response_mode if response_mode is not None else request_mode
        )
    if subset is not None:
        message.metadata_context.filter_metadata["envoy.lb.subset_hint"].update(
            {"x-gateway-destination-endpoint-subset": subset}
        )
    return message


def body_message(data: bytes, end_of_stream: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=end_of_stream))


def response_headers_message(headers: dict[str, str], served: str | None = None) -> pb.ProcessingRequest:
    message = pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
            )
        )
    )
    if served is not None:
        message.metadata_context.filter_metadata["envoy.lb"].update(
            {"x-gateway-destination-endpoint-served": served}
        )
    return message


def response_body_message(data: bytes, end_of_stream: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=end_of_stream))


def set_headers(reply: pb.ProcessingResponse, phase: str = "request_headers") -> dict[str, str]:
    mutation = getattr(reply, phase).response.header_mutation
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}


def removed_headers(reply: pb.ProcessingResponse, phase: str = "request_headers") -> list[str]:
    return list(getattr(reply, phase).response.header_mutation.remove_headers)


def metadata_destination(reply: pb.ProcessingResponse) -> str:
    fields = reply.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    return str(fields["x-gateway-destination-endpoint"].string_value)


def streamed(reply: pb.ProcessingResponse, phase: str = "request_body") -> tuple[bytes, bool]:
    stream = getattr(reply, phase).response.body_mutation.streamed_response
    return stream.body, stream.end_of_stream


class Harness:
    """One stream against a director (flow control when `flow` is given), observed.

    Every other stream of the same director comes from `stream()`.
    """

    def __init__(
        self,
        *,
        mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED,
        pod_ips: tuple[str, ...] = ("10.0.0.1", "10.0.0.2"),
        exhausted: bool = False,
        max_endpoints: int = 1,
        max_request_body_bytes: int = 1 << 20,
        max_header_bytes: int = 8192,
        completions: Completions | None = None,
        clock: FakeClock | None = None,
        flow: FlowControlSettings | None = None,
        hold: Hold | None = None,
        leave: LeavePolicy = LeavePolicy.AUTO,
    ) -> None:
        self.clock = clock if clock is not None else FakeClock()
        self.scheduler = LedgerScheduler(max_endpoints=max_endpoints, exhausted=exhausted)
        self.observer = RecordingObserver()
        self.datastore = pool_datastore(pod_ips, clock=self.clock)
        self.flow = (
            build_flow_control(flow, self.scheduler.state, build_admission().detector)
            if flow is not None
            else None
        )
        self.director = Director(
            self.datastore,
            self.scheduler,
            flow=self.flow,
            clock=self.clock,
            rng=random.Random(1),
            observer=self.observer,
            keys=KeyMint(KEY_PREFIX),
        )
        self.options = StreamOptions(
            self.director,
            self.clock,
            StreamSettings(
                default_body_mode=mode,
                max_request_body_bytes=max_request_body_bytes,
                max_header_bytes=max_header_bytes,
                leave=leave,
            ),
            hold=hold,
            completions=completions,
        )
        self.handler = self.stream()

    def stream(self) -> StreamHandler:
        return StreamHandler(self.options, peer=GATEWAY)

    def send(self, message: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        answer = self.handler.handle(message)
        assert not isinstance(answer, Pending), "the request waits: use handle() and resume()"
        return answer

    @property
    def life(self) -> RequestLife:
        life = self.handler.life
        assert life is not None
        return life

    def finished(self) -> RequestLife:
        """The one request the director heard finish."""
        [life] = self.observer.finished_lives
        assert life.finished
        return life

    def queued(self) -> int:
        assert self.flow is not None
        return len(self.flow.queues)


# -- FULL_DUPLEX_STREAMED ------------------------------------------------------------------------


def test_fdx_defers_headers_reply_until_body_end() -> None:
    h = Harness()
    assert h.send(headers_message({"x-request-id": "req-1"}, request_mode=Mode.FULL_DUPLEX_STREAMED)) == []
    assert h.send(body_message(BODY, False)) == []
    replies = h.send(body_message(b"", True))
    assert [r.WhichOneof("response") for r in replies] == ["request_headers", "request_body"]
    headers_reply = replies[0]
    assert headers_reply.request_headers.response.clear_route_cache
    assert set_headers(headers_reply) == {
        "x-gateway-destination-endpoint": "10.0.0.1:8000",
        "Content-Length": str(len(BODY)),
    }
    assert metadata_destination(headers_reply) == "10.0.0.1:8000"
    assert streamed(replies[1]) == (BODY, True)
    assert h.handler.request_id == "req-1"
    assert h.life.stage is Stage.DISPATCHED and not h.life.finished  # the response is still to come
    assert h.scheduler.in_flight() == {h.life.key: "pod-0-rank-0"}


def test_fdx_large_body_comes_back_in_62000_byte_chunks() -> None:
    h = Harness()
    body = json.dumps({"model": "m", "prompt": "x" * 150000}).encode()
    h.send(headers_message())
    replies = h.send(body_message(body[:70000], False)) + h.send(body_message(body[70000:], True))
    chunks = [streamed(r) for r in replies[1:]]
    assert [len(c) for c, _ in chunks] == [62000, 62000, len(body) - 124000]
    assert [eos for _, eos in chunks] == [False, False, True]
    assert b"".join(c for c, _ in chunks) == body


def test_fdx_request_trailers_finish_the_request() -> None:
    h = Harness()
    h.send(headers_message())
    assert h.send(body_message(BODY, False)) == []
    replies = h.send(pb.ProcessingRequest(request_trailers=pb.HttpTrailers()))
    assert [r.WhichOneof("response") for r in replies] == [
        "request_headers",
        "request_body",
        "request_trailers",
    ]
    assert streamed(replies[1]) == (BODY, False)  # the trailers reply ends the body


def test_protocol_config_on_first_message_overrides_default_mode() -> None:
    h = Harness(mode=BodyMode.BUFFERED)
    assert h.send(headers_message(request_mode=Mode.FULL_DUPLEX_STREAMED)) == []
    assert h.handler.mode is BodyMode.FULL_DUPLEX_STREAMED
    replies = h.send(body_message(BODY, True))
    assert replies[0].WhichOneof("response") == "request_headers"


@pytest.mark.parametrize(
    ("message", "mode"),
    [
        (headers_message({}, end_of_stream=True), BodyMode.FULL_DUPLEX_STREAMED),
        (headers_message({}, end_of_stream=True), BodyMode.BUFFERED),
        (headers_message({}, request_mode=Mode.NONE), BodyMode.FULL_DUPLEX_STREAMED),
    ],
    ids=["fdx-end-of-stream", "buffered-end-of-stream", "body-mode-none"],
)
def test_headers_only_request_is_routed_on_headers(message: pb.ProcessingRequest, mode: BodyMode) -> None:
    h = Harness(mode=mode)
    replies = h.send(message)
    assert len(replies) == 1
    headers = set_headers(replies[0])
    assert headers["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
    assert "Content-Length" not in headers
    assert metadata_destination(replies[0]) == "10.0.0.1:8000"
    assert h.scheduler.scheduled[0][0].target_model == ""
    assert h.life.outcome.request_body_bytes == 0


# -- BUFFERED ------------------------------------------------------------------------------------


def test_buffered_answers_headers_at_once_and_routes_on_body() -> None:
    h = Harness(mode=BodyMode.BUFFERED)
    first = h.send(headers_message({"x-request-id": "r"}))
    assert len(first) == 1
    assert first[0].request_headers.response.clear_route_cache
    assert not first[0].HasField("dynamic_metadata")
    replies = h.send(body_message(BODY, True))
    assert len(replies) == 1
    reply = replies[0]
    assert set_headers(reply, "request_body") == {
        "x-gateway-destination-endpoint": "10.0.0.1:8000",
        "Content-Length": str(len(BODY)),
    }
    assert reply.request_body.response.body_mutation.body == BODY
    assert metadata_destination(reply) == "10.0.0.1:8000"


def test_buffered_response_body_gets_empty_reply_and_usage_is_read() -> None:
    h = Harness(mode=BodyMode.BUFFERED)
    h.send(headers_message(request_mode=Mode.BUFFERED))
    h.send(body_message(BODY, True))
    h.send(response_headers_message({":status": "200", "content-type": "application/json"}))
    body = json.dumps({"usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}).encode()
    replies = h.send(response_body_message(body, True))
    assert replies == [pb.ProcessingResponse(response_body=pb.BodyResponse())]
    life = h.finished()  # at the response's end, before the stream closes
    assert life.ending is Ending.RESPONSE
    assert life.outcome.usage == Usage(3, 4, 7)
    assert (life.outcome.status, life.outcome.response_body_bytes) == (200, len(body))
    h.handler.close()
    assert h.finished() is life


# -- control headers and request id --------------------------------------------------------------


def test_client_destination_header_is_never_copied() -> None:
    h = Harness()
    h.send(
        headers_message(
            {
                "x-gateway-destination-endpoint": "127.0.0.1:9901",
                "x-gateway-destination-endpoint-served": "127.0.0.1:9901",
            }
        )
    )
    replies = h.send(body_message(BODY, True))
    options = replies[0].request_headers.response.header_mutation.set_headers
    destination = [o for o in options if o.header.key == "x-gateway-destination-endpoint"]
    assert [o.header.raw_value for o in destination] == [b"10.0.0.1:8000"]
    assert destination[0].append_action == base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
    assert removed_headers(replies[0]) == ["x-gateway-destination-endpoint-served"]


def test_buffered_headers_reply_removes_client_destination() -> None:
    h = Harness(mode=BodyMode.BUFFERED)
    replies = h.send(headers_message({"x-gateway-destination-endpoint": "127.0.0.1:9901"}))
    assert removed_headers(replies[0]) == ["x-gateway-destination-endpoint"]


def test_request_id_kept_case_insensitively() -> None:
    h = Harness()
    h.send(headers_message({"X-Request-Id": "Client-Id"}))
    replies = h.send(body_message(BODY, True))
    assert "x-request-id" not in set_headers(replies[0])
    assert h.handler.request_id == "Client-Id"
    # The client's id is only shown: the request is known by its life's key everywhere else.
    life = h.life
    assert life.request_id == "Client-Id"
    assert life.key == f"{KEY_PREFIX}-1"
    assert h.scheduler.routed == [(life.key, "pod-0-rank-0")]
    assert life.decision is not None and life.decision.request.request_id == life.key


def test_repeated_client_request_ids_are_different_requests() -> None:
    h = Harness()
    other = h.stream()
    for handler in (h.handler, other):
        handler.handle(headers_message({"x-request-id": "same"}))
        handler.handle(body_message(BODY, True))
    assert h.handler.life is not None and other.life is not None
    assert h.handler.life.key != other.life.key
    assert len(h.scheduler.in_flight()) == 2
    h.handler.close()
    assert h.scheduler.in_flight() == {other.life.key: "pod-0-rank-0"}


def test_request_id_generated_and_set_upstream() -> None:
    h = Harness()
    h.send(headers_message())
    replies = h.send(body_message(BODY, True))
    generated = set_headers(replies[0])["x-request-id"]
    assert uuid.UUID(generated).version == 4
    assert h.handler.request_id == generated == h.life.request_id


# -- subset hint ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("subset", "destination"),
    [
        (["10.0.0.2:8000"], "10.0.0.2:8000"),
        ("10.0.0.2:8000", "10.0.0.2:8000"),
        (["10.0.0.2"], "10.0.0.2:8000"),
        ([7, "10.0.0.2:8000"], "10.0.0.2:8000"),
    ],
    ids=["list", "single-string", "ip-only", "non-string-skipped"],
)
def test_subset_hint_is_honoured(subset: object, destination: str) -> None:
    h = Harness()
    h.send(headers_message(subset=subset))
    replies = h.send(body_message(BODY, True))
    assert set_headers(replies[0])["x-gateway-destination-endpoint"] == destination


# -- errors --------------------------------------------------------------------------------------


def immediate(replies: list[pb.ProcessingResponse]) -> tuple[int, dict[str, str], dict[str, Any]]:
    assert len(replies) == 1 and replies[0].HasField("immediate_response")
    response = replies[0].immediate_response
    headers = {o.header.key: o.header.raw_value.decode() for o in response.headers.set_headers}
    return response.status.code, headers, json.loads(response.body)


@pytest.mark.parametrize(
    ("harness", "messages", "status", "message"),
    [
        (
            {},
            [headers_message(), body_message(b"{not json", True)],
            400,
            "inference gateway: BadRequest - Error unmarshaling request body",
        ),
        (
            {},
            [headers_message(), body_message(b'{"prompt":"x"}', True)],
            400,
            "inference gateway: BadRequest - model not found in request body",
        ),
        (
            {"max_request_body_bytes": 10},
            [headers_message(), body_message(b'{"model":', False), body_message(b'"m"}', True)],
            400,
            "inference gateway: BadRequest - request body too large",
        ),
        (
            {"max_header_bytes": 100},
            [headers_message({"cookie": "c" * 200})],
            400,
            "inference gateway: BadRequest - request headers too large",
        ),
        (
            {},
            [headers_message(subset=[]), body_message(BODY, True)],
            503,
            "inference gateway: ServiceUnavailable - failed to find candidate pods for serving the request",
        ),
        (
            {"pod_ips": ()},
            [headers_message(), body_message(BODY, True)],
            503,
            "inference gateway: ServiceUnavailable - failed to find candidate pods for serving the request",
        ),
        (
            {"exhausted": True},
            [headers_message(), body_message(BODY, True)],
            429,
            "inference gateway: InferencePoolResourceExhausted - failed to find a target endpoint",
        ),
        (
            {"mode": BodyMode.BUFFERED},
            [headers_message(), body_message(b"[]", True)],
            400,
            "inference gateway: BadRequest - Error unmarshaling request body",
        ),
    ],
    ids=[
        "bad-json",
        "no-model",
        "body-too-large",
        "headers-too-large",
        "empty-subset",
        "no-pods",
        "exhausted",
        "buffered-bad-json",
    ],
)
def test_errors_become_immediate_responses(
    harness: dict[str, object], messages: list[pb.ProcessingRequest], status: int, message: str
) -> None:
    h = Harness(**harness)  # type: ignore[arg-type]
    replies: list[pb.ProcessingResponse] = []
    for m in messages:
        replies = h.send(m)
        if replies and replies[0].HasField("immediate_response"):
            break
    code, headers, body = immediate(replies)
    assert code == status
    assert headers["content-type"] == "application/json"
    assert ("retry-after" in headers) is (status == 429)
    assert body == {
        "error": {"message": message, "type": message.split(": ")[1].split(" - ")[0], "code": status}
    }
    assert h.handler.done
    assert h.send(body_message(b"", True)) == []  # nothing more after an ImmediateResponse
    assert not h.life.finished  # it finishes when the server ends the stream
    h.handler.close()
    life = h.finished()
    assert life is h.handler.life
    assert life.ending is Ending.REFUSED
    assert life.error is not None and life.error.http_status == status
    assert life.outcome.status == status
    assert h.scheduler.in_flight() == {}  # never counted, or released


def test_internal_failure_reply_is_500() -> None:
    h = Harness()
    h.send(headers_message())
    code, _, body = immediate(h.handler.fail_internal())
    assert code == 500
    assert body["error"] == {
        "message": "inference gateway: Internal - internal error",
        "type": "Internal",
        "code": 500,
    }
    assert h.handler.done and h.handler.fail_internal() == []
    h.handler.close()
    life = h.finished()
    assert (life.ending, life.outcome.status) == (Ending.REFUSED, 500)


def test_message_without_a_phase_is_a_protocol_error() -> None:
    h = Harness()
    with pytest.raises(ProtocolError):
        h.send(pb.ProcessingRequest())


@pytest.mark.parametrize(
    "first",
    [
        body_message(BODY, True),
        body_message(BODY, False),
        pb.ProcessingRequest(request_trailers=pb.HttpTrailers()),
    ],
    ids=["body", "partial-body", "trailers"],
)
def test_a_request_message_before_the_request_headers_is_a_protocol_error(
    first: pb.ProcessingRequest,
) -> None:
    h = Harness()
    with pytest.raises(ProtocolError):
        h.handler.handle(first)
    h.handler.close()
    assert h.handler.life is None
    assert h.scheduler.scheduled == [] and h.observer.events == []


def test_request_headers_twice_on_one_stream_is_a_protocol_error() -> None:
    """One HTTP request per stream: a second request would take the place of the first, which
    would then never finish (and stay counted in flight)."""
    h = Harness()
    h.send(headers_message({"x-request-id": "r"}, end_of_stream=True))  # routed; the response follows
    life = h.life
    with pytest.raises(ProtocolError):
        h.handler.handle(headers_message({"x-request-id": "again"}, end_of_stream=True))
    assert h.handler.life is life
    h.handler.close()
    assert h.finished() is life and life.ending is Ending.STREAM_END
    assert len(h.scheduler.scheduled) == 1 and h.scheduler.in_flight() == {}


# -- response path -------------------------------------------------------------------------------


def route(h: Harness) -> None:
    h.send(headers_message({"x-request-id": "r"}, request_mode=Mode.FULL_DUPLEX_STREAMED))
    h.send(body_message(BODY, True))
    assert h.scheduler.in_flight() == {h.life.key: "pod-0-rank-0"}


def test_non_streaming_response_is_buffered_and_returned_in_chunks() -> None:
    h = Harness()
    route(h)
    reply = h.send(response_headers_message({":status": "200", "content-type": "application/json"}))
    assert set_headers(reply[0], "response_headers") == {"x-went-into-resp-headers": "true"}
    payload = {
        "choices": [{"text": "y" * 100000}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14},
    }
    body = json.dumps(payload).encode()
    assert h.send(response_body_message(body[:50000], False)) == []
    replies = h.send(response_body_message(body[50000:], True))
    pieces = [streamed(r, "response_body") for r in replies]
    assert [len(p) for p, _ in pieces] == [62000, len(body) - 62000]
    assert b"".join(p for p, _ in pieces) == body and pieces[-1][1]
    life = h.finished()  # at the response's end
    assert h.scheduler.in_flight() == {}
    assert h.handler.done  # the response's last reply is the stream's last: it goes with the status
    h.handler.close()
    assert h.finished() is life
    assert life.ending is Ending.RESPONSE
    assert life.outcome.usage == Usage(5, 9, 14)
    assert life.outcome.status == 200
    assert not life.outcome.streaming
    assert life.outcome.response_body_bytes == len(body)


def test_sse_chunks_are_echoed_at_once_and_usage_read_across_chunks() -> None:
    h = Harness()
    route(h)
    h.send(response_headers_message({":status": "200", "content-type": "text/event-stream; charset=utf-8"}))
    events = [
        b'data: {"choices":[{"text":"a"}]}\n\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":2,',
        b'"completion_tokens":1,"total_tokens":3}}\n\ndata: [DONE]\n\n',
    ]
    for i, event in enumerate(events):
        replies = h.send(response_body_message(event, i == len(events) - 1))
        assert [streamed(r, "response_body") for r in replies] == [(event, i == len(events) - 1)]
    h.handler.close()
    life = h.finished()
    assert life.ending is Ending.RESPONSE
    assert life.outcome.streaming
    assert life.outcome.usage == Usage(2, 1, 3)


def test_served_endpoint_and_server_error_are_recorded_at_the_response_end() -> None:
    h = Harness()
    route(h)
    h.clock.advance(0.5)
    h.send(response_headers_message({":status": "503"}, served="10.0.0.2:8000"))
    h.send(response_body_message(b"overloaded", True))
    life = h.finished()  # at response end, before the stream closes
    assert h.scheduler.in_flight() == {}
    h.handler.close()
    h.handler.close()  # idempotent
    assert h.finished() is life
    assert life.ending is Ending.RESPONSE
    assert life.outcome.status == 503 and life.outcome.served_address == "10.0.0.2:8000"
    assert life.outcome.ttft_s == 0.5


@pytest.mark.parametrize(
    ("line", "usage"),
    [
        (b'data: {"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}', Usage(1, 2, 3)),
        (b"data: [DONE]", None),
        (b'data: {"choices":[]}', None),
        (b": keep-alive", None),
        (b'data: {"usage": null}', None),
    ],
    ids=["usage", "done", "no-usage", "comment", "usage-null"],
)
def test_parse_sse_usage(line: bytes, usage: Usage | None) -> None:
    assert parse_sse_usage(line) == usage


# -- the request-only path: the stream ends once routed, the access log finishes the request ------


def metadata_key(reply: pb.ProcessingResponse) -> str:
    fields = reply.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    return str(fields["lora-epp-completion-key"].string_value)


def route_request_only(h: Harness, mode: int = Mode.FULL_DUPLEX_STREAMED) -> list[pb.ProcessingResponse]:
    """Route with the data plane announcing that no response body follows (our default config);
    returns the replies to the body, the first of which carries the pick."""
    h.send(headers_message({"x-request-id": "r"}, request_mode=mode, response_mode=Mode.NONE))
    return h.send(body_message(BODY, True))


@pytest.mark.parametrize("mode", [Mode.FULL_DUPLEX_STREAMED, Mode.BUFFERED], ids=["fdx", "buffered"])
def test_with_no_response_body_the_stream_ends_once_routed(mode: int) -> None:
    clock = FakeClock()
    h = Harness(completions=Completions(clock), clock=clock)
    replies = route_request_only(h, mode)
    routing = replies[0]
    assert metadata_destination(routing) == "10.0.0.1:8000"
    assert metadata_key(routing) == h.life.key  # the access log brings it back
    assert h.life.key.startswith(f"{KEY_PREFIX}-")
    assert h.handler.done  # the server ends the stream: nothing of the response passes through
    assert h.send(pb.ProcessingRequest(response_headers=pb.HttpHeaders())) == []


@pytest.mark.parametrize("mode", [Mode.FULL_DUPLEX_STREAMED, Mode.BUFFERED], ids=["fdx", "buffered"])
def test_the_completion_key_also_goes_upstream_as_a_header(mode: int) -> None:
    """For gateways whose ext_proc filter drops the metadata, the access log can record the header."""
    clock = FakeClock()
    h = Harness(completions=Completions(clock), clock=clock)
    routing = route_request_only(h, mode)[0]
    phase = "request_body" if mode == Mode.BUFFERED else "request_headers"
    assert set_headers(routing, phase)["x-lora-epp-completion-key"] == metadata_key(routing) == h.life.key


def test_without_access_log_completions_no_key_header_is_set() -> None:
    h = Harness()
    routing = route_request_only(h)[0]
    assert "x-lora-epp-completion-key" not in set_headers(routing)


def test_with_a_response_body_coming_the_stream_stays_open() -> None:
    clock = FakeClock()
    h = Harness(completions=Completions(clock), clock=clock)
    route(h)
    assert not h.handler.done


def test_a_request_waits_for_its_access_log_entry_when_the_gateway_sends_one() -> None:
    clock = FakeClock()
    completions = Completions(clock)
    completions.log_stream_opened("ipv4:10.0.0.9:60000")
    h = Harness(completions=completions, clock=clock)
    key = metadata_key(route_request_only(h)[0])
    h.handler.close()
    assert h.observer.finished_lives == []  # still in flight
    assert h.scheduler.in_flight() == {key: "pod-0-rank-0"}
    assert not h.life.finished
    entry = Completion(
        status=503, served_address="10.0.0.2:8000", response_body_bytes=9, duration_s=1.5, ttft_s=0.2
    )
    assert completions.on_entry(key, entry)
    assert h.scheduler.in_flight() == {}
    life = h.finished()
    assert life is h.handler.life
    assert life.ending is Ending.ACCESS_LOG
    outcome = life.outcome
    assert (outcome.status, outcome.response_body_bytes) == (503, 9)
    assert (outcome.duration_s, outcome.ttft_s, outcome.served_address) == (1.5, 0.2, "10.0.0.2:8000")
    assert len(completions) == 0


def test_an_entry_that_comes_while_the_stream_is_open_finishes_the_request_at_its_end() -> None:
    clock = FakeClock()
    completions = Completions(clock)
    completions.log_stream_opened("ipv4:10.0.0.9:60000")
    h = Harness(completions=completions, clock=clock)
    key = metadata_key(route_request_only(h)[0])
    assert completions.on_entry(key, Completion(status=200, served_address="10.0.0.1:8000", duration_s=0.3))
    assert not h.life.finished  # its stream finishes it, with that entry
    h.handler.close()
    life = h.finished()
    assert life.ending is Ending.ACCESS_LOG
    assert (life.outcome.status, life.outcome.duration_s) == (200, 0.3)
    assert h.scheduler.in_flight() == {}
    assert len(completions) == 0


def test_without_an_access_log_the_request_finishes_when_its_stream_ends() -> None:
    clock = FakeClock()
    completions = Completions(clock)
    completions.log_stream_opened("ipv4:10.0.0.7:60000")  # another gateway's log stream
    h = Harness(completions=completions, clock=clock)
    key = metadata_key(route_request_only(h)[0])
    h.handler.close()
    assert h.scheduler.in_flight() == {}
    assert h.finished().ending is Ending.STREAM_END
    assert not completions.on_entry(key, Completion(200, None))  # nothing waits for it any more


def test_without_completions_the_request_finishes_when_its_stream_ends() -> None:
    h = Harness()
    route_request_only(h)
    assert h.handler.done
    h.handler.close()
    assert h.finished().ending is Ending.STREAM_END
    assert h.scheduler.in_flight() == {}


def test_an_entry_that_never_comes_expires() -> None:
    clock = FakeClock()
    completions = Completions(clock, wait_s=5.0)
    completions.log_stream_opened("ipv4:10.0.0.9:60000")
    h = Harness(completions=completions, clock=clock)
    route_request_only(h)
    h.handler.close()
    clock.advance(4.0)
    completions.expire()
    assert not h.life.finished
    clock.advance(2.0)
    completions.expire()
    assert h.scheduler.in_flight() == {}
    assert h.finished().ending is Ending.EXPIRED
    assert completions.expired == 1


def test_a_response_that_passes_through_finishes_the_request_itself() -> None:
    clock = FakeClock()
    completions = Completions(clock)
    completions.log_stream_opened("ipv4:10.0.0.9:60000")
    h = Harness(completions=completions, clock=clock, leave=LeavePolicy.NEVER)
    h.send(headers_message({"x-request-id": "r"}, request_mode=Mode.FULL_DUPLEX_STREAMED))
    key = metadata_key(h.send(body_message(BODY, True))[0])
    assert not h.handler.done
    h.send(response_headers_message({":status": "200", "content-type": "application/json"}))
    h.send(response_body_message(b"{}", True))
    h.handler.close()
    assert h.finished().ending is Ending.RESPONSE
    assert not completions.on_entry(key, Completion(200, None))  # the later log entry is ignored
    assert h.observer.kinds() == ["scheduled", "finished"]
    assert h.scheduler.in_flight() == {}


# -- leaving a stream whose data plane would send the response -------------------------------------


def streamed_body(replies: list[pb.ProcessingResponse]) -> tuple[bytes, list[bool]]:
    """The request body the replies send upstream, and each body reply's end_of_stream."""
    parts = [
        r.request_body.response.body_mutation.streamed_response for r in replies if r.HasField("request_body")
    ]
    return b"".join(p.body for p in parts), [p.end_of_stream for p in parts]


def logging_gateway(clock: FakeClock) -> Completions:
    completions = Completions(clock)
    completions.log_stream_opened("ipv4:10.0.0.9:60000")  # the gateway of GATEWAY sends its access log
    return completions


def test_with_the_gateways_access_log_the_stream_is_left_after_routing_and_the_log_finishes_it() -> None:
    clock = FakeClock()
    completions = logging_gateway(clock)
    h = Harness(completions=completions, clock=clock)
    h.send(headers_message({"x-request-id": "r"}, request_mode=Mode.FULL_DUPLEX_STREAMED))
    replies = h.send(body_message(BODY, True))
    assert h.handler.done and h.handler.left
    assert replies[0].HasField("request_headers")
    body, ends = streamed_body(replies)
    assert body == BODY
    # The last reply carries the body's last byte alone: it is what lets the request go upstream.
    assert replies[-1].request_body.response.body_mutation.streamed_response.body == BODY[-1:]
    assert ends == [False] * (len(ends) - 1) + [True]
    assert set_headers(replies[0])["Content-Length"] == str(len(BODY))
    h.handler.close()
    assert h.observer.finished_lives == []  # still in flight: its response is on its way
    assert h.scheduler.in_flight() != {}
    assert completions.on_entry(metadata_key(replies[0]), Completion(200, "10.0.0.1:8000"))
    life = h.finished()
    assert life.ending is Ending.ACCESS_LOG and life.outcome.status == 200
    assert h.scheduler.in_flight() == {}
    assert h.handler.ending == "left-after-routing"


def test_without_an_access_log_the_response_passes_through_and_finishes_the_request() -> None:
    h = Harness(completions=Completions(FakeClock()))
    h.send(headers_message({"x-request-id": "r"}, request_mode=Mode.FULL_DUPLEX_STREAMED))
    replies = h.send(body_message(BODY, True))
    assert not h.handler.done
    assert streamed_body(replies) == (BODY, [True])
    h.send(response_headers_message({":status": "200", "content-type": "application/json"}))
    h.send(response_body_message(b"{}", True))
    assert h.finished().ending is Ending.RESPONSE
    assert h.handler.ending == "response"


def test_leaving_always_without_an_access_log_finishes_the_request_when_its_stream_ends() -> None:
    h = Harness(completions=Completions(FakeClock()), leave=LeavePolicy.ALWAYS)
    h.send(headers_message({"x-request-id": "r"}, request_mode=Mode.FULL_DUPLEX_STREAMED))
    h.send(body_message(BODY, True))
    assert h.handler.done and h.handler.left
    h.handler.close()
    assert h.finished().ending is Ending.STREAM_END
    assert h.scheduler.in_flight() == {}


def test_a_request_without_a_body_leaves_with_its_headers_reply() -> None:
    clock = FakeClock()
    h = Harness(completions=logging_gateway(clock), clock=clock)
    replies = h.send(
        headers_message({"x-request-id": "r"}, end_of_stream=True, request_mode=Mode.FULL_DUPLEX_STREAMED)
    )
    assert [r.WhichOneof("response") for r in replies] == ["request_headers"]
    assert h.handler.done and h.handler.left


def test_a_request_with_trailers_keeps_its_stream_open() -> None:
    clock = FakeClock()
    h = Harness(completions=logging_gateway(clock), clock=clock)
    h.send(headers_message({"x-request-id": "r"}, request_mode=Mode.FULL_DUPLEX_STREAMED))
    h.send(body_message(BODY, False))
    replies = h.send(pb.ProcessingRequest(request_trailers=pb.HttpTrailers()))
    assert replies[-1].HasField("request_trailers")
    assert not h.handler.done and not h.handler.left


def test_never_leaving_keeps_the_stream_to_the_response() -> None:
    clock = FakeClock()
    h = Harness(completions=logging_gateway(clock), clock=clock, leave=LeavePolicy.NEVER)
    h.send(headers_message({"x-request-id": "r"}, request_mode=Mode.FULL_DUPLEX_STREAMED))
    h.send(body_message(BODY, True))
    assert not h.handler.done


# -- requests that wait: flow control's queue, and the hold ----------------------------------------

FLOW = FlowControlSettings(enabled=True)
ONE_POD = ("10.0.0.1",)
QUEUE_TTL_MESSAGE = "inference gateway: ServiceUnavailable - request timed out in queue: request TTL expired"


def scrape(h: Harness, endpoint: str = "pod-0-rank-0", **fields: object) -> None:
    """A fresh scrape of `endpoint` showing `fields`."""
    h.datastore.update_metrics(endpoint, Metrics(updated_at=h.clock.now(), **fields))  # type: ignore[arg-type]


def fill(h: Harness) -> None:
    """The pod's waiting queue is over the queue-depth threshold (5): the gate holds every request."""
    scrape(h, waiting_requests=10)


def empty(h: Harness) -> None:
    scrape(h, waiting_requests=0)


def model_body(model: str) -> bytes:
    return json.dumps({"model": model, "prompt": "hello"}).encode()


def arrive(
    handler: StreamHandler,
    *,
    body: bytes = BODY,
    mode: int = Mode.FULL_DUPLEX_STREAMED,
    response_mode: int | None = None,
    request_id: str = "r",
) -> list[pb.ProcessingResponse] | Pending:
    """Send a request's headers and whole body; returns the answer to the body."""
    first = handler.handle(
        headers_message({"x-request-id": request_id}, request_mode=mode, response_mode=response_mode)
    )
    assert not isinstance(first, Pending)
    assert len(first) == (1 if mode == Mode.BUFFERED else 0)
    return handler.handle(body_message(body, True))


async def waiting(handler: StreamHandler) -> asyncio.Task[list[pb.ProcessingResponse]]:
    """`resume`, as the server awaits it, run until it waits."""
    task = asyncio.create_task(handler.resume())
    await asyncio.sleep(0)
    assert not task.done()
    return task


async def client_leaves(task: asyncio.Task[list[pb.ProcessingResponse]], handler: StreamHandler) -> None:
    """The data plane resets the stream: grpc cancels the server's wait, then the stream closes."""
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    handler.close()


def assert_routed_fdx(replies: list[pb.ProcessingResponse], destination: str, body: bytes = BODY) -> None:
    assert [r.WhichOneof("response") for r in replies] == ["request_headers", "request_body"]
    assert set_headers(replies[0]) == {
        "x-gateway-destination-endpoint": destination,
        "Content-Length": str(len(body)),
    }
    assert metadata_destination(replies[0]) == destination
    assert streamed(replies[1]) == (body, True)


async def test_a_queued_request_is_pending_until_capacity_frees() -> None:
    h = Harness(pod_ips=ONE_POD, flow=FLOW)
    fill(h)
    assert arrive(h.handler) is PENDING
    life = h.life
    assert life.stage is Stage.QUEUED and h.queued() == 1
    assert h.scheduler.scheduled == [] and h.scheduler.in_flight() == {}
    assert h.observer.events == [("queued", life.key, "")]
    resumed = await waiting(h.handler)
    h.clock.advance(1.0)
    h.director.pump()  # still full: it keeps waiting
    await asyncio.sleep(0)
    assert not resumed.done() and life.stage is Stage.QUEUED
    empty(h)
    h.director.pump()
    replies = await asyncio.wait_for(resumed, 1)
    assert_routed_fdx(replies, "10.0.0.1:8000")
    assert h.life.stage is Stage.DISPATCHED and not life.finished
    assert life.queue_wait_s == 1.0
    assert h.queued() == 0
    assert h.scheduler.in_flight() == {life.key: "pod-0-rank-0"}
    assert ("left_queue", life.key, "Dispatched") in h.observer.events
    assert ("scheduled", life.key, "pod-0-rank-0") in h.observer.events
    # From here it is an ordinary routed request: its response finishes it.
    h.send(response_headers_message({":status": "200", "content-type": "application/json"}))
    h.send(response_body_message(b"{}", True))
    assert h.finished() is life and life.ending is Ending.RESPONSE
    assert h.scheduler.in_flight() == {}


async def test_a_queued_request_that_capacity_already_freed_for_is_answered_at_once() -> None:
    h = Harness(pod_ips=ONE_POD, flow=FLOW)
    fill(h)
    assert arrive(h.handler) is PENDING
    empty(h)
    h.director.pump()  # dispatched before the server asked for its replies
    assert h.life.stage is Stage.DISPATCHED
    assert_routed_fdx(await asyncio.wait_for(h.handler.resume(), 1), "10.0.0.1:8000")


async def test_a_queued_buffered_request_asks_the_data_plane_to_keep_waiting() -> None:
    h = Harness(pod_ips=ONE_POD, flow=FLOW, mode=BodyMode.BUFFERED)
    fill(h)
    answer = arrive(h.handler, mode=Mode.BUFFERED)
    assert isinstance(answer, Pending)
    [keep_waiting] = answer.now
    assert keep_waiting.WhichOneof("response") is None
    assert keep_waiting.override_message_timeout.ToMilliseconds() == 90_000
    resumed = await waiting(h.handler)
    empty(h)
    h.director.pump()
    [reply] = await asyncio.wait_for(resumed, 1)
    assert set_headers(reply, "request_body") == {
        "x-gateway-destination-endpoint": "10.0.0.1:8000",
        "Content-Length": str(len(BODY)),
    }
    assert reply.request_body.response.body_mutation.body == BODY
    assert metadata_destination(reply) == "10.0.0.1:8000"


async def test_a_request_waits_for_a_lora_slot_until_the_slot_holder_finishes() -> None:
    h = Harness(pod_ips=ONE_POD, flow=FLOW)
    scrape(h, lora_enabled=True, max_lora=1)
    holder = h.stream()
    first = arrive(holder, body=model_body("adapter-a"))
    assert not isinstance(first, Pending)
    assert metadata_destination(first[0]) == "10.0.0.1:8000"
    body_b = model_body("adapter-b")
    assert arrive(h.handler, body=body_b) is PENDING  # the pod's one slot is adapter-a's
    resumed = await waiting(h.handler)
    # adapter-a's response passes through: its request finishes, its slot frees and the queue moves.
    holder.handle(response_headers_message({":status": "200", "content-type": "application/json"}))
    holder.handle(response_body_message(b"{}", True))
    assert holder.life is not None and holder.life.ending is Ending.RESPONSE
    assert_routed_fdx(await asyncio.wait_for(resumed, 1), "10.0.0.1:8000", body_b)
    assert h.scheduler.in_flight() == {h.life.key: "pod-0-rank-0"}


async def test_a_queued_request_whose_ttl_runs_out_is_answered_503() -> None:
    h = Harness(pod_ips=ONE_POD, flow=FlowControlSettings(enabled=True, request_ttl_s=5.0))
    fill(h)
    assert arrive(h.handler) is PENDING
    life = h.life
    resumed = await waiting(h.handler)
    h.clock.advance(6.0)
    fill(h)  # still full when the TTL runs out
    h.director.pump()
    replies = await asyncio.wait_for(resumed, 1)
    code, headers, body = immediate(replies)
    assert code == 503 and "retry-after" not in headers
    assert body == {"error": {"message": QUEUE_TTL_MESSAGE, "type": "ServiceUnavailable", "code": 503}}
    assert h.handler.done
    assert h.queued() == 0
    assert ("left_queue", life.key, "EvictedTTL") in h.observer.events
    h.handler.close()
    assert h.finished() is life
    assert (life.ending, life.outcome.status) == (Ending.REFUSED, 503)
    assert life.queue_wait_s == 6.0
    empty(h)
    h.director.pump()
    assert h.scheduler.scheduled == [] and h.scheduler.in_flight() == {}


async def test_a_queued_request_is_routed_when_the_queues_are_released() -> None:
    h = Harness(pod_ips=ONE_POD, flow=FLOW)
    fill(h)
    assert arrive(h.handler) is PENDING
    resumed = await waiting(h.handler)
    h.director.release_queues()  # shutting down: the pod takes it, busy as it is
    assert_routed_fdx(await asyncio.wait_for(resumed, 1), "10.0.0.1:8000")
    assert h.queued() == 0
    assert ("left_queue", h.life.key, "Dispatched") in h.observer.events


def test_a_request_the_full_queue_cannot_take_is_answered_429() -> None:
    h = Harness(pod_ips=ONE_POD, flow=FlowControlSettings(enabled=True, max_requests=1))
    fill(h)
    first = h.stream()
    assert arrive(first) is PENDING
    answer = arrive(h.handler)
    assert not isinstance(answer, Pending)
    code, headers, body = immediate(answer)
    assert code == 429 and "retry-after" in headers
    assert [outcome for _, outcome in h.observer.refusals] == ["queue-full"]
    assert body["error"]["message"] == (
        "inference gateway: InferencePoolResourceExhausted - request rejected pre-queue: queue at capacity"
    )
    h.handler.close()
    life = h.finished()
    assert (life.ending, life.outcome.status) == (Ending.REFUSED, 429)
    assert h.queued() == 1  # the first one still waits
    first.close()
    assert h.queued() == 0


@pytest.mark.parametrize("resumed", [True, False], ids=["while-resume-waits", "before-resume"])
async def test_a_client_that_leaves_while_queued_leaves_the_queue(resumed: bool) -> None:
    h = Harness(pod_ips=ONE_POD, flow=FLOW)
    fill(h)
    assert arrive(h.handler) is PENDING
    life = h.life
    if resumed:
        await client_leaves(await waiting(h.handler), h.handler)
    else:
        h.handler.close()
    assert h.finished() is life
    assert life.ending is Ending.CLIENT_GONE
    assert life.error is None and life.outcome.status is None  # nothing was answered
    assert h.queued() == 0
    assert ("left_queue", life.key, "EvictedContextCancelled") in h.observer.events
    empty(h)
    h.director.pump()
    assert h.scheduler.scheduled == [] and h.scheduler.in_flight() == {}
    h.handler.close()
    assert h.finished() is life  # once


async def test_a_client_that_leaves_after_dispatch_but_before_its_replies_is_gone() -> None:
    """The queue let the request go, but its stream was reset before the server sent the replies:
    they never reached the data plane, so no access-log entry can come for it either."""
    clock = FakeClock()
    completions = Completions(clock)
    completions.log_stream_opened("ipv4:10.0.0.9:60000")
    h = Harness(pod_ips=ONE_POD, flow=FLOW, clock=clock, completions=completions)
    fill(h)
    assert arrive(h.handler, response_mode=Mode.NONE) is PENDING
    life = h.life
    resumed = await waiting(h.handler)
    empty(h)
    h.director.pump()  # dispatched; the stream is reset before the server's wait wakes
    assert life.stage is Stage.DISPATCHED
    await client_leaves(resumed, h.handler)
    assert h.finished() is life
    assert (life.ending, life.outcome.status) == (Ending.CLIENT_GONE, 499)
    assert h.scheduler.in_flight() == {}
    assert len(completions) == 0


async def test_a_buffered_request_refused_in_the_queue_before_the_server_waits_is_answered() -> None:
    """BUFFERED: the server sends the keep-waiting reply before it awaits `resume`; the queue may
    refuse the request (its TTL) meanwhile."""
    h = Harness(pod_ips=ONE_POD, flow=FlowControlSettings(enabled=True, request_ttl_s=5.0))
    fill(h)
    assert isinstance(arrive(h.handler, mode=Mode.BUFFERED), Pending)
    h.clock.advance(6.0)
    fill(h)
    h.director.pump()
    code, _, body = immediate(await asyncio.wait_for(h.handler.resume(), 1))
    assert code == 503
    assert body["error"]["message"] == QUEUE_TTL_MESSAGE


class Gate:
    """A hold that waits until released, then narrows the decision to `keep` endpoints or fails."""

    def __init__(self, *, keep: slice = slice(None), error: EppError | None = None) -> None:
        self.released = asyncio.Event()
        self.keep = keep
        self.error = error
        self.held: list[tuple[str, Stage]] = []

    async def __call__(self, life: RequestLife) -> None:
        self.held.append((life.key, life.stage))
        await self.released.wait()
        if self.error is not None:
            raise self.error
        decision = life.decision
        assert decision is not None
        life.decision = dataclasses.replace(decision, endpoints=decision.endpoints[self.keep])


async def test_the_hold_lets_a_routed_request_go_and_may_narrow_its_destination() -> None:
    gate = Gate(keep=slice(1, None))
    h = Harness(hold=gate, max_endpoints=2)
    assert arrive(h.handler) is PENDING
    life = h.life
    assert life.stage is Stage.DISPATCHED  # dispatched, and counted in flight, while it is held
    assert h.scheduler.in_flight() == {life.key: "pod-0-rank-0"}
    resumed = await waiting(h.handler)
    assert gate.held == [(life.key, Stage.DISPATCHED)]
    gate.released.set()
    assert_routed_fdx(await asyncio.wait_for(resumed, 1), "10.0.0.2:8000")
    h.send(response_headers_message({":status": "200"}))
    h.send(response_body_message(b"{}", True))
    assert h.finished().ending is Ending.RESPONSE
    assert h.scheduler.in_flight() == {}


async def test_a_buffered_request_held_asks_the_data_plane_to_keep_waiting() -> None:
    gate = Gate()
    h = Harness(hold=gate, mode=BodyMode.BUFFERED)
    answer = arrive(h.handler, mode=Mode.BUFFERED)
    assert isinstance(answer, Pending)
    assert [r.override_message_timeout.ToMilliseconds() for r in answer.now] == [90_000]
    resumed = await waiting(h.handler)
    gate.released.set()
    [reply] = await asyncio.wait_for(resumed, 1)
    assert metadata_destination(reply) == "10.0.0.1:8000"


async def test_a_hold_that_fails_answers_the_error_and_releases_the_request() -> None:
    error = EppError(ErrorCode.SERVICE_UNAVAILABLE, "adapter failed to load", reason="adapter-load")
    gate = Gate(error=error)
    h = Harness(hold=gate)
    assert arrive(h.handler) is PENDING
    resumed = await waiting(h.handler)
    gate.released.set()
    code, _, body = immediate(await asyncio.wait_for(resumed, 1))
    assert code == 503
    assert body["error"]["message"] == "inference gateway: ServiceUnavailable - adapter failed to load"
    assert h.handler.done
    h.handler.close()
    life = h.finished()
    assert (life.ending, life.error, life.outcome.status) == (Ending.REFUSED, error, 503)
    assert h.scheduler.in_flight() == {}


async def test_a_client_that_leaves_while_held_is_gone_and_released() -> None:
    gate = Gate()
    h = Harness(hold=gate)
    assert arrive(h.handler) is PENDING
    await client_leaves(await waiting(h.handler), h.handler)
    life = h.finished()
    assert (life.ending, life.outcome.status) == (Ending.CLIENT_GONE, 499)
    assert life.error is None
    assert h.scheduler.in_flight() == {}


async def test_a_client_that_leaves_before_a_held_buffered_request_waits_is_gone() -> None:
    """BUFFERED with a hold: the stream is reset while the server sends its keep-waiting reply,
    before it awaits `resume`. Nothing was sent on, so nothing waits for an access-log entry."""
    clock = FakeClock()
    completions = Completions(clock)
    completions.log_stream_opened("ipv4:10.0.0.9:60000")
    h = Harness(hold=Gate(), mode=BodyMode.BUFFERED, clock=clock, completions=completions)
    assert isinstance(arrive(h.handler, mode=Mode.BUFFERED, response_mode=Mode.NONE), Pending)
    h.handler.close()
    life = h.finished()
    assert (life.ending, life.outcome.status) == (Ending.CLIENT_GONE, 499)
    assert h.scheduler.in_flight() == {}
    assert len(completions) == 0
