"""Build hook: compile our protos and the Envoy ones the EPP speaks into epp/_proto/ (not committed).

Our own `proto/*.proto` compile from source. Envoy's ext_proc and access-log APIs (and the
files they import) compile from `proto/envoy/descriptors.binpb`, a FileDescriptorSet written by
`proto/envoy/vendor.py`, into `epp/_proto/{envoy,udpa,xds,validate}/` with their imports
rewritten under `epp._proto`: no runtime dependency ships them, so nothing else can overwrite
them or any other package's files.

Runs for wheels, sdists built into wheels and editable installs alike: `build_py` writes
the generated modules into the source tree's `epp/_proto/` (which editable installs use)
and, for regular builds, setuptools then copies them into the wheel with the package.
Metadata lives in pyproject.toml.
"""

from __future__ import annotations

import pathlib
import re

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = pathlib.Path(__file__).resolve().parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "epp" / "_proto"


ENVOY_SET = PROTO_DIR / "envoy" / "descriptors.binpb"
VENDORED_ROOTS = ("envoy", "udpa", "xds", "validate")


def generate_protos() -> None:
    import grpc_tools
    from grpc_tools import protoc

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    generate_envoy_protos(protoc)
    (OUT_DIR / "__init__.py").write_text('"""Generated from proto/ by setup.py; do not edit."""\n')
    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    for proto in sorted(PROTO_DIR.glob("*.proto")):
        code = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{PROTO_DIR}",
                f"-I{include}",
                f"--python_out={OUT_DIR}",
                f"--grpc_python_out={OUT_DIR}",
                str(proto),
            ]
        )
        if code != 0:
            raise RuntimeError(f"protoc failed on {proto}")
        # grpcio-tools writes a top-level import; make it a package import.
        grpc_module = OUT_DIR / f"{proto.stem}_pb2_grpc.py"
        text = grpc_module.read_text()
        text = re.sub(
            rf"^import {proto.stem}_pb2 as", f"from epp._proto import {proto.stem}_pb2 as", text, flags=re.M
        )
        grpc_module.write_text(text)


def generate_envoy_protos(protoc: object) -> None:
    """Envoy's protos from the vendored descriptor set, imports rewritten under `epp._proto`."""
    from google.protobuf import descriptor_pb2

    files = descriptor_pb2.FileDescriptorSet.FromString(ENVOY_SET.read_bytes())
    names = [f.name for f in files.file if f.name.split("/")[0] in VENDORED_ROOTS]
    code = protoc.main(  # type: ignore[attr-defined]
        [
            "grpc_tools.protoc",
            f"--descriptor_set_in={ENVOY_SET}",
            f"--python_out={OUT_DIR}",
            f"--grpc_python_out={OUT_DIR}",
            *names,
        ]
    )
    if code != 0:
        raise RuntimeError("protoc failed on the vendored Envoy protos")
    pattern = re.compile(rf"^(from|import) ({'|'.join(VENDORED_ROOTS)})([. ])", flags=re.M)
    for directory in vendored_packages():
        (directory / "__init__.py").touch()
    for root in VENDORED_ROOTS:
        for module in (OUT_DIR / root).rglob("*.py"):
            text = module.read_text()
            module.write_text(pattern.sub(r"\1 epp._proto.\2\3", text))


def vendored_packages() -> list[pathlib.Path]:
    """Every directory the vendored Envoy protos were generated into: each a package."""
    return [
        directory
        for root in VENDORED_ROOTS
        for directory in [OUT_DIR / root, *(d for d in (OUT_DIR / root).rglob("*") if d.is_dir())]
    ]


class BuildPyWithProtos(build_py):
    def finalize_options(self) -> None:
        super().finalize_options()
        # Metadata generation (egg_info) asks build_py for its files before `run`, and package
        # discovery ran before the generated sources existed on a fresh checkout: generate now.
        generate_protos()
        if self.packages is not None:
            generated = ["epp._proto"] + [
                "epp._proto." + ".".join(d.relative_to(OUT_DIR).parts) for d in vendored_packages()
            ]
            self.packages.extend(name for name in generated if name not in self.packages)


setup(cmdclass={"build_py": BuildPyWithProtos})
