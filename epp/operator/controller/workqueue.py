"""Run reconciles on a few threads: one at a time per object, different objects in parallel.

A reconcile may wait on the network (the API server, the adapter survey of an object's
pods), so objects must not queue behind each other. Work for an object that is already
being reconciled is coalesced: only the newest item waits, and it runs right after the
current one, so an object is never reconciled twice at once (no racing creates).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class WorkQueue(Generic[T]):
    def __init__(self, work: Callable[[T], object], workers: int) -> None:
        self._work = work
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="reconcile"
        )
        self._idle = threading.Condition()
        self._active: set[str] = set()
        self._pending: dict[str, T] = {}

    def add(self, key: str, item: T) -> None:
        """Reconcile `item` soon; if `key` is being reconciled now, after that (newest item wins)."""
        with self._idle:
            if key in self._active:
                self._pending[key] = item
                return
            self._active.add(key)
        future = self._executor.submit(self._drain, key, item)
        future.add_done_callback(_report_crash)

    def _drain(self, key: str, item: T) -> None:
        released = False
        try:
            while True:
                self._work(item)
                with self._idle:
                    # Checked and released under one lock hold, so no item slips in between.
                    if key not in self._pending:
                        self._release(key)
                        released = True
                        return
                    item = self._pending.pop(key)
        finally:
            if not released:  # the work raised: the resync pass reconciles the object again
                with self._idle:
                    self._pending.pop(key, None)
                    self._release(key)

    def _release(self, key: str) -> None:
        """Caller holds `_idle`."""
        self._active.discard(key)
        self._idle.notify_all()

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait until no work is queued or running; False if `timeout_s` passed first."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._active, timeout_s)

    def shutdown(self) -> None:
        """Let running work finish; queued work for an object still runs first."""
        self._executor.shutdown(wait=True)


def _report_crash(future: concurrent.futures.Future[None]) -> None:
    # The item is dropped; the next resync pass reconciles the object again.
    error = future.exception()
    if error is not None:
        log.error("reconcile crashed", exc_info=error)
