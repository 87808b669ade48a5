"""Waiting for something to become true, bounded in time: the only way tests wait.

A check is called until it returns something truthy or the time runs out; the interval between
calls only bounds how soon the change is seen, nothing depends on it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll_until(check: Callable[[], object], *, within_s: float, interval_s: float = 0.1) -> bool:
    """Whether `check()` held within `within_s` (it is asked once more at the deadline)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval_s)
    return bool(check())


def wait_until(
    check: Callable[[], object], what: str, *, within_s: float = 15.0, interval_s: float = 0.1
) -> None:
    """Return once `check()` holds; fail naming `what` after `within_s`."""
    if not poll_until(check, within_s=within_s, interval_s=interval_s):
        raise AssertionError(f"not within {within_s:g}s: {what}")


def eventually_value(
    probe: Callable[[], T | None], *, within_s: float, what: str, interval_s: float = 0.5
) -> T:
    """The first result of `probe()` that is not None; fail naming `what` after `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        result = probe()
        if result is not None:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {within_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


async def eventually(
    check: Callable[[], object], what: str, *, within_s: float = 15.0, interval_s: float = 0.02
) -> None:
    """On the event loop: return once `check()` holds; fail naming `what` after `within_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"not within {within_s:g}s: {what}")
        await asyncio.sleep(interval_s)
