"""The `epp` command: one subcommand per role, each in its own module.

Each subcommand module exposes `configure_parser(parser)` and `run(args) -> int`; they
are imported lazily so `epp sim` never pays for the scheduler's imports and vice versa.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("epp.serve.app", "run the Endpoint Picker (Envoy ext_proc server)"),
    "sim": ("epp.tools.sim.cli", "run a vLLM-compatible model-server simulator"),
    "envoy-config": ("epp.tools.envoy.cli", "write an Envoy bootstrap that routes through the EPP"),
    "demo": ("epp.tools.demo", "run Envoy + simulated pods + EPP locally and compare with round-robin"),
    "bench": ("epp.tools.bench.cli", "discrete-event benchmark of routing policies"),
    "controller": (
        "epp.operator.controller.cli",
        "reconcile LLMInferenceServices into model servers, pool and EPP",
    ),
    "sidecar": (
        "epp.operator.sidecar.cli",
        "serve a model server's adapter state and runtime loads over gRPC",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="epp", description="LoRA-aware Endpoint Picker for Envoy.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        sub_parser.set_defaults(_module=module_name)
        # Only the chosen subcommand's module is imported (see main); here we only register.
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not args_list or args_list[0] not in SUBCOMMANDS:
        parser.parse_args(args_list)  # prints usage / error and exits
        return 2
    name = args_list[0]
    module_name, help_text = SUBCOMMANDS[name]
    module = importlib.import_module(module_name)
    sub_parser = argparse.ArgumentParser(prog=f"epp {name}", description=help_text)
    module.configure_parser(sub_parser)
    args = sub_parser.parse_args(args_list[1:])
    result: int = module.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
