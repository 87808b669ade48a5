"""CPU per response chunk of the EPP's own Python, when a gateway sends response bodies through it.

Run:  .venv/bin/python benchmarks/response_chunk.py [--chunks 50000]

Routes one FULL_DUPLEX_STREAMED request whose response is an SSE stream (as kgateway, Istio and
Envoy AI Gateway send it), then hands the stream handler `--chunks` vLLM-shaped token chunks,
each parsed from bytes as grpc hands it over, and serializes every reply. Prints the process CPU
time per chunk. It uses only the stream handler's public constructor and `handle`, so it runs
unchanged in an earlier checkout (`cd DIR && PYTHONPATH=DIR python benchmarks/response_chunk.py`)
for a before/after figure. grpc.aio's own cost per message, several times larger, is not in it:
`benchmarks/soak.py` measures the whole process.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence

from epp._proto.envoy.config.core.v3 import base_pb2
from epp._proto.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from epp._proto.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.clock import SystemClock
from epp.picker.datastore.store import Datastore
from epp.picker.datastore.types import PodInfo, Pool
from epp.picker.director import Director
from epp.picker.extproc.stream import StreamHandler, StreamOptions
from epp.picker.scheduling.build import build_scheduler

FDX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
CHUNK = (
    b'data: {"id":"cmpl-5f0c","object":"text_completion","created":1796380000,"model":"adapter-1",'
    b'"choices":[{"index":0,"text":" hello","logprobs":null,"finish_reason":null,'
    b'"stop_reason":null}]}\n\n'
)


def headers(values: dict[str, str]) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]
    )


def routed_handler() -> StreamHandler:
    clock = SystemClock()
    datastore = Datastore(clock)
    datastore.set_pool(Pool(name="pool", namespace="default", selector={"app": "vllm"}, target_ports=(8000,)))
    datastore.replace_pods(
        PodInfo(name=f"sim-{i}", namespace="default", ip=f"127.0.1.{i + 1}", labels={"app": "vllm"})
        for i in range(4)
    )
    scheduler = build_scheduler(None, policy="default", staleness_threshold_s=2.0, seed=1)
    handler = StreamHandler(
        StreamOptions(Director(datastore, scheduler, clock=clock, rng=random.Random(1)), clock)
    )
    first = pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=headers({":method": "POST"})))
    first.protocol_config.request_body_mode = FDX
    first.protocol_config.response_body_mode = FDX
    body = json.dumps({"model": "adapter-1", "prompt": "hi", "stream": True}).encode()
    for message in (
        first,
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)),
        pb.ProcessingRequest(
            response_headers=pb.HttpHeaders(
                headers=headers({":status": "200", "content-type": "text/event-stream; charset=utf-8"})
            )
        ),
    ):
        handler.handle(message)
    return handler


def run(chunks: int) -> float:
    """CPU seconds per chunk: parse the message, handle it, serialize the reply."""
    handler = routed_handler()
    wire = pb.ProcessingRequest(response_body=pb.HttpBody(body=CHUNK)).SerializeToString()
    started = time.process_time()
    for _ in range(chunks):
        replies = handler.handle(pb.ProcessingRequest.FromString(wire))
        assert isinstance(replies, list), "a routed request's response chunks never wait"
        for reply in replies:
            reply.SerializeToString()
    return (time.process_time() - started) / chunks


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--chunks", type=int, default=50_000)
    args = parser.parse_args(argv)
    if not 0 < args.chunks <= 10_000_000:
        parser.error("--chunks must be in (0, 10000000]")
    print(json.dumps({"chunks": args.chunks, "cpu_us_per_chunk": round(1e6 * run(args.chunks), 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
