"""Real Envoy (and, in EPP mode, `epp serve`) in front of the real vLLM servers.

vLLM sends no `x-inference-pod` header, so Envoy is told to answer with two of its own:
`x-epp-destination` (the `x-gateway-destination-endpoint` request header the EPP set, as it
reached the router) and `x-upstream-host` (the address Envoy actually dialled). Together with
the servers' own request counters that shows where each request went and who chose it.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from epp.picker.datastore.types import FailureMode
from epp.tools.envoy.bootstrap import EnvoyOptions, HostPort, RoutingMode, build_bootstrap, render_yaml
from epp.tools.envoy.process import EnvoyProcess
from epp.tools.localstack import epp_ready, free_port, pool_yaml
from tests.realvllm.client import RealPod

EPP_CHOICE_HEADER = "x-epp-destination"
UPSTREAM_HOST_HEADER = "x-upstream-host"
START_TIMEOUT_S = 60.0


def _add_reply_headers(bootstrap: dict[str, Any]) -> None:
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["route_config"]["response_headers_to_add"] = [
        {
            "header": {"key": EPP_CHOICE_HEADER, "value": "%REQ(x-gateway-destination-endpoint)%"},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        },
        {
            "header": {"key": UPSTREAM_HOST_HEADER, "value": "%UPSTREAM_REMOTE_ADDRESS%"},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        },
    ]


class Gateway:
    """Start with `with Gateway(...) as gw:`; `gw.url` is Envoy's listener."""

    def __init__(
        self,
        pods: Sequence[RealPod],
        workdir: pathlib.Path,
        *,
        mode: RoutingMode = RoutingMode.EPP,
        refresh_metrics_interval: str = "100ms",
        extra_serve_args: Sequence[str] = (),
    ) -> None:
        self.pods = list(pods)
        self.mode = mode
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.refresh_metrics_interval = refresh_metrics_interval
        self.extra_serve_args = list(extra_serve_args)
        self.epp: subprocess.Popen[bytes] | None = None
        self.envoy: EnvoyProcess | None = None
        self.url = ""
        self.grpc_port = free_port()
        self.health_port = free_port()
        self.metrics_port = free_port()

    @property
    def epp_log(self) -> pathlib.Path:
        return self.workdir / "epp.log"

    def __enter__(self) -> Gateway:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        if self.mode is RoutingMode.EPP:
            pool_file = self.workdir / "pool.yaml"
            pool_file.write_text(
                pool_yaml(
                    "vllm-pool",
                    [(p.name, p.host) for p in self.pods],
                    self.pods[0].port,
                    FailureMode.FAIL_CLOSE,
                )
            )
            command = [
                sys.executable, "-m", "epp", "serve", "--pool-file", str(pool_file), "--host", "127.0.0.1",
                "--grpc-port", str(self.grpc_port), "--grpc-health-port", str(self.health_port),
                "--metrics-port", str(self.metrics_port), "--secure-serving=false",
                "--refresh-metrics-interval", self.refresh_metrics_interval, *self.extra_serve_args,
            ]  # fmt: skip
            with self.epp_log.open("wb") as log:
                self.epp = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
            while not epp_ready(self.health_port):
                if self.epp.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"epp serve did not become ready:\n{self.epp_log.read_text()[-3000:]}")
                time.sleep(0.1)
        listen_port = free_port()
        options = EnvoyOptions(
            listen_address="127.0.0.1",
            listen_port=listen_port,
            mode=self.mode,
            epp=HostPort("127.0.0.1", self.grpc_port),
            epp_health_port=self.health_port,
            epp_tls=False,
            failure_mode=FailureMode.FAIL_CLOSE,
            pool_endpoints=tuple(HostPort(p.host, p.port) for p in self.pods),
        )
        bootstrap = build_bootstrap(options)
        _add_reply_headers(bootstrap)
        config_path = self.workdir / f"envoy-{self.mode.value}.yaml"
        config_path.write_text(render_yaml(bootstrap))
        self.envoy = EnvoyProcess(config_path, log_path=self.workdir / f"envoy-{self.mode.value}.log")
        self.envoy.start(ready_timeout_s=max(1.0, deadline - time.monotonic()))
        self.url = f"http://127.0.0.1:{listen_port}"
        if self.mode is RoutingMode.EPP:
            while self.envoy.cluster_health("epp") != "healthy":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Envoy never saw the EPP healthy:\n{self.envoy.log_tail()}")
                time.sleep(0.1)

    def stop(self) -> None:
        if self.envoy is not None:
            self.envoy.stop()
        if self.epp is not None and self.epp.poll() is None:
            self.epp.terminate()
            try:
                self.epp.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.epp.kill()
                self.epp.wait(timeout=5)

    def epp_log_tail(self, n_chars: int = 3000) -> str:
        try:
            return self.epp_log.read_text(errors="replace")[-n_chars:]
        except FileNotFoundError:
            return ""
