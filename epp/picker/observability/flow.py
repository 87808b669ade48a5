"""`GET /debug/flow-control`: what waits in the EPP's queues, and the capacity it waits for.

Operators ask "why is this request waiting?" and "why was it refused?": the page lists each
priority band (requests, bytes, flows, the oldest wait, what a newcomer would wait now, the
refusals by reason), the flows with the most waiting (a flow is one fairness ID in one band: its
requests, its fairness counter, its estimated wait), the lanes that have waited longest (a lane is
one flow's requests for one target model), the overload judge (its target, the dispatch rate it
estimates by), and per endpoint what the gate counts: request headroom, LoRA slots, the adapters
in flight there and a slot being freed for a waiter. Reading it changes nothing.
"""

from __future__ import annotations

import math

from aiohttp import web

from epp.clock import Clock
from epp.picker.datastore.store import Datastore
from epp.picker.director import Director

LANES_SHOWN = 50
FLOWS_SHOWN = 50


def flow_control_view(director: Director, datastore: Datastore, clock: Clock) -> dict[str, object]:
    flow = director.flow
    if flow is None:
        return {"enabled": False}
    now = clock.now()
    queues = flow.queues
    settings = queues.settings
    lanes = []
    for view in queues.lanes(now, LANES_SHOWN):
        target, subset = view.lane if isinstance(view.lane, tuple) else (str(view.lane), None)
        lanes.append(
            {
                "priority": view.priority,
                "fairness_id": view.fairness_id,
                "target_model": target,
                "subset": list(subset) if isinstance(subset, tuple) else None,
                "requests": view.requests,
                "oldest_wait_s": round(view.oldest_wait_s, 3),
                "total_wait_s": round(view.total_wait_s, 3),
            }
        )
    endpoints = [
        {
            "endpoint": room.endpoint,
            "headroom": room.headroom,
            "slots": room.slots,
            "free_slots": room.free_slots,
            "in_flight": room.in_flight,
            "draining": room.draining,
        }
        for room in flow.gate.rooms(datastore.snapshot().endpoints, now)
    ]
    judge = flow.judge
    refusals: dict[int, dict[str, int]] = {}
    if judge is not None:
        for (priority, reason), count in sorted(judge.refusals.items(), key=lambda kv: kv[0][1].value):
            refusals.setdefault(priority, {})[reason.value] = count

    def wait_s(ahead: int) -> float | None:
        if judge is None:
            return None
        wait = judge.view_wait(ahead, now)
        return round(wait, 3) if math.isfinite(wait) else None

    bands = []
    for band in queues.bands(now):
        bands.append(
            {
                "priority": band.priority,
                "requests": band.requests,
                "bytes": band.bytes,
                "flows": band.flows,
                "oldest_wait_s": None if band.oldest_wait_s is None else round(band.oldest_wait_s, 3),
                "newcomer_wait_s": wait_s(queues.position(band.priority, "")),
                "refused": refusals.pop(band.priority, {}),
            }
        )
    bands.extend(
        {"priority": priority, "requests": 0, "refused": counts} for priority, counts in refusals.items()
    )
    flows = [
        {
            "priority": view.priority,
            "fairness_id": view.fairness_id,
            "requests": view.requests,
            "counter": round(view.counter, 1),
            "estimated_wait_s": wait_s(view.ahead),
        }
        for view in queues.flows(FLOWS_SHOWN)
    ]
    return {
        "enabled": True,
        "capacity": settings.capacity.value,
        "request_ttl_s": settings.request_ttl_s,
        # vtc counts prompt tokens (estimated from the text, 4 characters a token) as a request is
        # dispatched and output tokens (twice) as it finishes; a request without prompt text counts
        # its body's bytes instead.
        "fairness_cost": "tokens (bytes where a request has no prompt text)",
        "overload": None
        if judge is None
        else {
            "wait_target_s": judge.settings.wait_target_s,
            "dispatch_rate_per_s": round(judge.rate(now), 3),
        },
        "fair_share": None if flow.shares is None else flow.shares.view(now),
        "queued": len(queues),
        "bytes": queues.size,
        "bands": bands,
        "flows": flows,
        "lanes": lanes,
        "endpoints": endpoints,
    }


def flow_control_route(director: Director, datastore: Datastore, clock: Clock) -> web.RouteDef:
    async def handler(_: web.Request) -> web.Response:
        return web.json_response(flow_control_view(director, datastore, clock))

    return web.get("/debug/flow-control", handler)
