"""WorkQueue: objects are reconciled in parallel, one object never twice at once, and work
queued for a busy object is coalesced to the newest item."""

from __future__ import annotations

import threading

from epp.operator.controller.workqueue import WorkQueue

WAIT_S = 10.0  # a bound on a hang, not a timing assertion


def test_a_slow_object_does_not_hold_up_another() -> None:
    release_slow = threading.Event()
    fast_done = threading.Event()

    def work(item: str) -> None:
        if item == "slow":
            assert release_slow.wait(WAIT_S)
        else:
            fast_done.set()

    queue: WorkQueue[str] = WorkQueue(work, workers=2)
    try:
        queue.add("a", "slow")
        queue.add("b", "fast")
        assert fast_done.wait(WAIT_S)  # while "a" is still blocked
        release_slow.set()
        assert queue.join(WAIT_S)
    finally:
        release_slow.set()
        queue.shutdown()


def test_work_for_a_busy_object_runs_after_it_newest_item_only() -> None:
    started = threading.Event()
    release = threading.Event()
    seen: list[int] = []
    running = 0
    overlapped = False
    lock = threading.Lock()

    def work(item: int) -> None:
        nonlocal running, overlapped
        with lock:
            running += 1
            overlapped = overlapped or running > 1
        seen.append(item)
        if item == 1:
            started.set()
            assert release.wait(WAIT_S)
        with lock:
            running -= 1

    queue: WorkQueue[int] = WorkQueue(work, workers=4)
    try:
        queue.add("same", 1)
        assert started.wait(WAIT_S)
        for item in (2, 3, 4):
            queue.add("same", item)
        release.set()
        assert queue.join(WAIT_S)
    finally:
        release.set()
        queue.shutdown()
    assert seen == [1, 4]
    assert not overlapped


def test_a_crashing_item_frees_its_object_for_later_work() -> None:
    seen: list[str] = []

    def work(item: str) -> None:
        if item == "bad":
            raise RuntimeError("boom")
        seen.append(item)

    queue: WorkQueue[str] = WorkQueue(work, workers=1)
    try:
        queue.add("x", "bad")
        assert queue.join(WAIT_S)
        queue.add("x", "good")
        assert queue.join(WAIT_S)
    finally:
        queue.shutdown()
    assert seen == ["good"]
