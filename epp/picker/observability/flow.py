"""`GET /debug/flow-control`: what waits in the EPP's queues, and the capacity it waits for.

Operators ask "why is this request waiting?": the page lists each priority band (requests, bytes,
flows, the oldest wait), the lanes that have waited longest (a lane is one flow's requests for
one target model), and per endpoint what the gate counts: request headroom, LoRA slots, the
adapters in flight there and a slot being freed for a waiter.
"""

from __future__ import annotations

from aiohttp import web

from epp.clock import Clock
from epp.picker.datastore.store import Datastore
from epp.picker.director import Director

LANES_SHOWN = 50


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
    return {
        "enabled": True,
        "capacity": settings.capacity.value,
        "request_ttl_s": settings.request_ttl_s,
        "queued": len(queues),
        "bytes": queues.size,
        "bands": [
            {
                "priority": band.priority,
                "requests": band.requests,
                "bytes": band.bytes,
                "flows": band.flows,
                "oldest_wait_s": None if band.oldest_wait_s is None else round(band.oldest_wait_s, 3),
            }
            for band in queues.bands(now)
        ],
        "lanes": lanes,
        "endpoints": endpoints,
    }


def flow_control_route(director: Director, datastore: Datastore, clock: Clock) -> web.RouteDef:
    async def handler(_: web.Request) -> web.Response:
        return web.json_response(flow_control_view(director, datastore, clock))

    return web.get("/debug/flow-control", handler)
