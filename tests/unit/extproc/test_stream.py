"""The per-stream state machine, driven with hand-built ProcessingRequest messages."""

from __future__ import annotations

import json
import random
import uuid

import pytest

from epp._proto.envoy.config.core.v3 import base_pb2
from epp._proto.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from epp._proto.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.clock import FakeClock
from epp.picker.director import Director
from epp.picker.extproc.completions import Completion, Completions
from epp.picker.extproc.stream import (
    BodyMode,
    ProtocolError,
    StreamHandler,
    StreamOptions,
    StreamSettings,
    parse_sse_usage,
)
from epp.picker.outcome import FinishedBy, StreamRecord, Usage
from tests.unit.fake_scheduler import FakeScheduler, pool_datastore

Mode = processing_mode_pb2.ProcessingMode
BODY = b'{"model":"m","prompt":"hello"}'
GATEWAY = "ipv4:10.0.0.9:41234"


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
    def __init__(
        self,
        *,
        mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED,
        pod_ips: tuple[str, ...] = ("10.0.0.1", "10.0.0.2"),
        exhausted: bool = False,
        max_request_body_bytes: int = 1 << 20,
        max_header_bytes: int = 8192,
        completions: Completions | None = None,
    ) -> None:
        self.scheduler = FakeScheduler(exhausted=exhausted)
        director = Director(pool_datastore(pod_ips), self.scheduler, clock=FakeClock(), rng=random.Random(1))
        self.records: list[StreamRecord] = []
        self.handler = StreamHandler(
            StreamOptions(
                director,
                StreamSettings(
                    default_body_mode=mode,
                    max_request_body_bytes=max_request_body_bytes,
                    max_header_bytes=max_header_bytes,
                ),
                on_finished=self.records.append,
                completions=completions,
            ),
            peer=GATEWAY,
        )

    def send(self, message: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        return self.handler.handle(message)


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
    assert streamed(replies[1]) == (BODY, True)


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
    h.handler.close()
    assert h.records[0].usage == Usage(3, 4, 7)


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
    assert h.scheduler.routed == [("Client-Id", "pod-0-rank-0")]


def test_request_id_generated_and_set_upstream() -> None:
    h = Harness()
    h.send(headers_message())
    replies = h.send(body_message(BODY, True))
    generated = set_headers(replies[0])["x-request-id"]
    assert uuid.UUID(generated).version == 4
    assert h.handler.request_id == generated


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


def immediate(replies: list[pb.ProcessingResponse]) -> tuple[int, dict[str, str], dict[str, object]]:
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
    h.handler.close()
    assert h.records[0].error is not None and h.records[0].error.http_status == status
    assert h.scheduler.completed == []


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


def test_message_without_a_phase_is_a_protocol_error() -> None:
    h = Harness()
    with pytest.raises(ProtocolError):
        h.send(pb.ProcessingRequest())


# -- response path -------------------------------------------------------------------------------


def route(h: Harness) -> None:
    h.send(headers_message({"x-request-id": "r"}, request_mode=Mode.FULL_DUPLEX_STREAMED))
    h.send(body_message(BODY, True))


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
    assert h.send(pb.ProcessingRequest(response_trailers=pb.HttpTrailers())) == [
        pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
    ]
    h.handler.close()
    assert h.records[0].usage == Usage(5, 9, 14)
    assert h.records[0].response_status == 200
    assert h.scheduler.completed == [("r", "pod-0-rank-0")]


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
    assert h.records[0].streaming_response
    assert h.records[0].usage == Usage(2, 1, 3)


def test_served_endpoint_and_server_error_reach_the_scheduler() -> None:
    h = Harness()
    route(h)
    h.send(response_headers_message({":status": "503"}, served="10.0.0.2:8000"))
    h.send(response_body_message(b"overloaded", True))
    assert h.scheduler.completed == [("r", "pod-1-rank-0")]  # at response end, before the stream closes
    h.handler.close()
    h.handler.close()  # idempotent
    assert h.scheduler.completed == [("r", "pod-1-rank-0")]
    assert len(h.records) == 1
    assert h.records[0].response_status == 503 and h.records[0].served_address == "10.0.0.2:8000"


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
    completions = Completions(FakeClock())
    h = Harness(completions=completions)
    replies = route_request_only(h, mode)
    routing = replies[0]
    assert metadata_destination(routing) == "10.0.0.1:8000"
    assert metadata_key(routing)  # the access log brings it back
    assert h.handler.done  # the server ends the stream: nothing of the response passes through
    assert h.send(pb.ProcessingRequest(response_headers=pb.HttpHeaders())) == []


def test_with_a_response_body_coming_the_stream_stays_open() -> None:
    h = Harness(completions=Completions(FakeClock()))
    route(h)
    assert not h.handler.done


def test_a_request_waits_for_its_access_log_entry_when_the_gateway_sends_one() -> None:
    completions = Completions(FakeClock())
    completions.log_stream_opened("ipv4:10.0.0.9:60000")
    h = Harness(completions=completions)
    key = metadata_key(route_request_only(h)[0])
    h.handler.close()
    assert h.scheduler.completed == [] and h.records == []  # still in flight
    entry = Completion(
        status=503, served_address="10.0.0.2:8000", response_body_bytes=9, duration_s=1.5, ttft_s=0.2
    )
    assert completions.on_entry(key, entry)
    assert h.scheduler.completed == [("r", "pod-1-rank-0")]  # the endpoint that answered
    [record] = h.records
    assert record.finished_by is FinishedBy.ACCESS_LOG
    assert (record.response_status, record.response_body_bytes) == (503, 9)
    assert (record.duration_s, record.ttft_s, record.served_address) == (1.5, 0.2, "10.0.0.2:8000")


def test_without_an_access_log_the_request_finishes_when_its_stream_ends() -> None:
    completions = Completions(FakeClock())
    completions.log_stream_opened("ipv4:10.0.0.7:60000")  # another gateway's log stream
    h = Harness(completions=completions)
    key = metadata_key(route_request_only(h)[0])
    h.handler.close()
    assert h.scheduler.completed == [("r", "pod-0-rank-0")]
    assert h.records[0].finished_by is FinishedBy.STREAM_END
    assert not completions.on_entry(key, Completion(200, None))  # nothing waits for it any more


def test_an_entry_that_never_comes_expires() -> None:
    clock = FakeClock()
    completions = Completions(clock, wait_s=5.0)
    completions.log_stream_opened("ipv4:10.0.0.9:60000")
    h = Harness(completions=completions)
    route_request_only(h)
    h.handler.close()
    clock.advance(6.0)
    completions.expire()
    assert h.scheduler.completed == [("r", "pod-0-rank-0")]
    assert h.records[0].finished_by is FinishedBy.EXPIRED


def test_a_response_that_passes_through_finishes_the_request_itself() -> None:
    completions = Completions(FakeClock())
    completions.log_stream_opened("ipv4:10.0.0.9:60000")
    h = Harness(completions=completions)
    h.send(headers_message({"x-request-id": "r"}, request_mode=Mode.FULL_DUPLEX_STREAMED))
    key = metadata_key(h.send(body_message(BODY, True))[0])
    h.send(response_headers_message({":status": "200", "content-type": "application/json"}))
    h.send(response_body_message(b"{}", True))
    h.handler.close()
    assert h.records[0].finished_by is FinishedBy.RESPONSE
    assert not completions.on_entry(key, Completion(200, None))  # the later log entry is ignored
    assert len(h.scheduler.completed) == 1
