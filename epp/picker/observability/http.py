"""The EPP's own HTTP server on `--metrics-port`: Prometheus `/metrics`, `/healthz`, and extra routes.

`build_app` takes the registry and any extra routes (e.g. `/debug/decisions`), so other parts
add endpoints without touching this module.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from epp.picker.listen import ListenError

log = logging.getLogger(__name__)

ReadyFn = Callable[[], bool]


def build_app(
    registry: CollectorRegistry,
    *,
    ready: ReadyFn | None = None,
    extra_routes: Sequence[web.RouteDef] = (),
) -> web.Application:
    """`/metrics` from `registry`; `/healthz` 200 when `ready()` (or always, without one), else 503."""

    async def metrics(request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = encoder(registry)
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response

    async def healthz(request: web.Request) -> web.Response:
        if ready is None or ready():
            return web.Response(text="ok\n")
        return web.Response(status=503, text="not ready\n")

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics), web.get("/healthz", healthz), *extra_routes])
    return app


async def start_http(app: web.Application, *, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving `app`; returns the runner (call `cleanup()` to stop) and the bound port."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_port=False)
    try:
        await site.start()
    except OSError as err:
        await runner.cleanup()
        raise ListenError(f"cannot listen on {host}:{port} (metrics): {err.strerror}") from err
    addresses = runner.addresses
    bound = int(addresses[0][1]) if addresses else port
    return runner, bound
