"""`envoy --mode validate` on a config file: the offline check that a generated bootstrap is one
Envoy accepts, without binding a port or starting a stack."""

from __future__ import annotations

import pathlib
import subprocess

from epp.tools.envoy.process import EnvoyStartError, find_envoy


def validate_config(config_path: pathlib.Path, *, timeout_s: float = 60.0) -> str:
    """Run `envoy --mode validate`; returns Envoy's output, raises EnvoyStartError when invalid."""
    result = subprocess.run(
        [str(find_envoy()), "--mode", "validate", "-c", str(config_path), "--use-dynamic-base-id"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    output = result.stdout + result.stderr
    if result.returncode != 0:
        raise EnvoyStartError(f"envoy rejected {config_path}: {output[-2000:]}")
    return output
