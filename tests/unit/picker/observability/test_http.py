"""The metrics HTTP app: /metrics from the given registry, /healthz from readiness, extra routes."""

from __future__ import annotations

import socket

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from epp.picker.listen import ListenError
from epp.picker.observability.http import build_app, start_http


async def test_metrics_healthz_and_extra_routes() -> None:
    registry = CollectorRegistry()
    Counter("epp_test_requests", "test counter", registry=registry).inc(3)
    ready = [False]

    async def decisions(request: web.Request) -> web.Response:
        return web.json_response([])

    app = build_app(registry, ready=lambda: ready[0], extra_routes=[web.get("/debug/decisions", decisions)])
    runner, port = await start_http(app, host="127.0.0.1", port=0)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                assert response.status == 200
                assert "epp_test_requests_total 3.0" in await response.text()
            async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
                assert response.status == 503
            ready[0] = True
            async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
                assert response.status == 200
            async with session.get(f"http://127.0.0.1:{port}/debug/decisions") as response:
                assert await response.json() == []
    finally:
        await runner.cleanup()


async def test_port_in_use_is_a_listen_error() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        with pytest.raises(ListenError, match="cannot listen"):
            await start_http(build_app(CollectorRegistry()), host="127.0.0.1", port=holder.getsockname()[1])
