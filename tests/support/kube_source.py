"""`KubeSource` running on the test's loop against an API server, for as long as a test needs it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from epp.clock import SystemClock
from epp.kube.watch import KubeSource, PoolRef, WatchTiming
from epp.picker.datastore.store import Datastore


@contextlib.asynccontextmanager
async def running_source(
    pool: PoolRef, kubeconfig: str, *, watch_timeout_s: int, synced_within_s: float, **kwargs: Any
) -> AsyncIterator[tuple[Datastore, KubeSource]]:
    """A datastore fed by a `KubeSource` for `pool`, once it has synced; cancelled on exit."""
    clock = SystemClock()
    datastore = Datastore(clock)
    source = KubeSource(
        datastore,
        pool=pool,
        kubeconfig=kubeconfig,
        clock=clock,
        timing=WatchTiming(watch_timeout_s=watch_timeout_s, backoff_initial_s=0.05, backoff_max_s=0.5),
        **kwargs,
    )
    task = asyncio.create_task(source.run())
    try:
        await asyncio.wait_for(source.synced.wait(), synced_within_s)
        yield datastore, source
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
