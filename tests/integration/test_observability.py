"""`epp serve` observability end to end: metrics behind a bearer token, `/debug/decisions`,
and a decision span exported over OTLP to a real gRPC receiver, joined to the caller's trace.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from concurrent import futures

import aiohttp
import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from epp._proto.envoy.config.core.v3 import base_pb2
from epp._proto.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from epp._proto.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from tests.integration.test_serve_grpc import (
    BODY,
    POD_IPS,
    FakePods,
    body_message,
    exchange,
    finish,
    settings,
    start,
    write_pool,
)

pytestmark = pytest.mark.integration

TOKEN = "metrics-token-0123456789abcdef"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace endpoint that keeps what it receives (a sync server: exporters block)."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self._lock = threading.Lock()

    def Export(  # the gRPC method name
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        with self._lock:
            self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[object]:
        with self._lock:
            return [
                span
                for request in self.requests
                for resource in request.resource_spans
                for scope in resource.scope_spans
                for span in scope.spans
            ]


def traced_headers() -> pb.ProcessingRequest:
    message = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=":method", raw_value=b"POST"),
                    base_pb2.HeaderValue(key="x-request-id", raw_value=b"obs-1"),
                    base_pb2.HeaderValue(key="traceparent", raw_value=TRACEPARENT.encode()),
                ]
            )
        )
    )
    message.protocol_config.request_body_mode = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
    message.protocol_config.response_body_mode = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
    return message


async def test_metrics_decisions_and_traces(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    receiver = OtlpReceiver()
    otlp = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, otlp)  # type: ignore[no-untyped-call]
    otlp_port = otlp.add_insecure_port("127.0.0.1:0")
    otlp.start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{otlp_port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    pods = FakePods()
    await pods.start()
    caplog.set_level(logging.DEBUG)
    try:
        running = await start(
            settings(
                write_pool(tmp_path, pods.port),
                observability={"tracing": True, "metrics_auth_token_file": token_file},
            )
        )
        try:
            await pods.wait_scraped()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.ports.grpc}") as channel:
                replies = await exchange(channel, [traced_headers(), body_message(BODY, True)])
            options = replies[0].request_headers.response.header_mutation.set_headers
            upstream = {o.header.key: o.header.raw_value.decode() for o in options}
            assert upstream["traceparent"].split("-")[1] == TRACE_ID
            assert upstream["traceparent"] != TRACEPARENT  # names the decision span as parent

            base = f"http://127.0.0.1:{running.ports.metrics}"
            auth = {"Authorization": f"Bearer {TOKEN}"}
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{base}/metrics") as response:
                    assert response.status == 401
                async with session.get(f"{base}/debug/decisions") as response:
                    assert response.status == 401
                async with session.get(f"{base}/healthz") as response:
                    assert response.status == 200
                async with session.get(f"{base}/metrics", headers=auth) as response:
                    assert response.status == 200
                    text = await response.text()
                async with session.get(f"{base}/debug/decisions", headers=auth) as response:
                    decisions = (await response.json())["decisions"]
            labels = 'model_name="base",target_model_name="base"'
            assert f"inference_objective_request_total{{{labels}}} 1.0" in text
            assert f"inference_model_request_total{{{labels}}} 1.0" in text
            assert 'inference_pool_ready_pods{name="pool"} 2.0' in text
            assert "inference_extension_scheduler_e2e_duration_seconds_count 1.0" in text
            assert "process_resident_memory_bytes" in text
            [decision] = decisions
            assert decision["request_id"] == "obs-1"
            assert decision["outcome"] == "routed"
            assert decision["chosen"][0] in {f"{ip}:{pods.port}" for ip in POD_IPS}
        finally:
            await finish(running)  # flushes the span exporter
        spans = receiver.spans()
        assert [s.name for s in spans] == ["epp.decision"]  # type: ignore[attr-defined]
        assert spans[0].trace_id.hex() == TRACE_ID  # type: ignore[attr-defined]
        assert TOKEN not in caplog.text
    finally:
        await pods.stop()
        otlp.stop(0)
        await asyncio.sleep(0)


def test_no_secret_reaches_the_log(tmp_path: pathlib.Path) -> None:
    """`epp serve` at the most verbose level, with a metrics token and TLS: neither the token nor
    the private key appears anywhere in its output."""
    from epp import tls
    from tests.integration.test_serve_grpc import epp_command, free_port

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    pair = tls.self_signed(common_name="epp")
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "tls.crt").write_bytes(pair.cert_pem)
    (certs / "tls.key").write_bytes(pair.key_pem)
    metrics_port = free_port()
    process = subprocess.Popen(
        epp_command(
            "--pool-file",
            str(write_pool(tmp_path)),
            "--cert-path",
            str(certs),
            "--v",
            "5",
            "--metrics-auth-token-file",
            str(token_file),
            "--policy",
            "round-robin",
            "--grpc-port",
            "0",
            "--grpc-health-port",
            "0",
            "--metrics-port",
            str(metrics_port),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{metrics_port}"
        statuses = []
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {TOKEN}"}):
            for _ in range(100):
                try:
                    with urllib.request.urlopen(
                        urllib.request.Request(f"{base}/metrics", headers=headers)
                    ) as r:
                        statuses.append(r.status)
                    break
                except urllib.error.HTTPError as err:
                    statuses.append(err.code)
                    break
                except urllib.error.URLError:
                    time.sleep(0.1)
        assert statuses == [401, 401, 200]
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=10)
    assert "epp stopped" in output
    assert TOKEN not in output
    key_body = b"".join(pair.key_pem.splitlines()[1:-1]).decode()
    assert key_body[:40] not in output.replace("\n", "")
