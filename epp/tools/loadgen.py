"""Live load for the tools that measure a real stack (`epp demo`, `epp bench --live`).

One way to send an OpenAI completion through a gateway and time it, driven either open-loop
(each request at its scheduled arrival, as a trace replays) or closed-loop (a fixed number of
clients, each sending its next request when the previous answer is in).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import aiohttp

Body = Mapping[str, object]


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds from sending to the first body chunk and to the end of the response."""

    ttft_s: float
    e2e_s: float


async def post_completion(session: aiohttp.ClientSession, base_url: str, body: Body) -> Timing | None:
    """POST `/v1/completions`; None when the gateway answered an error or the connection failed."""
    sent = time.monotonic()
    first: float | None = None
    try:
        async with session.post(f"{base_url}/v1/completions", json=body) as response:
            if response.status != 200:
                await response.read()
                return None
            async for _chunk in response.content.iter_any():
                if first is None:
                    first = time.monotonic()
    except (aiohttp.ClientError, TimeoutError):
        return None
    end = time.monotonic()
    return Timing((first or end) - sent, end - sent)


async def open_loop(
    base_url: str, schedule: Sequence[tuple[float, Body]], *, timeout_s: float, lead_s: float = 0.2
) -> list[Timing | None]:
    """Send each body `offset` seconds after a common start, whatever the earlier answers did."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        start = time.monotonic() + lead_s

        async def one(offset: float, body: Body) -> Timing | None:
            await asyncio.sleep(max(0.0, start + offset - time.monotonic()))
            return await post_completion(session, base_url, body)

        return list(await asyncio.gather(*(one(offset, body) for offset, body in schedule)))


async def closed_loop(
    base_url: str,
    bodies: Sequence[Body],
    *,
    concurrency: int,
    timeout_s: float,
    on_done: Callable[[int], None] | None = None,
) -> list[Timing | None]:
    """Send `bodies` in order from `concurrency` clients; `on_done(n)` after each answer."""
    results: list[Timing | None] = [None] * len(bodies)
    next_index = 0
    done = 0

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal next_index, done
        while next_index < len(bodies):
            index = next_index
            next_index += 1
            results[index] = await post_completion(session, base_url, bodies[index])
            done += 1
            if on_done is not None:
                on_done(done)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    return results


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (`q` in 0..1): a latency some request really had; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
