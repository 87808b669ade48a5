"""Pure builders of `envoy.service.ext_proc.v3.ProcessingResponse` messages.

Header values go in `raw_value` (what Envoy sends and reads) with `OVERWRITE_IF_EXISTS_OR_ADD`,
so a client-sent copy of a header can never survive beside ours.

Replies that never vary are built once and shared: they are only ever serialized, never edited.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence

from google.protobuf import struct_pb2

from epp._proto.envoy.config.core.v3 import base_pb2
from epp._proto.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp._proto.envoy.type.v3 import http_status_pb2
from epp.errors import EppError
from epp.picker import wire

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD

Headers = Sequence[tuple[str, str]]


def header_option(name: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=name, raw_value=value.encode()),
        append_action=_OVERWRITE,
    )


def header_mutation(set_headers: Headers = (), remove_headers: Sequence[str] = ()) -> pb.HeaderMutation:
    return pb.HeaderMutation(
        set_headers=[header_option(name, value) for name, value in set_headers],
        remove_headers=list(remove_headers),
    )


def destination_metadata(destination: str, completion_key: str = "") -> struct_pb2.Struct:
    """`{"envoy.lb": {"x-gateway-destination-endpoint": destination}}`, byte-identical to the header,
    plus the completion key the gateway's access log sends back, when there is one."""
    metadata = struct_pb2.Struct()
    _set_destination(metadata, destination, completion_key)
    return metadata


def _set_destination(metadata: struct_pb2.Struct, destination: str, completion_key: str) -> None:
    # Field by field: `Struct.update` walks a Python dict and costs several times more.
    namespace = metadata.fields[wire.LB_METADATA_NAMESPACE].struct_value
    namespace.fields[wire.DESTINATION_ENDPOINT_KEY].string_value = destination
    if completion_key:
        namespace.fields[wire.COMPLETION_KEY].string_value = completion_key


def routing_headers(destination: str, body_length: int | None, extra: Headers = ()) -> list[tuple[str, str]]:
    """The destination header, Content-Length when the body is non-empty, then any extra headers."""
    headers = [(wire.DESTINATION_ENDPOINT_HEADER, destination)]
    if body_length:
        headers.append((wire.CONTENT_LENGTH_HEADER, str(body_length)))
    headers.extend(extra)
    return headers


def request_headers_reply(
    *,
    set_headers: Headers = (),
    remove_headers: Sequence[str] = (),
    destination: str | None = None,
    completion_key: str = "",
    clear_route_cache: bool = True,
) -> pb.ProcessingResponse:
    """Answer the request-headers message; with a destination, the routing metadata goes with it."""
    response = pb.ProcessingResponse()
    common = response.request_headers.response
    common.clear_route_cache = clear_route_cache
    if set_headers or remove_headers:
        mutation = common.header_mutation
        for name, value in set_headers:
            option = mutation.set_headers.add()
            option.header.key = name
            option.header.raw_value = value.encode()
            option.append_action = _OVERWRITE
        mutation.remove_headers.extend(remove_headers)
    if destination is not None:
        _set_destination(response.dynamic_metadata, destination, completion_key)
    return response


def chunks(body: bytes, chunk_bytes: int = wire.BODY_CHUNK_BYTES) -> Iterator[tuple[bytes, bool]]:
    """Cut `body` into `(chunk, end_of_stream)` pieces of at most `chunk_bytes`; empty → one empty piece."""
    if not body:
        yield b"", True
        return
    for start in range(0, len(body), chunk_bytes):
        end = start + chunk_bytes
        yield body[start:end], end >= len(body)


def streamed_request_body(body: bytes, end_of_stream: bool) -> pb.ProcessingResponse:
    response = pb.ProcessingResponse()
    # Field by field: nested constructors build and copy each level, several times slower.
    streamed = response.request_body.response.body_mutation.streamed_response
    streamed.body = body
    streamed.end_of_stream = end_of_stream
    return response


def streamed_response_body(body: bytes, end_of_stream: bool) -> pb.ProcessingResponse:
    """One response chunk handed back as it came (every chunk of a streamed response does this)."""
    response = pb.ProcessingResponse()
    streamed = response.response_body.response.body_mutation.streamed_response
    streamed.body = body
    streamed.end_of_stream = end_of_stream
    return response


def chunked_request_body(body: bytes) -> list[pb.ProcessingResponse]:
    return [streamed_request_body(chunk, eos) for chunk, eos in chunks(body)]


def chunked_response_body(body: bytes) -> list[pb.ProcessingResponse]:
    return [streamed_response_body(chunk, eos) for chunk, eos in chunks(body)]


def buffered_request_body_reply(
    body: bytes, destination: str, extra_headers: Headers = (), completion_key: str = ""
) -> pb.ProcessingResponse:
    """BUFFERED mode: the routing header, Content-Length and the whole body on the body reply."""
    common = pb.CommonResponse(
        header_mutation=header_mutation(routing_headers(destination, len(body), extra_headers)),
        body_mutation=pb.BodyMutation(body=body),
    )
    return pb.ProcessingResponse(
        request_body=pb.BodyResponse(response=common),
        dynamic_metadata=destination_metadata(destination, completion_key),
    )


def _response_headers_reply(set_headers: Headers) -> pb.ProcessingResponse:
    headers = [(wire.WENT_INTO_RESP_HEADERS, "true"), *set_headers]
    return pb.ProcessingResponse(
        response_headers=pb.HeadersResponse(
            response=pb.CommonResponse(header_mutation=header_mutation(headers))
        )
    )


_RESPONSE_HEADERS_REPLY = _response_headers_reply(())
_EMPTY_RESPONSE_BODY_REPLY = pb.ProcessingResponse(response_body=pb.BodyResponse())
_EMPTY_REQUEST_TRAILERS_REPLY = pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
_EMPTY_RESPONSE_TRAILERS_REPLY = pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


def response_headers_reply(set_headers: Headers = ()) -> pb.ProcessingResponse:
    """Mark the response as seen by the EPP; without extra headers, one shared message."""
    return _response_headers_reply(set_headers) if set_headers else _RESPONSE_HEADERS_REPLY


def empty_response_body_reply() -> pb.ProcessingResponse:
    return _EMPTY_RESPONSE_BODY_REPLY


def empty_request_trailers_reply() -> pb.ProcessingResponse:
    return _EMPTY_REQUEST_TRAILERS_REPLY


def empty_response_trailers_reply() -> pb.ProcessingResponse:
    return _EMPTY_RESPONSE_TRAILERS_REPLY


def keep_waiting(seconds: float) -> pb.ProcessingResponse:
    """Ask the data plane to wait `seconds` more for the reply to the message it sent last.

    BUFFERED mode times each message out (`message_timeout`); a request that waits in a queue or
    for an adapter load needs longer. Envoy restarts its timer with this value, up to its
    `max_message_timeout` (a value above that is ignored, and so is this reply without one).
    """
    response = pb.ProcessingResponse()
    response.override_message_timeout.FromMilliseconds(int(seconds * 1000))
    return response


def immediate_error(error: EppError, *, retry_after_s: int | None = None) -> pb.ProcessingResponse:
    """An ImmediateResponse with the OpenAI-style JSON error body; `retry-after` on 429 (the
    argument, else the error's own estimate, else 1 s)."""
    headers: list[tuple[str, str]] = [("content-type", wire.JSON_CONTENT_TYPE)]
    if error.http_status == 429:
        retry = retry_after_s if retry_after_s is not None else error.retry_after_s
        headers.append(("retry-after", str(retry if retry is not None else 1)))
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=error.http_status),
            headers=header_mutation(headers),
            body=error.body(),
        )
    )


def header_map(headers: pb.HttpHeaders | None) -> dict[str, str]:
    """Lower-cased name → value (`raw_value` first, `value` as fallback); a repeated name keeps the last."""
    result: dict[str, str] = {}
    if headers is None:
        return result
    for header in headers.headers.headers:
        value = header.raw_value.decode("utf-8", "replace") if header.raw_value else header.value
        result[header.key.lower()] = value
    return result


def header_values(headers: pb.HttpHeaders, names: Collection[str]) -> dict[str, str]:
    """`header_map` restricted to the lower-cased `names`: only those values are decoded."""
    result: dict[str, str] = {}
    for header in headers.headers.headers:
        key = header.key.lower()
        if key in names:
            result[key] = header.raw_value.decode("utf-8", "replace") if header.raw_value else header.value
    return result


def struct_field(metadata: Mapping[str, struct_pb2.Struct], namespace: str, key: str) -> object | None:
    """`metadata_context.filter_metadata[namespace][key]` as plain Python; None when absent."""
    if namespace not in metadata:
        return None
    fields = metadata[namespace].fields
    if key not in fields:
        return None
    value = fields[key]
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        return [_plain(v) for v in value.list_value.values]
    return _plain(value)


def _plain(value: struct_pb2.Value) -> object:
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "number_value":
        return value.number_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "list_value":
        return [_plain(v) for v in value.list_value.values]
    if kind == "struct_value":
        return {k: _plain(v) for k, v in value.struct_value.fields.items()}
    return None
