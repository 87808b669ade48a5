"""Requests that end with HTTP trailers, through real Envoy: the pod gets the JSON body once, whole.

An HTTP/2 client (the `h2` library, raw frames over cleartext) sends a POST whose body is followed
by a trailers frame. In FULL_DUPLEX_STREAMED (request trailers SEND) the trailers, not the body,
end the request: the EPP routes then, and its last body chunk must not claim the end of the stream
(Envoy would otherwise close the ext_proc stream and never let the trailers, and so the end of the
request, go upstream). The pod answers 400 for a body with anything around the JSON.

Envoy 1.40 in FULL_DUPLEX_STREAMED with a route retry policy (every config we generate has one)
sends the EPP's body upstream twice when trailers follow it: the router's retry buffer is replayed
when the trailers are let go. BUFFERED, the generated default, is not affected.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from epp.picker.extproc.stream import BodyMode
from epp.tools.envoy.bootstrap import EnvoyOptions
from epp.tools.localstack import LocalStack
from tests.integration.conftest import ADAPTERS, EPP_STACK, _started

h2_connection = pytest.importorskip(
    "h2.connection", reason="h2 not installed: .venv/bin/pip install -e '.[test]'"
)
h2_config = pytest.importorskip("h2.config")
h2_events = pytest.importorskip("h2.events")

pytestmark = pytest.mark.integration


@dataclasses.dataclass(frozen=True, slots=True)
class H2Reply:
    status: int
    pod: str
    body: bytes


def post_with_trailers(
    stack: LocalStack, body: bytes, *, pieces: int = 3, timeout_s: float = 10.0
) -> H2Reply:
    """POST `body` over h2c in `pieces` DATA frames, then a trailers frame that ends the stream."""
    host, port = stack.gateway_url.removeprefix("http://").split(":")
    conn = h2_connection.H2Connection(h2_config.H2Configuration(client_side=True, header_encoding="utf-8"))
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        conn.initiate_connection()
        stream_id = conn.get_next_available_stream_id()
        request = [(":method", "POST"), (":path", "/v1/completions"), (":scheme", "http")]
        request += [
            (":authority", f"{host}:{port}"),
            ("content-type", "application/json"),
            ("te", "trailers"),
        ]
        conn.send_headers(stream_id, request)
        step = -(-len(body) // pieces)
        for start in range(0, len(body), step):
            conn.send_data(stream_id, body[start : start + step])
        conn.send_headers(stream_id, [("x-body-checksum", "none")], end_stream=True)
        sock.sendall(conn.data_to_send())
        headers: dict[str, str] = {}
        data = b""
        while True:
            received = sock.recv(65536)
            if not received:
                break
            events = conn.receive_data(received)
            for event in events:
                if isinstance(event, h2_events.ResponseReceived):
                    headers = dict(event.headers)
                elif isinstance(event, h2_events.DataReceived):
                    data += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            sock.sendall(conn.data_to_send())
            if any(isinstance(e, h2_events.StreamEnded | h2_events.StreamReset) for e in events):
                break
    return H2Reply(int(headers.get(":status", "0")), headers.get("x-inference-pod", ""), data)


def _ext_proc(bootstrap: dict[str, Any]) -> dict[str, Any]:
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    filters = [f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc"]
    config: dict[str, Any] = filters[0]["typed_config"]
    return config


def trailers_sent(bootstrap: dict[str, Any]) -> None:
    _ext_proc(bootstrap)["processing_mode"]["request_trailer_mode"] = "SEND"


def trailers_sent_and_no_retries(bootstrap: dict[str, Any]) -> None:
    trailers_sent(bootstrap)
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    for route in hcm["route_config"]["virtual_hosts"][0]["routes"]:
        route.get("route", {}).pop("retry_policy", None)


# Envoy as `epp envoy-config` writes it by default is the package's BUFFERED stack, which this
# test only reads from; the two variants get stacks of their own.
VARIANTS = {
    "buffered-trailers-send": dataclasses.replace(
        EPP_STACK, body_mode=BodyMode.BUFFERED, envoy_bootstrap_hook=trailers_sent
    ),
    "fdx-no-retries": dataclasses.replace(
        EPP_STACK, body_mode=BodyMode.FULL_DUPLEX_STREAMED, envoy_bootstrap_hook=trailers_sent_and_no_retries
    ),
}


@pytest.fixture(params=["generated-default", *VARIANTS])
def trailers_stack(request: pytest.FixtureRequest) -> Iterator[LocalStack]:
    if request.param in VARIANTS:
        yield from _started(VARIANTS[request.param])
        return
    assert EnvoyOptions().body_mode is BodyMode.BUFFERED, "the generated default is no longer BUFFERED"
    stack: LocalStack = request.getfixturevalue("buffered_stack")
    yield stack


def test_a_request_ending_with_trailers_reaches_the_pod_whole(trailers_stack: LocalStack) -> None:
    for pieces in (1, 3):
        body = json.dumps({"model": ADAPTERS[0], "prompt": "Say hello. " * 400, "max_tokens": 4}).encode()
        reply = post_with_trailers(trailers_stack, body, pieces=pieces)
        assert reply.status == 200, reply.body[:300]
        assert reply.pod
        assert json.loads(reply.body)["usage"]["completion_tokens"] == 4


FDX_WITH_RETRIES = dataclasses.replace(
    EPP_STACK, body_mode=BodyMode.FULL_DUPLEX_STREAMED, envoy_bootstrap_hook=trailers_sent
)


@pytest.mark.xfail(strict=True, reason="Envoy 1.40 replays its retry buffer when FDX trailers are let go")
@pytest.mark.parametrize("own_stack", [FDX_WITH_RETRIES], indirect=True, ids=["fdx-with-retries"])
def test_fdx_trailers_with_route_retries(own_stack: LocalStack) -> None:
    body = json.dumps({"model": ADAPTERS[0], "prompt": "Say hello.", "max_tokens": 4}).encode()
    reply = post_with_trailers(own_stack, body, pieces=1)
    assert reply.status == 200, reply.body[:300]
