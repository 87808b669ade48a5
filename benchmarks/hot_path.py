"""CPU per request of the EPP's own Python on the hot path, without gRPC, Envoy or sims.

Run:  .venv/bin/python benchmarks/hot_path.py [--requests 3000] [--process-responses]

Builds what `epp serve` builds (its director for the default policy, flow control included;
metrics, decision log, the completions and access-log receiver, tracing off, logging at --v 1) over
four endpoints with fresh
metrics, then feeds `ExternalProcessor.Process` the messages Envoy sends for one FULL_DUPLEX_STREAMED
request as `epp envoy-config` configures it by default (request headers and body, no response;
parsed from bytes as grpc hands them over) and serializes every reply; each request's access-log
entry then reaches `AccessLogReceiver` in batches of ten, as Envoy flushes them. With
`--process-responses`, the response headers and a JSON body pass through the stream instead, as
they do when the gateway sends responses. Prints the process CPU time per request. Together with
`benchmarks/soak.py` (whole EPP process under real Envoy) this separates the EPP's own code from
grpc.aio and scraping.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import TypeVar

from prometheus_client import CollectorRegistry

from epp._proto.envoy.config.core.v3 import base_pb2
from epp._proto.envoy.data.accesslog.v3 import accesslog_pb2
from epp._proto.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from epp._proto.envoy.service.accesslog.v3 import als_pb2
from epp._proto.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.clock import SystemClock
from epp.picker.datastore.store import Datastore
from epp.picker.datastore.types import Metrics, PodInfo, Pool
from epp.picker.extproc.accesslog import AccessLogReceiver
from epp.picker.extproc.completions import Completions
from epp.picker.extproc.server import ExternalProcessor
from epp.picker.extproc.stream import StreamOptions
from epp.picker.logs import configure_logging
from epp.picker.observability import tracing
from epp.picker.observability.decisions import DecisionLog
from epp.picker.observability.metrics import EppMetrics
from epp.picker.observability.observer import Observer
from epp.serve.app import build_director
from epp.serve.settings import PoolSettings, SchedulingSettings, ServeSettings

ADAPTERS = tuple(f"adapter-{i}" for i in range(4))
WARM_UP = 200
FDX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
NONE = processing_mode_pb2.ProcessingMode.NONE
ACCESS_LOG_BATCH = 10
_T = TypeVar("_T")


def header_map(headers: dict[str, str]) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
    )


def stream_messages(index: int, process_responses: bool) -> list[pb.ProcessingRequest]:
    model = ADAPTERS[index % len(ADAPTERS)] if index % 5 else "base"
    body = json.dumps({"model": model, "prompt": f"request {index}: say hello", "max_tokens": 1}).encode()
    request_headers = {
        ":authority": "127.0.0.1:8081", ":path": "/v1/completions", ":method": "POST", ":scheme": "http",
        "content-type": "application/json", "content-length": str(len(body)),
        "user-agent": "Python/3.11 aiohttp", "x-forwarded-proto": "http", "x-request-id": str(uuid.uuid4()),
    }  # fmt: skip
    first = pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=header_map(request_headers)))
    first.protocol_config.request_body_mode = FDX
    first.protocol_config.response_body_mode = FDX if process_responses else NONE
    response = {
        "id": "cmpl-1", "object": "text_completion", "model": model,
        "choices": [{"index": 0, "text": "hi", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }  # fmt: skip
    response_headers = {":status": "200", "content-type": "application/json", "x-inference-pod": "sim-0"}
    sent = [first, pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))]
    if process_responses:
        sent += [
            pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=header_map(response_headers))),
            pb.ProcessingRequest(
                response_body=pb.HttpBody(body=json.dumps(response).encode(), end_of_stream=True)
            ),
        ]
    return [pb.ProcessingRequest.FromString(m.SerializeToString()) for m in sent]


def access_log_entry(key: str, index: int) -> accesslog_pb2.HTTPAccessLogEntry:
    """What Envoy logs for one routed request: its metadata (pick and key), timings, upstream, status."""
    entry = accesslog_pb2.HTTPAccessLogEntry()
    common = entry.common_properties
    lb = common.metadata.filter_metadata["envoy.lb"]
    lb.fields["x-gateway-destination-endpoint"].string_value = f"127.0.1.{index % 4 + 1}:8000"
    lb.fields["lora-epp-completion-key"].string_value = key
    common.downstream_remote_address.socket_address.address = "127.0.0.1"
    common.downstream_remote_address.socket_address.port_value = 40000 + index % 1000
    common.upstream_remote_address.socket_address.address = f"127.0.1.{index % 4 + 1}"
    common.upstream_remote_address.socket_address.port_value = 8000
    common.start_time.GetCurrentTime()
    common.time_to_first_upstream_rx_byte.FromMilliseconds(20)
    common.time_to_last_downstream_tx_byte.FromMilliseconds(300)
    common.upstream_cluster = "pool"
    entry.request.request_method = base_pb2.POST
    entry.request.path = "/v1/completions"
    entry.request.request_body_bytes = 80
    entry.response.response_code.value = 200
    entry.response.response_body_bytes = 400
    return entry


def completion_key(reply: pb.ProcessingResponse) -> str:
    fields = reply.dynamic_metadata.fields
    if "envoy.lb" not in fields:
        return ""
    return str(fields["envoy.lb"].struct_value.fields["lora-epp-completion-key"].string_value)


def build_processor(datastore: Datastore, clock: SystemClock, completions: Completions) -> ExternalProcessor:
    """The director `epp serve` builds for the default policy (flow control included)."""
    observer = Observer(
        EppMetrics(CollectorRegistry(), pool="pool"),
        DecisionLog(),
        clock,
        tracer=tracing.decision_tracer(None),
    )
    settings = ServeSettings(
        pool=PoolSettings(name="pool", namespace="default"), scheduling=SchedulingSettings(seed=1)
    )
    director, _, _ = build_director(settings, datastore, clock, observer)
    return ExternalProcessor(StreamOptions(director, clock, completions=completions))


def refresh_metrics(datastore: Datastore, clock: SystemClock) -> None:
    for index, endpoint in enumerate(datastore.endpoints()):
        running = frozenset(ADAPTERS[index % len(ADAPTERS) : index % len(ADAPTERS) + 2])
        metrics = Metrics(
            updated_at=clock.now(), lora_enabled=True, max_lora=2, running_adapters=running,
            served_model_name="base", kv_cache_usage=0.1,
        )  # fmt: skip
        datastore.update_metrics(endpoint.name, metrics)


class _Context:
    async def abort(self, code: object, details: str) -> None:
        raise RuntimeError(f"stream aborted: {details}")

    def peer(self) -> str:
        return "ipv4:127.0.0.1:40000"


async def _messages(messages: Sequence[_T]) -> AsyncIterator[_T]:
    for message in messages:
        yield message


async def run(requests: int, process_responses: bool) -> float:
    """CPU seconds per request, after a warm-up."""
    configure_logging(verbosity=1)
    clock = SystemClock()
    datastore = Datastore(clock)
    datastore.set_pool(Pool(name="pool", namespace="default", selector={"app": "vllm"}, target_ports=(8000,)))
    datastore.replace_pods(
        PodInfo(name=f"sim-{i}", namespace="default", ip=f"127.0.1.{i + 1}", labels={"app": "vllm"})
        for i in range(4)
    )
    refresh_metrics(datastore, clock)
    completions = Completions(clock)
    receiver = AccessLogReceiver(completions)
    processor = build_processor(datastore, clock, completions)
    streams = [stream_messages(i, process_responses) for i in range(WARM_UP + requests)]
    context = _Context()
    completions.log_stream_opened(context.peer())  # the gateway's access-log stream is open
    pending: list[accesslog_pb2.HTTPAccessLogEntry] = []

    async def flush() -> None:
        message = als_pb2.StreamAccessLogsMessage()
        message.http_logs.log_entry.extend(pending)
        pending.clear()
        batch = [als_pb2.StreamAccessLogsMessage.FromString(message.SerializeToString())]
        await receiver.StreamAccessLogs(_messages(batch), context)

    async def one(index: int, messages: Sequence[pb.ProcessingRequest]) -> None:
        key = ""
        async for reply in processor.Process(_messages(messages), context):
            reply.SerializeToString()
            key = key or completion_key(reply)
        if key and not process_responses:
            pending.append(access_log_entry(key, index))
            if len(pending) == ACCESS_LOG_BATCH:
                await flush()

    for index, messages in enumerate(streams[:WARM_UP]):
        await one(index, messages)
    refresh_metrics(datastore, clock)
    started = time.process_time()
    for index, messages in enumerate(streams[WARM_UP:]):
        await one(index, messages)
    if pending:
        await flush()
    spent = time.process_time() - started
    assert len(completions) == 0, "every request finished"
    return spent / requests


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument(
        "--process-responses", action="store_true", help="the response passes through the stream"
    )
    args = parser.parse_args(argv)
    if not 0 < args.requests <= 1_000_000:
        parser.error("--requests must be in (0, 1000000]")
    cpu_s = asyncio.run(run(args.requests, args.process_responses))
    print(
        json.dumps(
            {
                "requests": args.requests,
                "process_responses": args.process_responses,
                "cpu_us_per_request": round(1e6 * cpu_s, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
