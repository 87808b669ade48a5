"""Active-active `epp serve` replicas with `--peers`: each learns what the other routed, over the
real gRPC peer exchange, and forgets a replica that stops."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Awaitable, Callable

import aiohttp
import grpc
import pytest

from epp.errors import ConfigError
from epp.serve.config import ServeSettings
from tests.integration.test_serve_grpc import (
    FakePods,
    Running,
    body_message,
    destination,
    exchange,
    finish,
    free_port,
    headers_message,
    settings,
    start,
    write_pool,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ADAPTER_BODY = b'{"model":"sql-lora","prompt":"hello"}'


async def debug(running: Running, path: str) -> dict[str, object]:
    """A debug page, fetched without blocking the event loop both replicas serve on."""
    url = f"http://127.0.0.1:{running.ports.metrics}{path}"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        payload: dict[str, object] = await response.json()
    return payload


async def peer_ids(running: Running) -> list[str]:
    peers = (await debug(running, "/debug/peers"))["peers"]
    assert isinstance(peers, list)
    return [p["id"] for p in peers]


async def received(running: Running) -> int:
    value = (await debug(running, "/debug/peers"))["batches_received"]
    assert isinstance(value, int)
    return value


async def until(check: Callable[[], Awaitable[bool]], what: str, *, within_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"not within {within_s:g}s: {what}")
        await asyncio.sleep(0.02)


async def last_decision(running: Running) -> dict[str, object]:
    decisions = (await debug(running, "/debug/decisions"))["decisions"]
    assert isinstance(decisions, list)
    newest: dict[str, object] = decisions[0]
    return newest


async def route(running: Running) -> str:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.ports.grpc}") as channel:
        replies = await exchange(channel, [headers_message(), body_message(ADAPTER_BODY, True)])
    return destination(replies[0])


def replica(pool: pathlib.Path, peers: str, port: int) -> ServeSettings:
    return settings(pool, policy=None, peers=peers, peer_port=port, peer_interval_s=0.02)


async def test_a_replica_routes_on_what_its_peer_loaded_and_forgets_a_stopped_peer(
    tmp_path: pathlib.Path,
) -> None:
    pods = FakePods()
    await pods.start()
    pool = write_pool(tmp_path, pods.port)
    port_a, port_b = free_port(), free_port()
    peers = f"127.0.0.1:{port_a},127.0.0.1:{port_b}"  # each lists itself too, as a Service would
    a = await start(replica(pool, peers, port_a))
    b = await start(replica(pool, peers, port_b))
    try:
        await pods.wait_scraped()
        id_a = (await debug(a, "/debug/peers"))["id"]
        id_b = (await debug(b, "/debug/peers"))["id"]

        async def both_hear() -> bool:
            return await peer_ids(b) == [id_a] and await peer_ids(a) == [id_b]

        await until(both_hear, "each hears the other")
        assert (await debug(a, "/debug/peers"))["sending_to"] == [f"127.0.0.1:{port_b}"]  # not to itself

        served_by_a = await route(a)
        assert (await last_decision(a))["reason"] == "planned-free-slot"  # nobody had the adapter
        seen = await received(b)

        async def two_more() -> bool:
            return await received(b) >= seen + 2

        await until(two_more, "B took a batch sent after A routed")
        served_by_b = await route(b)
        assert served_by_b == served_by_a
        # B had routed nothing itself: it learnt from A that the pod holds the adapter.
        assert (await last_decision(b))["reason"] == "adapter-resident"
    finally:
        await finish(a)
    try:

        async def forgotten() -> bool:
            return await peer_ids(b) == []

        await until(forgotten, "B forgets the stopped replica")
        assert await route(b)  # and keeps routing
    finally:
        await finish(b)
        await pods.stop()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"policy": "round-robin"}, "--peers needs a policy with scheduler state"),
    ],
)
async def test_peers_with_a_stateless_policy_is_a_start_up_error(
    tmp_path: pathlib.Path, overrides: dict[str, object], message: str
) -> None:
    pool = write_pool(tmp_path)
    with pytest.raises(ConfigError, match=message):
        await start(settings(pool, peers="127.0.0.1:1", peer_port=0, **overrides))
