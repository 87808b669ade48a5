"""CPU per request of the EPP's own Python on the hot path, without gRPC, Envoy or sims.

Run:  .venv/bin/python benchmarks/hot_path.py [--requests 3000]

Builds what `epp serve` builds (default scheduler and admission, metrics, decision log, tracing
off, logging at --v 1) over four endpoints with fresh metrics, then feeds `ExternalProcessor.Process`
the messages Envoy sends for one FULL_DUPLEX_STREAMED request with response processing (request
headers, body, response headers, body; parsed from bytes as grpc hands them over) and serializes
every reply. Prints the process CPU time per request. Together with `benchmarks/soak.py` (whole
EPP process under real Envoy) this separates the EPP's own code from grpc.aio and scraping.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from prometheus_client import CollectorRegistry

from epp.admission import build_admission
from epp.clock import SystemClock
from epp.datastore.store import Datastore
from epp.datastore.types import Metrics, PodInfo, Pool
from epp.director import Director
from epp.extproc.server import ExternalProcessor
from epp.extproc.stream import StreamOptions
from epp.observability import tracing
from epp.observability.decisions import DecisionLog
from epp.observability.logging import configure_logging
from epp.observability.metrics import EppMetrics
from epp.observability.observer import Observer
from epp.scheduling.build import build_scheduler

ADAPTERS = tuple(f"adapter-{i}" for i in range(4))
WARM_UP = 200
FDX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED


def header_map(headers: dict[str, str]) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
    )


def stream_messages(index: int) -> list[pb.ProcessingRequest]:
    model = ADAPTERS[index % len(ADAPTERS)] if index % 5 else "base"
    body = json.dumps({"model": model, "prompt": f"request {index}: say hello", "max_tokens": 1}).encode()
    request_headers = {
        ":authority": "127.0.0.1:8081", ":path": "/v1/completions", ":method": "POST", ":scheme": "http",
        "content-type": "application/json", "content-length": str(len(body)),
        "user-agent": "Python/3.11 aiohttp", "x-forwarded-proto": "http", "x-request-id": str(uuid.uuid4()),
    }  # fmt: skip
    first = pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=header_map(request_headers)))
    first.protocol_config.request_body_mode = FDX
    first.protocol_config.response_body_mode = FDX
    response = {
        "id": "cmpl-1", "object": "text_completion", "model": model,
        "choices": [{"index": 0, "text": "hi", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }  # fmt: skip
    response_headers = {":status": "200", "content-type": "application/json", "x-inference-pod": "sim-0"}
    sent = [
        first,
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)),
        pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=header_map(response_headers))),
        pb.ProcessingRequest(
            response_body=pb.HttpBody(body=json.dumps(response).encode(), end_of_stream=True)
        ),
    ]
    return [pb.ProcessingRequest.FromString(m.SerializeToString()) for m in sent]


def build_processor(datastore: Datastore, clock: SystemClock) -> ExternalProcessor:
    scheduler = build_scheduler(None, policy="default", staleness_threshold_s=2.0, seed=1)
    admission = build_admission(None, staleness_threshold_s=2.0)
    observer = Observer(
        EppMetrics(CollectorRegistry()), DecisionLog(), clock, tracer=tracing.decision_tracer(None)
    )
    director = Director(
        datastore,
        observer.observe_scheduler(scheduler),
        admit=observer.observe_admit(admission.admit),
        clock=clock,
        rng=random.Random(1),
    )
    options = StreamOptions(
        director, on_finished=observer.on_finished, upstream_headers=observer.trace_headers, clock=clock
    )
    return ExternalProcessor(options)


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


async def _messages(messages: Sequence[pb.ProcessingRequest]) -> AsyncIterator[pb.ProcessingRequest]:
    for message in messages:
        yield message


async def run(requests: int) -> float:
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
    processor = build_processor(datastore, clock)
    streams = [stream_messages(i) for i in range(WARM_UP + requests)]
    context = _Context()

    async def one(messages: Sequence[pb.ProcessingRequest]) -> None:
        async for reply in processor.Process(_messages(messages), context):
            reply.SerializeToString()

    for messages in streams[:WARM_UP]:
        await one(messages)
    refresh_metrics(datastore, clock)
    started = time.process_time()
    for messages in streams[WARM_UP:]:
        await one(messages)
    return (time.process_time() - started) / requests


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args(argv)
    if not 0 < args.requests <= 1_000_000:
        parser.error("--requests must be in (0, 1000000]")
    cpu_s = asyncio.run(run(args.requests))
    print(json.dumps({"requests": args.requests, "cpu_us_per_request": round(1e6 * cpu_s, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
