"""One span from lora-epp's tracing setup to a local OTLP/gRPC collector stub, and the Envoy stubs.

Run by `.ci/wheel_check.sh` in a venv that holds only the installed wheel and its dependencies: a
plain install must give a working OTLP exporter (no file of `opentelemetry-proto` overwritten by
another package) and the ext_proc and access-log stubs built from `proto/envoy/`.
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from epp._proto.envoy.service.accesslog.v3 import als_pb2_grpc
from epp._proto.envoy.service.ext_proc.v3 import external_processor_pb2, external_processor_pb2_grpc


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[str] = []
        self.lock = threading.Lock()

    def Export(self, request, context):  # type: ignore[no-untyped-def]  # the gRPC method name
        with self.lock:
            self.spans += [s.name for r in request.resource_spans for sc in r.scope_spans for s in sc.spans]
        return trace_service_pb2.ExportTraceServiceResponse()


def main() -> int:
    name = external_processor_pb2.ProcessingRequest.DESCRIPTOR.full_name
    assert name == "envoy.service.ext_proc.v3.ProcessingRequest", name
    assert external_processor_pb2_grpc.ExternalProcessorServicer and als_pb2_grpc.AccessLogServiceServicer
    collector = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
    os.environ["OTEL_EXPORTER_OTLP_INSECURE"] = "true"
    from epp.picker.observability import tracing

    provider = tracing.build_tracer_provider()
    provider.get_tracer("wheel-check").start_span("wheel-check-span").end()
    provider.shutdown()  # flushes the batch
    server.stop(0)
    print(f"OTLP collector stub received: {collector.spans}")
    return 0 if collector.spans == ["wheel-check-span"] else 1


if __name__ == "__main__":
    sys.exit(main())
