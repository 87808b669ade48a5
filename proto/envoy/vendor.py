"""Write `proto/envoy/descriptors.binpb`: the Envoy protos the EPP speaks, as a FileDescriptorSet.

The EPP needs Envoy's ext_proc and gRPC access-log services and the messages they use (20 files of
envoyproxy/data-plane-api, cncf/xds and bufbuild/protoc-gen-validate, Apache-2.0). `setup.py`
compiles them from this set into `epp/_proto/` with grpcio-tools, so installing lora-epp needs
no Python package that ships them (the one on PyPI, xds-protos, also ships its own old copy of
`opentelemetry/proto` and breaks the OTLP exporter).

Run by hand, with xds-protos installed in some other environment, when Envoy's API is bumped:

    python proto/envoy/vendor.py
"""

from __future__ import annotations

import pathlib

from google.protobuf import descriptor_pb2, descriptor_pool

ROOTS = (
    "envoy/service/ext_proc/v3/external_processor.proto",
    "envoy/service/accesslog/v3/als.proto",
    "envoy/data/accesslog/v3/accesslog.proto",
    "envoy/extensions/filters/http/ext_proc/v3/processing_mode.proto",
    "envoy/config/core/v3/base.proto",
    "envoy/type/v3/http_status.proto",
)
OUT = pathlib.Path(__file__).with_name("descriptors.binpb")


def main() -> None:
    import importlib

    for root in ROOTS:  # importing a generated module registers its file and its imports
        importlib.import_module(root.removesuffix(".proto").replace("/", ".") + "_pb2")
    pool = descriptor_pool.Default()
    ordered: list[str] = []

    def visit(name: str) -> None:
        if name in ordered:
            return
        for dependency in pool.FindFileByName(name).dependencies:
            visit(dependency.name)
        ordered.append(name)  # dependencies first, as protoc wants them

    for root in ROOTS:
        visit(root)
    files = descriptor_pb2.FileDescriptorSet()
    for name in ordered:
        pool.FindFileByName(name).CopyToProto(files.file.add())
    OUT.write_bytes(files.SerializeToString(deterministic=True))
    print(f"wrote {OUT}: {len(ordered)} files")


if __name__ == "__main__":
    main()
