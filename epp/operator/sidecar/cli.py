"""`epp sidecar`: serve the adapter-state API for the model server next to it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal

from epp.cliutil import positive_duration
from epp.clock import SystemClock
from epp.operator.sidecar.server import AdapterStateService, serve

log = logging.getLogger(__name__)
SHUTDOWN_GRACE_S = 1.0


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model-server", default="http://127.0.0.1:8000", help="the model server's base URL (same pod)"
    )
    parser.add_argument("--host", default="0.0.0.0", help="gRPC bind address (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=9010, help="gRPC port (default 9010; 0 = any free)")
    parser.add_argument(
        "--poll-interval", type=positive_duration, default=0.5, help="seconds (or 500ms) between reads"
    )
    parser.add_argument("--log-level", default="WARNING", help="Python logging level")


async def _main(args: argparse.Namespace) -> int:
    service = AdapterStateService(args.model_server, clock=SystemClock(), poll_interval_s=args.poll_interval)
    server, port = await serve(service, args.host, args.port)
    print(f"epp sidecar listening on {args.host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    poller = asyncio.create_task(service.poll_forever())
    try:
        await stop.wait()
    finally:
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller
        await server.stop(SHUTDOWN_GRACE_S)
        await service.close()
    return 0


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper())
    return asyncio.run(_main(args))
