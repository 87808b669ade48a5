"""ProcessingResponse builders, compared as whole protobuf messages."""

from __future__ import annotations

import json

import pytest
from google.protobuf import struct_pb2

from epp._proto.envoy.config.core.v3 import base_pb2
from epp._proto.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp._proto.envoy.type.v3 import http_status_pb2
from epp.errors import EppError, ErrorCode
from epp.picker.extproc import messages

OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def option(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode()), append_action=OVERWRITE
    )


def lb_metadata(value: str) -> struct_pb2.Struct:
    metadata = struct_pb2.Struct()
    metadata.fields["envoy.lb"].struct_value.fields["x-gateway-destination-endpoint"].string_value = value
    return metadata


def test_request_headers_reply_with_destination() -> None:
    got = messages.request_headers_reply(
        set_headers=messages.routing_headers("10.0.0.1:8000,10.0.0.2:8000", 42),
        remove_headers=["x-gateway-destination-endpoint-served"],
        destination="10.0.0.1:8000,10.0.0.2:8000",
    )
    want = pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(
            response=pb.CommonResponse(
                clear_route_cache=True,
                header_mutation=pb.HeaderMutation(
                    set_headers=[
                        option("x-gateway-destination-endpoint", "10.0.0.1:8000,10.0.0.2:8000"),
                        option("Content-Length", "42"),
                    ],
                    remove_headers=["x-gateway-destination-endpoint-served"],
                ),
            )
        ),
        dynamic_metadata=lb_metadata("10.0.0.1:8000,10.0.0.2:8000"),
    )
    assert got == want


def test_headers_only_routing_sets_no_content_length() -> None:
    assert messages.routing_headers("10.0.0.1:8000", None) == [
        ("x-gateway-destination-endpoint", "10.0.0.1:8000")
    ]
    assert messages.routing_headers("10.0.0.1:8000", 0) == [
        ("x-gateway-destination-endpoint", "10.0.0.1:8000")
    ]


def test_bare_headers_reply_only_clears_route_cache() -> None:
    want = pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(response=pb.CommonResponse(clear_route_cache=True))
    )
    assert messages.request_headers_reply() == want


@pytest.mark.parametrize(
    ("size", "pieces"),
    [
        (0, [(0, True)]),
        (1, [(1, True)]),
        (62000, [(62000, True)]),
        (62001, [(62000, False), (1, True)]),
        (124000, [(62000, False), (62000, True)]),
        (200000, [(62000, False), (62000, False), (62000, False), (14000, True)]),
    ],
    ids=["empty", "one-byte", "exact", "one-over", "two-exact", "four"],
)
def test_chunking_at_62000(size: int, pieces: list[tuple[int, bool]]) -> None:
    body = bytes(i % 251 for i in range(size))
    replies = messages.chunked_request_body(body)
    got = [
        (
            len(r.request_body.response.body_mutation.streamed_response.body),
            r.request_body.response.body_mutation.streamed_response.end_of_stream,
        )
        for r in replies
    ]
    assert got == pieces
    assert b"".join(r.request_body.response.body_mutation.streamed_response.body for r in replies) == body


def test_streamed_response_body_message() -> None:
    want = pb.ProcessingResponse(
        response_body=pb.BodyResponse(
            response=pb.CommonResponse(
                body_mutation=pb.BodyMutation(
                    streamed_response=pb.StreamedBodyResponse(body=b"data: {}\n\n", end_of_stream=False)
                )
            )
        )
    )
    assert messages.streamed_response_body(b"data: {}\n\n", False) == want


def test_buffered_body_reply_carries_headers_body_and_metadata() -> None:
    got = messages.buffered_request_body_reply(b'{"model":"x"}', "10.0.0.1:8000")
    want = pb.ProcessingResponse(
        request_body=pb.BodyResponse(
            response=pb.CommonResponse(
                header_mutation=pb.HeaderMutation(
                    set_headers=[
                        option("x-gateway-destination-endpoint", "10.0.0.1:8000"),
                        option("Content-Length", "13"),
                    ]
                ),
                body_mutation=pb.BodyMutation(body=b'{"model":"x"}'),
            )
        ),
        dynamic_metadata=lb_metadata("10.0.0.1:8000"),
    )
    assert got == want


def test_response_headers_reply_marks_went_into_resp_headers() -> None:
    want = pb.ProcessingResponse(
        response_headers=pb.HeadersResponse(
            response=pb.CommonResponse(
                header_mutation=pb.HeaderMutation(set_headers=[option("x-went-into-resp-headers", "true")])
            )
        )
    )
    assert messages.response_headers_reply() == want


@pytest.mark.parametrize(
    ("error", "extra_headers"),
    [
        (EppError(ErrorCode.BAD_REQUEST, "model not found in request body"), []),
        (
            EppError(ErrorCode.SERVICE_UNAVAILABLE, "failed to find candidate pods for serving the request"),
            [],
        ),
        (
            EppError(ErrorCode.RESOURCE_EXHAUSTED, "system saturated, sheddable request dropped"),
            [("retry-after", "1")],
        ),
        (
            EppError(
                ErrorCode.RESOURCE_EXHAUSTED,
                "request rejected by flow control: the pool is saturated",
                reason="predicted-wait",
                retry_after_s=7,
            ),
            [("retry-after", "7")],  # the flow-control judge's estimated wait
        ),
    ],
    ids=["400", "503", "429-retry-after", "429-estimated-retry-after"],
)
def test_immediate_error(error: EppError, extra_headers: list[tuple[str, str]]) -> None:
    got = messages.immediate_error(error)
    want = pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=error.http_status),
            headers=pb.HeaderMutation(
                set_headers=[option("content-type", "application/json")]
                + [option(k, v) for k, v in extra_headers]
            ),
            body=error.body(),
        )
    )
    assert got == want
    assert json.loads(got.immediate_response.body)["error"]["message"] == error.text()


def test_header_map_prefers_raw_value_and_lowercases() -> None:
    headers = pb.HttpHeaders(
        headers=base_pb2.HeaderMap(
            headers=[
                base_pb2.HeaderValue(key="X-Request-ID", raw_value=b"abc"),
                base_pb2.HeaderValue(key="content-type", value="application/json"),
            ]
        )
    )
    assert messages.header_map(headers) == {"x-request-id": "abc", "content-type": "application/json"}


def test_header_values_reads_only_the_names_asked_for() -> None:
    headers = pb.HttpHeaders(
        headers=base_pb2.HeaderMap(
            headers=[
                base_pb2.HeaderValue(key=":status", raw_value=b"503"),
                base_pb2.HeaderValue(key="Content-Type", value="text/event-stream"),
                base_pb2.HeaderValue(key="x-other", raw_value=b"ignored"),
                base_pb2.HeaderValue(key=":status", raw_value=b"200"),  # a repeated name keeps the last
            ]
        )
    )
    got = messages.header_values(headers, frozenset({":status", "content-type"}))
    assert got == {":status": "200", "content-type": "text/event-stream"}


def test_request_headers_reply_matches_the_message_built_from_parts() -> None:
    got = messages.request_headers_reply(
        set_headers=[("x-gateway-destination-endpoint", "10.0.0.1:8000")],
        remove_headers=["x-gateway-destination-endpoint-served"],
        destination="10.0.0.1:8000",
    )
    want = pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(
            response=pb.CommonResponse(
                clear_route_cache=True,
                header_mutation=pb.HeaderMutation(
                    set_headers=[option("x-gateway-destination-endpoint", "10.0.0.1:8000")],
                    remove_headers=["x-gateway-destination-endpoint-served"],
                ),
            )
        ),
        dynamic_metadata=lb_metadata("10.0.0.1:8000"),
    )
    assert got == want
    assert messages.destination_metadata("10.0.0.1:8000") == lb_metadata("10.0.0.1:8000")


def test_response_headers_reply_with_extra_headers_keeps_the_shared_reply_unchanged() -> None:
    plain = pb.ProcessingResponse()
    plain.CopyFrom(messages.response_headers_reply())
    extra = messages.response_headers_reply([("x-extra", "1")])
    assert [h.header.key for h in extra.response_headers.response.header_mutation.set_headers] == [
        "x-went-into-resp-headers",
        "x-extra",
    ]
    assert messages.response_headers_reply() == plain


@pytest.mark.parametrize(("seconds", "millis"), [(90.0, 90_000), (0.25, 250), (61.5, 61_500)])
def test_keep_waiting_overrides_the_message_timeout_only(seconds: float, millis: int) -> None:
    reply = messages.keep_waiting(seconds)
    assert reply.WhichOneof("response") is None  # no phase: Envoy only restarts its timer
    assert reply.override_message_timeout.ToMilliseconds() == millis
    assert not reply.HasField("dynamic_metadata")
