"""`epp serve` end to end on loopback: the real grpc.aio ext_proc and health servers, real clients.

In-process runs use `epp.serve.app.serve` with a pool file; subprocess runs check signals and
start-up errors as a user sees them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import pathlib
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp import tls
from epp._proto.envoy.config.core.v3 import base_pb2
from epp._proto.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from epp._proto.envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from epp._proto.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp._proto.envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from epp.clock import SystemClock
from epp.picker.datastore.types import EndpointState, Snapshot
from epp.picker.director import Director
from epp.picker.extproc.server import ExternalProcessor, build_ext_proc_server
from epp.picker.extproc.stream import StreamOptions
from epp.picker.observability.health import Health, build_health_server
from epp.picker.scheduling.types import LLMRequest, SchedulingResult
from epp.serve.app import BoundPorts, serve
from epp.serve.settings import (
    DrainSettings,
    ListenSettings,
    PoolSettings,
    SchedulingSettings,
    ScrapeSettings,
    ServeSettings,
)
from tests.support.fake_scheduler import FakeScheduler, pool_datastore

pytestmark = pytest.mark.integration

POD_IPS = ("127.0.0.2", "127.0.0.3")
# A real vLLM 0.32.0 /metrics capture: the fake pods answer scrapes with it, so admission sees fresh metrics.
METRICS_FIXTURE = pathlib.Path(__file__).parent.parent / "fixtures" / "vllm-0.32.0" / "idle.txt"
POOL_YAML = """\
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata:
  name: pool
spec:
  selector:
    matchLabels:
      app: vllm
  targetPorts:
  - number: {port}
  endpointPickerRef:
    name: epp
    port:
      number: 9002
"""
POD_YAML = (
    "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels:\n    app: vllm\nstatus:\n  podIP: {ip}\n"
)
BODY = b'{"model":"base","prompt":"hello"}'


class FakePods:
    """Model-server `/metrics` on each pod IP at one shared port, as pods share a port in Kubernetes."""

    def __init__(self) -> None:
        self.port = 0
        self.scrapes: dict[str, int] = dict.fromkeys(POD_IPS, 0)
        self._runners: list[web.AppRunner] = []

    async def start(self) -> None:
        text = METRICS_FIXTURE.read_text()
        for _attempt in range(20):
            self.port = free_port(POD_IPS[0])
            try:
                for ip in POD_IPS:
                    await self._serve(ip, text)
                return
            except OSError:
                await self.stop()
        raise RuntimeError("no shared free port for the fake pods")

    async def _serve(self, ip: str, text: str) -> None:
        async def metrics(request: web.Request) -> web.Response:
            self.scrapes[ip] += 1
            return web.Response(text=text, content_type="text/plain")

        app = web.Application()
        app.add_routes([web.get("/metrics", metrics)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        self._runners.append(runner)
        await web.TCPSite(runner, ip, self.port).start()

    async def wait_scraped(self) -> None:
        for _ in range(200):
            if all(count > 0 for count in self.scrapes.values()):
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"pods were not scraped: {self.scrapes}")

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()


@pytest.fixture
async def pods() -> AsyncIterator[FakePods]:
    fake = FakePods()
    await fake.start()
    yield fake
    await fake.stop()


def write_pool(tmp_path: pathlib.Path, port: int = 8000) -> pathlib.Path:
    docs = [POOL_YAML.format(port=port)] + [
        POD_YAML.format(name=f"vllm-{i}", ip=ip) for i, ip in enumerate(POD_IPS)
    ]
    path = tmp_path / "pool.yaml"
    path.write_text("---\n".join(docs))
    return path


def settings(pool_file: pathlib.Path, **concerns: dict[str, object]) -> ServeSettings:
    """A local plaintext EPP on ephemeral ports; `concerns` changes fields by concern, e.g.
    `listen={"secure_serving": True}`."""
    base = ServeSettings(
        pool=PoolSettings(name="pool", namespace="default", file=pool_file),
        listen=ListenSettings(
            host="127.0.0.1", grpc_port=0, grpc_health_port=0, metrics_port=0, secure_serving=False
        ),
        scheduling=SchedulingSettings(policy="round-robin"),
        scrape=ScrapeSettings(refresh_metrics_interval_s=0.1),
        drain=DrainSettings(grace_period_s=1.0, drain_period_s=0.0),  # tests of draining set their own
    )
    changed = {name: dataclasses.replace(getattr(base, name), **fields) for name, fields in concerns.items()}
    return dataclasses.replace(base, **changed)


class Running:
    def __init__(self, task: asyncio.Task[None], stop: asyncio.Event, ports: BoundPorts) -> None:
        self.task = task
        self.stop = stop
        self.ports = ports


async def start(s: ServeSettings) -> Running:
    stop = asyncio.Event()
    started: asyncio.Future[BoundPorts] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve(s, stop=stop, on_started=started.set_result))
    waiting: set[asyncio.Future[Any]] = {task, started}
    done, _ = await asyncio.wait(waiting, timeout=20, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        task.result()  # raises the start-up error
    assert started in done, "server did not start"
    return Running(task, stop, started.result())


async def finish(running: Running) -> None:
    running.stop.set()
    await asyncio.wait_for(running.task, 20)


def body_message(data: bytes, end_of_stream: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=end_of_stream))


def headers_message(
    mode: int = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED,
) -> pb.ProcessingRequest:
    message = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=":method", raw_value=b"POST"),
                    base_pb2.HeaderValue(key="x-request-id", raw_value=b"it-1"),
                ]
            )
        )
    )
    message.protocol_config.request_body_mode = mode
    message.protocol_config.response_body_mode = mode
    return message


async def exchange(
    channel: grpc.aio.Channel, requests: Iterable[pb.ProcessingRequest]
) -> list[pb.ProcessingResponse]:
    stub = pb_grpc.ExternalProcessorStub(channel)

    async def gen() -> AsyncIterator[pb.ProcessingRequest]:
        for request in requests:
            yield request

    call = stub.Process(gen())
    # A stream this client ends first closes with an empty reply (the EPP's last reply travels
    # with its status): not an answer to anything.
    replies = [reply async for reply in call if reply.WhichOneof("response") is not None]
    return replies


async def wait_serving(port: int, service: str) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        status = health_pb2.HealthCheckResponse.UNKNOWN
        for _ in range(100):
            status = (await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)).status
            if status == health_pb2.HealthCheckResponse.SERVING:
                break
            await asyncio.sleep(0.05)
        return int(status)


def destination(reply: pb.ProcessingResponse) -> str:
    options = reply.request_headers.response.header_mutation.set_headers
    return next(
        str(o.header.raw_value.decode()) for o in options if o.header.key == "x-gateway-destination-endpoint"
    )


async def test_insecure_fdx_stream_routes_and_health_serves(tmp_path: pathlib.Path, pods: FakePods) -> None:
    running = await start(settings(write_pool(tmp_path, pods.port)))
    try:
        await pods.wait_scraped()
        for service in (
            "liveness",
            "readiness",
            "",
            "inference-extension",
            "envoy.service.ext_proc.v3.ExternalProcessor",
        ):
            assert await wait_serving(running.ports.health, service) == health_pb2.HealthCheckResponse.SERVING
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.ports.grpc}") as channel:
            replies = await exchange(
                channel,
                [
                    headers_message(),
                    body_message(BODY, False),
                    body_message(b"", True),
                ],
            )
            assert [r.WhichOneof("response") for r in replies] == ["request_headers", "request_body"]
            assert destination(replies[0]) in {f"{ip}:{pods.port}" for ip in POD_IPS}
            assert replies[1].request_body.response.body_mutation.streamed_response.body == BODY

            errors = await exchange(
                channel,
                [
                    headers_message(),
                    body_message(b"{oops", True),
                ],
            )
            assert len(errors) == 1
            assert errors[0].immediate_response.status.code == 400
            assert json.loads(errors[0].immediate_response.body)["error"]["type"] == "BadRequest"

            buffered = await exchange(
                channel,
                [
                    headers_message(processing_mode_pb2.ProcessingMode.BUFFERED),
                    body_message(BODY, True),
                ],
            )
            assert [r.WhichOneof("response") for r in buffered] == ["request_headers", "request_body"]
            assert buffered[1].request_body.response.body_mutation.body == BODY
            # The ext_proc port answers health too (Envoy cluster health checks).
            check = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="envoy.service.ext_proc.v3.ExternalProcessor"),
                timeout=5,
            )
            assert check.status == health_pb2.HealthCheckResponse.SERVING
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{running.ports.metrics}/healthz") as response:
                assert response.status == 200
            async with session.get(f"http://127.0.0.1:{running.ports.metrics}/metrics") as response:
                assert response.status == 200
                assert "python_info" in await response.text() or "process_" in await response.text()
    finally:
        await finish(running)


async def test_tls_with_cert_path(tmp_path: pathlib.Path, pods: FakePods) -> None:
    pair = tls.self_signed(common_name="epp")
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "tls.crt").write_bytes(pair.cert_pem)
    (certs / "tls.key").write_bytes(pair.key_pem)
    running = await start(
        settings(write_pool(tmp_path, pods.port), listen={"secure_serving": True, "cert_path": certs})
    )
    try:
        await pods.wait_scraped()
        credentials = grpc.ssl_channel_credentials(root_certificates=pair.cert_pem)
        async with grpc.aio.secure_channel(
            f"127.0.0.1:{running.ports.grpc}",
            credentials,
            options=(("grpc.ssl_target_name_override", "localhost"),),
        ) as channel:
            replies = await exchange(
                channel,
                [
                    headers_message(),
                    body_message(BODY, True),
                ],
            )
        assert destination(replies[0]) in {f"{ip}:{pods.port}" for ip in POD_IPS}
    finally:
        await finish(running)


async def test_self_signed_tls_handshake(tmp_path: pathlib.Path) -> None:
    running = await start(settings(write_pool(tmp_path), listen={"secure_serving": True}))
    try:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # data planes accept the EPP's self-signed certificate
        context.set_alpn_protocols(["h2"])
        _reader, writer = await asyncio.open_connection("127.0.0.1", running.ports.grpc, ssl=context)
        ssl_object = writer.get_extra_info("ssl_object")
        assert ssl_object.selected_alpn_protocol() == "h2"
        assert ssl_object.getpeercert(binary_form=True)
        writer.close()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await writer.wait_closed()  # the server's HTTP/2 preface may race our close_notify
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.ports.grpc}") as channel:
            with pytest.raises(grpc.aio.AioRpcError):
                await exchange(channel, [headers_message()])  # plaintext is refused
    finally:
        await finish(running)


async def test_health_goes_serving_when_the_pool_syncs() -> None:
    health = Health()
    await health.start()
    server, port = build_health_server(health, host="127.0.0.1", port=0)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)

            async def check(service: str) -> int:
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                return int(reply.status)

            assert await check("liveness") == health_pb2.HealthCheckResponse.SERVING
            assert await check("readiness") == health_pb2.HealthCheckResponse.NOT_SERVING
            assert await check("some-other") == health_pb2.HealthCheckResponse.NOT_SERVING
            await health.update(synced=True)
            assert await check("readiness") == health_pb2.HealthCheckResponse.SERVING
            assert (
                await check("envoy.service.ext_proc.v3.ExternalProcessor")
                == health_pb2.HealthCheckResponse.SERVING
            )
            await health.shutdown()
            assert await check("readiness") == health_pb2.HealthCheckResponse.NOT_SERVING
            assert await check("liveness") == health_pb2.HealthCheckResponse.NOT_SERVING
            assert not health.ready  # the metrics port's readiness agrees
            await health.update(synced=True)  # a sync while draining changes nothing
            assert await check("readiness") == health_pb2.HealthCheckResponse.NOT_SERVING
            assert not health.ready
    finally:
        await server.stop(0)


async def test_leader_election_gates_readiness() -> None:
    health = Health(leader_election=True)
    await health.start()
    server, port = build_health_server(health, host="127.0.0.1", port=0)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            await health.update(synced=True, leader=False)
            reply = await stub.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
            await health.update(synced=True, leader=True)
            reply = await stub.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Check(health_pb2.HealthCheckRequest(service="some-other"), timeout=5)
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await server.stop(0)


async def test_stop_drains_before_the_ext_proc_server_closes(tmp_path: pathlib.Path, pods: FakePods) -> None:
    """What SIGTERM does: NOT_SERVING at once, access-log streams ended, routing on through the
    drain period (the gateway's health check needs that long to move new streams), then exit."""
    running = await start(settings(write_pool(tmp_path, pods.port), drain={"drain_period_s": 3.0}))
    try:
        await pods.wait_scraped()
        assert await wait_serving(running.ports.health, "readiness") == health_pb2.HealthCheckResponse.SERVING
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.ports.grpc}") as channel:
            running.stop.set()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.ports.health}") as health_channel:
                stub = health_pb2_grpc.HealthStub(health_channel)
                for _ in range(100):
                    reply = await stub.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=5)
                    if reply.status == health_pb2.HealthCheckResponse.NOT_SERVING:
                        break
                    await asyncio.sleep(0.02)
                assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
            # Still routing while the gateway notices.
            replies = await exchange(channel, [headers_message(), body_message(BODY, True)])
            assert destination(replies[0]) in {f"{ip}:{pods.port}" for ip in POD_IPS}
            # An access-log stream ends at its first message, so Envoy reopens it to a replica that stays.
            access_log = als_pb2_grpc.AccessLogServiceStub(channel).StreamAccessLogs()
            await access_log.write(als_pb2.StreamAccessLogsMessage())
            assert await asyncio.wait_for(access_log, 5) == als_pb2.StreamAccessLogsResponse()
            assert not running.task.done()
        await asyncio.wait_for(running.task, 20)
    finally:
        if not running.task.done():
            await finish(running)


# -- the real command -----------------------------------------------------------------------------


def epp_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "epp", "serve", "--host", "127.0.0.1", "--log-format", "json", *args]


def run_epp(*args: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(epp_command(*args), capture_output=True, text=True, timeout=timeout_s, check=False)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def test_sigterm_stops_cleanly(tmp_path: pathlib.Path) -> None:
    pool = write_pool(tmp_path)
    process = subprocess.Popen(
        epp_command(
            "--pool-file",
            str(pool),
            "--secure-serving=false",
            "--policy",
            "round-robin",
            "--grpc-port",
            "0",
            "--grpc-health-port",
            "0",
            "--metrics-port",
            "0",
            "--drain-period",
            "0s",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        for _ in range(200):
            line = process.stderr.readline()
            if not line:
                break
            if json.loads(line).get("msg") == "epp serving":
                break
        else:
            pytest.fail("no start-up line")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        rest = process.stderr.read()
        assert "Traceback" not in rest
        assert "epp stopped" in rest
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--pool-name", "p", "--refresh-metrics-interval", "soon"], 2, "invalid duration"),
        (["--pool-file", "/nonexistent/pool.yaml", "--secure-serving=false"], 2, "/nonexistent/pool.yaml"),
        (["--pool-name", "p", "--policy", "random", "--config-text", "x"], 2, "--policy cannot be combined"),
    ],
    ids=["bad-duration", "missing-pool-file", "policy-and-config"],
)
def test_start_up_errors_are_one_line(args: list[str], code: int, message: str) -> None:
    result = run_epp(*args)
    assert result.returncode == code
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_port_in_use_exits_1(tmp_path: pathlib.Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run_epp(
            "--pool-file",
            str(write_pool(tmp_path)),
            "--secure-serving=false",
            "--policy",
            "round-robin",
            "--grpc-port",
            str(port),
            "--grpc-health-port",
            str(free_port()),
            "--metrics-port",
            "0",
        )
    assert result.returncode == 1, result.stderr
    assert "cannot listen" in result.stderr
    assert "Traceback" not in result.stderr


# -- the ext_proc server alone, with a scheduler that misbehaves -----------------------------------


class ExplodingScheduler(FakeScheduler):
    def schedule(
        self, request: LLMRequest, candidates: Sequence[EndpointState], snapshot: Snapshot, now: float
    ) -> SchedulingResult:
        if request.incoming_model == "explode":
            raise RuntimeError("bug in a plugin")
        return super().schedule(request, candidates, snapshot, now)


async def test_unexpected_error_is_500_and_a_stalled_peer_blocks_no_one() -> None:
    director = Director(pool_datastore(), ExplodingScheduler(), clock=SystemClock())
    processor = ExternalProcessor(StreamOptions(director, SystemClock()))
    server, port = build_ext_proc_server(processor, host="127.0.0.1", port=0, credentials=None)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)
            stalled = stub.Process()
            await stalled.write(headers_message())  # and never the body
            boom = await exchange(
                channel,
                [
                    headers_message(),
                    pb.ProcessingRequest(
                        request_body=pb.HttpBody(body=b'{"model":"explode"}', end_of_stream=True)
                    ),
                ],
            )
            assert len(boom) == 1 and boom[0].immediate_response.status.code == 500
            fine = await exchange(
                channel,
                [
                    headers_message(),
                    body_message(BODY, True),
                ],
            )
            assert destination(fine[0]) == "10.0.0.1:8000"
            stalled.cancel()
    finally:
        await server.stop(0)
