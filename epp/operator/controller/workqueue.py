"""Run reconciles on the event loop: one at a time per object, up to `workers` objects at once.

A reconcile waits on the network (the API server, the adapter survey of an object's pods),
so objects must not queue behind each other. Work for an object is coalesced by key: while
the object waits for its turn or is being reconciled, only its newest item is kept, and it
runs right after the current reconcile, so an object is never reconciled twice at once (no
racing creates) and never with stale input.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class WorkQueue(Generic[T]):
    """Keys waiting for a worker, and the newest item of each key not yet started.

    `add` may be called at any time from the loop; `run` does the work until `shutdown`.
    Invariant: a key is in the ready queue exactly when it has an item waiting and is not
    being worked on, so a key never occupies two workers.
    """

    def __init__(self, work: Callable[[T], Awaitable[object]], workers: int) -> None:
        self._work = work
        self._workers = workers
        self._ready: asyncio.Queue[str | None] = asyncio.Queue()  # None: a worker's signal to stop
        self._newest: dict[str, T] = {}
        self._running: set[str] = set()
        self._closed = False

    def add(self, key: str, item: T) -> None:
        """Work on `item` soon; if `key` is being worked on now, right after that (newest item wins).

        Ignored after `shutdown`: the next start lists every object again.
        """
        if self._closed:
            return
        waiting = key in self._newest
        self._newest[key] = item
        if not waiting and key not in self._running:
            self._ready.put_nowait(key)

    async def run(self) -> None:
        """Work with `workers` tasks until `shutdown`; returns once they have all stopped."""
        async with asyncio.TaskGroup() as tasks:
            for _ in range(self._workers):
                tasks.create_task(self._worker())

    async def _worker(self) -> None:
        while True:
            key = await self._ready.get()
            try:
                if key is None:
                    return
                if key in self._newest:  # (gone only when shutdown dropped it)
                    await self._work_on(key, self._newest.pop(key))
            finally:
                self._ready.task_done()

    async def _work_on(self, key: str, item: T) -> None:
        self._running.add(key)
        try:
            await self._work(item)
        except Exception:  # whatever one reconcile hits must not stop the others
            # The item is dropped: the next resync pass brings the object back.
            log.exception("reconcile crashed", extra={"key": key})
        finally:
            self._running.discard(key)
            # Put back before this item is marked done, so `join` never sees a gap.
            if key in self._newest and not self._closed:
                self._ready.put_nowait(key)

    async def join(self) -> None:
        """Wait until no item is waiting or being worked on."""
        await self._ready.join()

    async def shutdown(self) -> None:
        """Stop: items not yet started are dropped, running ones finish, then `run` returns."""
        self._closed = True
        self._newest.clear()
        for _ in range(self._workers):
            self._ready.put_nowait(None)
        await self._ready.join()
