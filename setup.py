"""Build hook: compile proto/*.proto into epp/_proto/ with grpcio-tools (not committed).

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


def generate_protos() -> None:
    import grpc_tools
    from grpc_tools import protoc

    OUT_DIR.mkdir(parents=True, exist_ok=True)
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


class BuildPyWithProtos(build_py):
    def finalize_options(self) -> None:
        super().finalize_options()
        # Metadata generation (egg_info) asks build_py for its files before `run`, and package
        # discovery ran before the generated sources existed on a fresh checkout: generate now.
        generate_protos()
        if self.packages is not None and "epp._proto" not in self.packages:
            self.packages.append("epp._proto")


setup(cmdclass={"build_py": BuildPyWithProtos})
