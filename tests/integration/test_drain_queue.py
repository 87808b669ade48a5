"""SIGTERM leaves no queued request unanswered and refuses none it could serve: each gets its pod.

On SIGTERM `epp serve` turns NOT_SERVING, keeps routing (and dispatching from its queues as
capacity frees) for the drain period, then sends what is still queued to its best pod whatever
the pod's load (the pod queues it), and lets open streams finish before the ext_proc listener
closes.

- Through real Envoy, pods with one LoRA slot each and more adapters than slots: of a burst
  queued behind the slots when SIGTERM comes, every client gets its whole response; none gets
  a refusal or the gateway's "endpoint picker unavailable" (a stream the EPP dropped).
- Straight on the ext_proc port, with a pod whose load the test sets: a request queued when
  SIGTERM comes goes to its pod as soon as capacity frees during the drain period; one still
  queued at its end goes to the pod then, busy as it is; and a stream open then whose request
  arrives only afterwards (a slow client's body) goes to the pod at once, not into a queue
  nothing dispatches from any more until the listener's grace runs out and cuts it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import pathlib
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web

from epp._proto.envoy.config.core.v3 import base_pb2
from epp._proto.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from epp._proto.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp._proto.envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from epp.picker.extproc.stream import BodyMode
from epp.picker.wire import DESTINATION_ENDPOINT_HEADER
from epp.serve.app import BoundPorts, serve
from epp.serve.settings import (
    DrainSettings,
    ListenSettings,
    PoolSettings,
    SchedulingSettings,
    ScrapeSettings,
    ServeSettings,
)
from epp.tools.loadgen import Answer, Request, send_one
from epp.tools.localstack import LocalStack, SimOptions, StackOptions
from testkit.waiting import wait_until
from tests.integration.conftest import _started, models_yaml

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# -- through Envoy ---------------------------------------------------------------------------------

ADAPTERS = tuple(f"adapter-{i}" for i in range(6))
MAX_TOKENS = 30  # ≈ 0.6 s per request at best (20 ms a token), holding its pod's only slot meanwhile
SIM = SimOptions(
    adapters=ADAPTERS,
    max_loras=1,
    max_num_seqs=16,
    inter_token_latency_s=0.02,
    lora_load_latency_s=0.05,
    extra_args=("--max-model-len", "200000", "--kv-cache-tokens", "400000"),
)
BURST = 24  # four requests per adapter at once: two slots take two adapters, the rest queue
SLOTS = 2


def epp_get(stack: LocalStack, path: str) -> Any:
    async def get() -> Any:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{stack.epp_metrics_port}{path}") as response,
        ):
            return json.loads(await response.text())

    return asyncio.run(get())


@pytest.fixture(params=[BodyMode.FULL_DUPLEX_STREAMED, BodyMode.BUFFERED], ids=["fdx", "buffered"])
def stack(request: pytest.FixtureRequest) -> Iterator[LocalStack]:
    options = StackOptions(
        pods=SLOTS,
        sim=SIM,
        body_mode=request.param,
        drain_period="300ms",  # shorter than one request: the queue still holds most of the burst
        extra_pool_yaml=models_yaml(("base", *ADAPTERS)),
    )
    for started in _started(options):
        yield warmed(started)


def warmed(stack: LocalStack) -> LocalStack:
    """`stack` once every pod has reported its LoRA slots (vLLM publishes `max_lora` only after a
    LoRA request), so the EPP queues what the slots cannot take."""

    def ready() -> bool:
        for adapter in ADAPTERS:
            assert complete(stack, adapter, 1).status == 200
        endpoints = epp_get(stack, "/debug/flow-control")["endpoints"]
        return len(endpoints) == SLOTS and all(e["slots"] == SIM.max_loras for e in endpoints)

    wait_until(ready, "every pod to report its LoRA slots", interval_s=0.2)
    return stack


def complete(stack: LocalStack, model: str, max_tokens: int, *, stream: bool = False) -> Answer:
    return send_one(stack.gateway_url, Request.completion(model, max_tokens, stream=stream), timeout_s=60.0)


def test_sigterm_sends_every_queued_client_to_its_pod(stack: LocalStack) -> None:
    waiting = BURST - SLOTS * BURST // len(ADAPTERS)  # all but the two adapters with a slot
    with concurrent.futures.ThreadPoolExecutor(max_workers=BURST) as pool:
        futures = [
            pool.submit(complete, stack, ADAPTERS[i % len(ADAPTERS)], MAX_TOKENS, stream=i % 2 == 0)
            for i in range(BURST)
        ]
        wait_until(
            lambda: epp_get(stack, "/debug/flow-control")["queued"] >= waiting,
            "the burst to wait in the EPP's queue behind the slots",
            interval_s=0.02,
        )
        slot = stack.epp_slot
        assert slot is not None and slot.process is not None
        slot.process.process.send_signal(signal.SIGTERM)
        answers = [future.result(timeout=60) for future in futures]
    assert slot.process.process.wait(timeout=30) == 0
    assert [(a.status, a.whole, a.body) for a in answers] == [(200, True, b"")] * BURST


# -- on the ext_proc port --------------------------------------------------------------------------

POD_IP = "127.0.0.2"
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
---
apiVersion: v1
kind: Pod
metadata:
  name: vllm-0
  labels:
    app: vllm
status:
  podIP: {ip}
"""
# Upstream's gate: dispatch only while the pool is not saturated (no pod with at most 5 waiting).
SATURATION_GATE = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: saturation-detector
saturationDetector: {pluginRef: saturation-detector}
"""
BODY = b'{"model":"base","prompt":"hello"}'
BUSY = 100  # requests waiting on the pod: the pool is saturated, the gate closed
PAGE = (  # the samples the EPP reads of a vLLM page, split where the waiting count goes
    'vllm:num_requests_waiting{model_name="base"} ',
    '\nvllm:num_requests_running{model_name="base"} 0\nvllm:kv_cache_usage_perc{model_name="base"} 0.1\n',
)
GRACE_S = 30.0  # far longer than a test waits: a request left in a queue would be cut only then


class FakePod:
    """A model server's `/metrics`, with as many requests waiting as the test says."""

    def __init__(self) -> None:
        self.waiting = BUSY
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        async def metrics(_: web.Request) -> web.Response:
            return web.Response(text=f"{self.waiting}".join(PAGE))

        app = web.Application()
        app.add_routes([web.get("/metrics", metrics)])
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        with socket.socket() as sock:
            sock.bind((POD_IP, 0))
            self.port = sock.getsockname()[1]
        await web.TCPSite(self._runner, POD_IP, self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def pod() -> AsyncIterator[FakePod]:
    fake = FakePod()
    await fake.start()
    yield fake
    await fake.stop()


class Epp:
    """`epp serve` in this process, on ephemeral ports, stopped the way SIGTERM stops it."""

    def __init__(self, tmp_path: pathlib.Path, pod: FakePod, *, drain_period_s: float) -> None:
        self.drain_period_s = drain_period_s
        pool = tmp_path / "pool.yaml"
        pool.write_text(POOL_YAML.format(port=pod.port, ip=POD_IP))
        self.settings = ServeSettings(
            pool=PoolSettings(name="pool", namespace="default", file=pool),
            listen=ListenSettings(
                host="127.0.0.1", grpc_port=0, grpc_health_port=0, metrics_port=0, secure_serving=False
            ),
            scheduling=SchedulingSettings(picker_config_text=SATURATION_GATE),
            scrape=ScrapeSettings(refresh_metrics_interval_s=0.05),
            drain=DrainSettings(drain_period_s=drain_period_s, grace_period_s=GRACE_S),
        )
        self.stop = asyncio.Event()

    async def __aenter__(self) -> BoundPorts:
        started: asyncio.Future[BoundPorts] = asyncio.get_running_loop().create_future()
        self.task = asyncio.create_task(serve(self.settings, stop=self.stop, on_started=started.set_result))
        return await asyncio.wait_for(asyncio.shield(started), 20)

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        # Nothing left open: the EPP exits after its drain period, without waiting out its grace.
        await asyncio.wait_for(self.task, self.drain_period_s + GRACE_S / 3)


def headers_message(request_id: str) -> pb.ProcessingRequest:
    message = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=":method", raw_value=b"POST"),
                    base_pb2.HeaderValue(key="x-request-id", raw_value=request_id.encode()),
                ]
            )
        )
    )
    message.protocol_config.request_body_mode = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
    message.protocol_config.response_body_mode = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
    return message


def body_message() -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=BODY, end_of_stream=True))


class Stream:
    """One ext_proc stream whose messages the test sends one at a time."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._outbox: asyncio.Queue[pb.ProcessingRequest | None] = asyncio.Queue()
        self._call = pb_grpc.ExternalProcessorStub(channel).Process(self._messages())

    async def _messages(self) -> AsyncIterator[pb.ProcessingRequest]:
        while (message := await self._outbox.get()) is not None:
            yield message

    def send(self, message: pb.ProcessingRequest) -> None:
        self._outbox.put_nowait(message)

    async def reply(self) -> pb.ProcessingResponse:
        """The next reply that answers something, within 10 s (the drain period or less)."""
        async with asyncio.timeout(10):
            while True:
                reply = await self._call.read()
                assert reply is not grpc.aio.EOF, "the stream ended without an answer"
                if reply.WhichOneof("response") is not None:
                    return reply

    def close(self) -> None:
        self._outbox.put_nowait(None)
        self._call.cancel()


async def until_queued(metrics_port: int, count: int) -> None:
    """Return once `count` requests wait in the EPP's queues (asked over its debug page)."""
    async with asyncio.timeout(15), aiohttp.ClientSession() as session:
        while True:
            async with session.get(f"http://127.0.0.1:{metrics_port}/debug/flow-control") as response:
                if json.loads(await response.text())["queued"] >= count:
                    return
            await asyncio.sleep(0.02)


def destination(reply: pb.ProcessingResponse) -> str:
    """The endpoint a routing reply names (an immediate response names none)."""
    assert reply.WhichOneof("response") == "request_headers", reply
    for option in reply.request_headers.response.header_mutation.set_headers:
        if option.header.key == DESTINATION_ENDPOINT_HEADER:
            return str(option.header.raw_value.decode())
    raise AssertionError(f"no {DESTINATION_ENDPOINT_HEADER} in {reply}")


async def test_a_queued_request_goes_to_its_pod_when_capacity_frees_during_the_drain(
    tmp_path: pathlib.Path, pod: FakePod
) -> None:
    epp = Epp(tmp_path, pod, drain_period_s=3.0)
    async with epp as ports, grpc.aio.insecure_channel(f"127.0.0.1:{ports.grpc}") as channel:
        stream = Stream(channel)
        try:
            stream.send(headers_message("queued"))
            stream.send(body_message())
            await until_queued(ports.metrics, 1)
            epp.stop.set()  # what SIGTERM does
            pod.waiting = 0  # the pod catches up while the EPP drains: its next scrape opens the gate
            routed = await stream.reply()
            assert routed.WhichOneof("response") == "request_headers", routed
            assert not epp.task.done(), "answered within the drain period"
        finally:
            stream.close()


async def test_what_still_waits_when_the_drain_ends_goes_to_its_pod_busy_as_it_is(
    tmp_path: pathlib.Path, pod: FakePod
) -> None:
    epp = Epp(tmp_path, pod, drain_period_s=0.2)
    async with epp as ports, grpc.aio.insecure_channel(f"127.0.0.1:{ports.grpc}") as channel:
        early, late = Stream(channel), Stream(channel)
        try:
            early.send(headers_message("early"))
            early.send(body_message())
            late.send(headers_message("late"))  # its body comes once the drain period is over
            await until_queued(ports.metrics, 1)
            epp.stop.set()  # what SIGTERM does; the pod stays saturated throughout
            assert destination(await early.reply()) == f"{POD_IP}:{pod.port}"
            late.send(body_message())
            assert destination(await late.reply()) == f"{POD_IP}:{pod.port}"
        finally:
            early.close()
            late.close()
