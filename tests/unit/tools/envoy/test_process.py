"""Running Envoy: found, ready on an ephemeral admin port, reaped on stop, clear errors."""

from __future__ import annotations

import os
import pathlib

import pytest

from epp.tools.envoy.bootstrap import EnvoyOptions, HostPort, RoutingMode, build_bootstrap, render_yaml
from epp.tools.envoy.process import EnvoyProcess, EnvoyStartError, find_envoy


def test_find_envoy_returns_an_executable() -> None:
    path = find_envoy()
    assert path.is_file()
    assert os.access(path, os.X_OK)


def test_envoy_starts_ready_and_stops(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "envoy.yaml"
    options = EnvoyOptions(
        listen_address="127.0.0.1", listen_port=0, mode=RoutingMode.ROUND_ROBIN,
        pool_endpoints=(HostPort("127.0.0.1", 9),),
    )  # fmt: skip
    config.write_text(render_yaml(build_bootstrap(options)))
    envoy = EnvoyProcess(config)
    try:
        envoy.start()
        host, _, port = envoy.admin_address.rpartition(":")
        assert host == "127.0.0.1"
        assert int(port) > 0
        assert envoy.admin_get("/ready").strip() == "LIVE"
        pid = envoy.pid
        assert pid is not None
    finally:
        envoy.stop()
    assert envoy.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_config_envoy_refuses_is_a_start_error_with_its_log(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "envoy.yaml"
    config.write_text("static_resources: {clusters: [{name: x, type: NOT_A_TYPE}]}\n")
    envoy = EnvoyProcess(config)
    try:
        with pytest.raises(EnvoyStartError, match="NOT_A_TYPE"):
            envoy.start(ready_timeout_s=20)
    finally:
        envoy.stop()
