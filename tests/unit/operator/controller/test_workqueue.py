"""WorkQueue: objects are reconciled in parallel up to `workers`, one object never twice at
once, work queued for a busy object is coalesced to the newest item, a crash stops nothing,
and shutdown lets running work finish."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable

import pytest

from epp.operator.controller.workqueue import WorkQueue

WAIT_S = 10.0  # a bound on a hang, not a timing assertion


class Gated:
    """Work whose items block until released; records what started, finished and overlapped."""

    def __init__(self, blocking: Iterable[str] = ()) -> None:
        self.started: list[str] = []
        self.finished: list[str] = []
        self._started_event: dict[str, asyncio.Event] = {}
        self._finished_event: dict[str, asyncio.Event] = {}
        self._release: dict[str, asyncio.Event] = {item: asyncio.Event() for item in blocking}
        self.running_keys: list[str] = []
        self.overlapped = False
        self.most_at_once = 0

    def release(self, item: str) -> None:
        self._release[item].set()

    async def wait_started(self, item: str) -> None:
        await self._started_event.setdefault(item, asyncio.Event()).wait()

    async def wait_finished(self, item: str) -> None:
        await self._finished_event.setdefault(item, asyncio.Event()).wait()

    async def __call__(self, item: str) -> None:
        key = item.split(":")[0]
        self.overlapped = self.overlapped or key in self.running_keys
        self.running_keys.append(key)
        self.most_at_once = max(self.most_at_once, len(self.running_keys))
        self.started.append(item)
        self._started_event.setdefault(item, asyncio.Event()).set()
        try:
            if item in self._release:
                await self._release[item].wait()
            if item.endswith("boom"):
                raise RuntimeError("boom")
            self.finished.append(item)
            self._finished_event.setdefault(item, asyncio.Event()).set()
        finally:
            self.running_keys.remove(key)


@contextlib.asynccontextmanager
async def running(queue: WorkQueue[str]) -> AsyncIterator[None]:
    async with asyncio.timeout(WAIT_S), asyncio.TaskGroup() as tasks:
        worker_run = tasks.create_task(queue.run())
        try:
            yield
        finally:
            await queue.shutdown()
            await worker_run


async def test_a_slow_object_does_not_hold_up_another() -> None:
    work = Gated(blocking=["a:slow"])
    queue = WorkQueue(work, workers=2)
    async with running(queue):
        queue.add("a", "a:slow")
        queue.add("b", "b:fast")
        await work.wait_finished("b:fast")  # while "a" is still blocked
        assert work.started == ["a:slow", "b:fast"] and work.finished == ["b:fast"]
        work.release("a:slow")
        await queue.join()
    assert sorted(work.finished) == ["a:slow", "b:fast"]


async def test_work_for_a_busy_object_runs_after_it_newest_item_only() -> None:
    work = Gated(blocking=["same:1"])
    queue = WorkQueue(work, workers=4)
    async with running(queue):
        queue.add("same", "same:1")
        await work.wait_started("same:1")
        for item in ("same:2", "same:3", "same:4"):
            queue.add("same", item)
        work.release("same:1")
        await queue.join()
    assert work.started == ["same:1", "same:4"]
    assert not work.overlapped


async def test_an_object_waiting_for_a_worker_keeps_only_its_newest_item() -> None:
    work = Gated(blocking=["x:1"])
    queue = WorkQueue(work, workers=1)
    async with running(queue):
        queue.add("x", "x:1")
        await work.wait_started("x:1")
        for item in ("y:1", "y:2", "y:3"):
            queue.add("y", item)
        work.release("x:1")
        await queue.join()
    assert work.started == ["x:1", "y:3"]


async def test_no_more_objects_run_at_once_than_workers() -> None:
    work = Gated(blocking=["a:1", "b:1", "c:1"])
    queue = WorkQueue(work, workers=2)
    async with running(queue):
        for key in "abc":
            queue.add(key, f"{key}:1")
        await work.wait_started("a:1")
        await work.wait_started("b:1")
        assert work.started == ["a:1", "b:1"]  # a third worker would have taken "c" by now
        work.release("a:1")
        await work.wait_started("c:1")  # the freed worker takes the waiting object
        work.release("b:1")
        work.release("c:1")
        await queue.join()
    assert work.most_at_once == 2
    assert sorted(work.finished) == ["a:1", "b:1", "c:1"]


async def test_a_crash_is_logged_and_stops_neither_its_object_nor_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    work = Gated()
    queue = WorkQueue(work, workers=1)
    async with running(queue):
        queue.add("x", "x:boom")
        queue.add("y", "y:1")
        await queue.join()
        queue.add("x", "x:2")
        await queue.join()
    assert work.finished == ["y:1", "x:2"]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == ["reconcile crashed"]


async def test_shutdown_lets_running_work_finish_and_drops_what_has_not_started() -> None:
    work = Gated(blocking=["a:1"])
    queue = WorkQueue(work, workers=1)
    async with asyncio.timeout(WAIT_S), asyncio.TaskGroup() as tasks:
        worker_run = tasks.create_task(queue.run())
        queue.add("a", "a:1")
        await work.wait_started("a:1")
        queue.add("a", "a:2")  # waits for "a:1"
        queue.add("b", "b:1")  # waits for the only worker
        stopping = tasks.create_task(queue.shutdown())
        await asyncio.sleep(0)  # one turn: shutdown runs up to its wait
        assert not stopping.done()  # "a:1" is still running
        work.release("a:1")
        await stopping
        await worker_run
        queue.add("c", "c:1")  # after shutdown: ignored
    assert work.started == ["a:1"]
    assert work.finished == ["a:1"]
