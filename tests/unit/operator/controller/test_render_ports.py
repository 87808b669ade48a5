"""The controller renders `epp serve` without port flags only where its ports are `epp serve`'s
own defaults: a default changed on one side alone would leave Envoy and the probes knocking at
the wrong port."""

from __future__ import annotations

from epp.operator.controller import render
from epp.serve.settings import ListenSettings


def test_the_controllers_epp_ports_are_epp_serves_defaults() -> None:
    listen = ListenSettings()
    assert (
        listen.grpc_port,
        listen.grpc_health_port,
        listen.metrics_port,
    ) == (render.EPP_DEFAULT_PORT, render.EPP_HEALTH_PORT, render.EPP_METRICS_PORT)
    assert render.RenderSettings().epp_port == listen.grpc_port
