"""What the queue and controller tests share: a payload, filing one, and reading what was placed."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from epp.picker.flowcontrol.controller import FlowController, Rejection
from epp.picker.flowcontrol.queues import QueueItem


@dataclass(eq=False)
class Req:
    name: str


def put(
    fc: FlowController[Req],
    name: str,
    *,
    flow: str = "t",
    priority: int = 0,
    lane: Hashable = "a",
    size: int = 1,
    at: float = 0.0,
    ttl_s: float = 0.0,
) -> QueueItem[Req]:
    """File a request named `name`; the limits must let it in."""
    item = fc.enqueue(
        Req(name), fairness_id=flow, priority=priority, lane=lane, size=size, now=at, ttl_s=ttl_s
    )
    assert not isinstance(item, Rejection)
    return item


def names(items: Sequence[QueueItem[Req]]) -> list[str]:
    return [item.payload.name for item in items]
