"""`GET /debug/pool.json` and `GET /debug/pool`: the whole pool on one page.

Operators ask "what sits where, and why did that request go there?". The other debug endpoints
answer parts of it (`/debug/decisions`, `/debug/flow-control`); this view puts together, from
the same state they read:

- each pod and its endpoints: readiness, the newest scrape (slots = `max_lora`, running and
  waiting adapters, queue, KV usage) and the routing ledger's view (adapters in the modelled GPU
  slots, least recently used first, and the modelled host tier; requests in flight, per adapter);
- each adapter: where it sits, what is in flight for it, its planned homes, its traffic share;
- flow control's queues, as `/debug/flow-control` shows them;
- the newest decisions with their reasons, as `/debug/decisions` shows them less the scores.

It is built on request only, from reads that change nothing, so routing pays nothing for it
until someone looks. The JSON carries `version` (`POOL_VIEW_VERSION`): a field is only ever
added within a version; renaming or removing one bumps it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from aiohttp import web

from epp.clock import Clock
from epp.picker.datastore.store import Datastore, pod_matches
from epp.picker.datastore.types import EndpointState
from epp.picker.director import Director
from epp.picker.observability.decisions import Decision, DecisionLog
from epp.picker.observability.flow import flow_control_view
from epp.picker.observability.pool_page import CONTENT_SECURITY_POLICY, PAGE_HTML
from epp.picker.scheduling.residency import PodResidency
from epp.picker.scheduling.state import SchedulerState

POOL_VIEW_VERSION = 1
DEFAULT_DECISIONS = 20  # decisions the view carries unless `?decisions=N` asks otherwise


@dataclass(slots=True)
class _AdapterPlaces:
    """Where one adapter sits, gathered while the endpoints are walked."""

    gpu: list[str] = field(default_factory=list)
    host: list[str] = field(default_factory=list)
    waiting_for_slot: list[str] = field(default_factory=list)
    running_on: list[str] = field(default_factory=list)
    waiting_on: list[str] = field(default_factory=list)
    in_flight: dict[str, int] = field(default_factory=dict)


def pool_view(
    director: Director,
    datastore: Datastore,
    decisions: DecisionLog,
    clock: Clock,
    *,
    decisions_limit: int = DEFAULT_DECISIONS,
) -> dict[str, object]:
    """The pool as `GET /debug/pool.json` serves it (see docs/operations.md for every field).

    Reads the datastore's snapshot, the scheduler's state, flow control and the decision log;
    changes none of them.
    """
    now = clock.now()
    snapshot = datastore.snapshot()
    state = director.scheduler.state
    places: dict[str, _AdapterPlaces] = {}
    by_pod: dict[tuple[str, str], list[EndpointState]] = {}
    for endpoint_state in snapshot.endpoints:
        endpoint = endpoint_state.endpoint
        by_pod.setdefault((endpoint.namespace, endpoint.pod_name), []).append(endpoint_state)
    pool = snapshot.pool
    pods = sorted(
        (pod for pod in datastore.pods() if pool is not None and pod_matches(pool, pod)),
        key=lambda pod: (pod.namespace, pod.name),
    )

    def pod_row(name: str, namespace: str, ip: str, ready: bool, deleting: bool) -> dict[str, object]:
        states = by_pod.pop((namespace, name), [])
        return {
            "name": name,
            "namespace": namespace,
            "ip": ip,
            "ready": ready,
            "deleting": deleting,
            "endpoints": [_endpoint_row(endpoint_state, state, places, now) for endpoint_state in states],
        }

    rows = [
        pod_row(pod.name, pod.namespace, pod.ip, pod.ready and not pod.deleting, pod.deleting) for pod in pods
    ]
    # An endpoint whose pod is not listed (not expected: endpoints come from pods) is shown, not hidden.
    rows.extend(
        pod_row(name, namespace, states[0].endpoint.ip, True, False)
        for (namespace, name), states in sorted(by_pod.items())
    )
    return {
        "version": POOL_VIEW_VERSION,
        "generated_at_s": round(now, 3),
        "pool": None if pool is None else {"name": pool.name, "namespace": pool.namespace},
        "scheduler": director.scheduler.name,
        "staleness_threshold_s": state.staleness_threshold_s,
        "pods": rows,
        "adapters": _adapter_rows(places, state, now),
        "flow_control": flow_control_view(director, datastore, clock),
        "decisions_capacity": decisions.capacity,
        "decisions": [_decision_row(entry) for entry in decisions.recent(decisions_limit)],
    }


def _decision_row(decision: Decision) -> dict[str, object]:
    """A decision without its per-candidate scores (`/debug/decisions` has them): on a large pool
    they are most of a decision's size, and the page shows the outcome, not the arithmetic."""
    return {
        "key": decision.key,
        "request_id": decision.request_id,
        "at_s": decision.at_s,
        "model": decision.model,
        "target_model": decision.target_model,
        "criticality": decision.criticality,
        "outcome": decision.outcome,
        "candidates": len(decision.candidates),
        "chosen": list(decision.chosen),
        "profile": decision.profile,
        "reason": decision.reason,
        "planned_homes": list(decision.planned_homes),
        "duration_s": decision.duration_s,
        "error_code": decision.error_code,
        "response_status": decision.response_status,
        "queue_wait_s": decision.queue_wait_s,
    }


def _endpoint_row(
    endpoint_state: EndpointState, state: SchedulerState, places: dict[str, _AdapterPlaces], now: float
) -> dict[str, object]:
    """One endpoint: its scrape, its modelled tiers and its in-flight requests."""
    name = endpoint_state.name
    metrics = endpoint_state.metrics
    modelled = state.residency.pod(name)
    in_flight_by_adapter: Mapping[str, int] = state.inflight.adapters(name) or {}
    running = metrics.running_adapters if metrics is not None else frozenset()
    waiting = metrics.waiting_adapters if metrics is not None else frozenset()
    gpu = _gpu_entries(modelled, running)
    waiters = set(modelled.waiters) if modelled is not None else set()
    host = list(modelled.cpu) if modelled is not None else []

    def at(adapter: str) -> _AdapterPlaces:
        return places.setdefault(adapter, _AdapterPlaces())

    for adapter in gpu:
        (at(adapter).waiting_for_slot if adapter in waiters else at(adapter).gpu).append(name)
    for adapter in host:
        at(adapter).host.append(name)
    for adapter in sorted(running):
        at(adapter).running_on.append(name)
    for adapter in sorted(waiting):
        at(adapter).waiting_on.append(name)
    for adapter, count in in_flight_by_adapter.items():
        if adapter:  # "" is the base model: it needs no slot
            at(adapter).in_flight[name] = count
    pushed = endpoint_state.adapter_state
    return {
        "name": name,
        "address": endpoint_state.address,
        "fresh": endpoint_state.is_fresh(now, state.staleness_threshold_s),
        "metrics_age_s": None if metrics is None else round(max(0.0, now - metrics.updated_at), 3),
        "scrape_failures": endpoint_state.scrape_failures,
        "last_error": endpoint_state.last_error,
        "slots": metrics.max_lora if metrics is not None else 0,
        "modelled_slots": modelled.slots if modelled is not None else None,
        "gpu": [
            {
                "adapter": adapter,
                "in_flight": in_flight_by_adapter.get(adapter, 0),
                "running": adapter in running,
                "waiting": adapter in waiting,
                "waiting_for_slot": adapter in waiters,
                "planned_home": name in state.plan.planned_homes(adapter),
            }
            for adapter in gpu
        ],
        "host": host,
        "running_adapters": sorted(running),
        "waiting_adapters": sorted(waiting),
        "registered_adapters": sorted(pushed.registered) if pushed is not None else None,
        "running_requests": metrics.running_requests if metrics is not None else None,
        "waiting_requests": metrics.waiting_requests if metrics is not None else None,
        "kv_cache_usage": round(metrics.kv_cache_usage, 4) if metrics is not None else None,
        "in_flight": state.inflight.count(name),
        "in_flight_base": in_flight_by_adapter.get("", 0),
        "in_flight_by_adapter": {
            adapter: count for adapter, count in sorted(in_flight_by_adapter.items()) if adapter
        },
    }


def _gpu_entries(modelled: PodResidency | None, running: frozenset[str]) -> list[str]:
    """The modelled GPU slots, least recently used first, then any adapter the newest scrape shows
    running that the model has not folded in yet (a running adapter holds a GPU slot)."""
    gpu = list(modelled.gpu) if modelled is not None else []
    held = set(gpu)
    gpu.extend(adapter for adapter in sorted(running) if adapter not in held)
    return gpu


def _adapter_rows(
    places: dict[str, _AdapterPlaces], state: SchedulerState, now: float
) -> list[dict[str, object]]:
    return [
        {
            "name": adapter,
            "in_flight": sum(where.in_flight.values()),
            "in_flight_by_endpoint": dict(sorted(where.in_flight.items())),
            "gpu": sorted(where.gpu),
            "host": sorted(where.host),
            "waiting_for_slot": sorted(where.waiting_for_slot),
            "running_on": where.running_on,
            "waiting_on": where.waiting_on,
            "planned_homes": list(state.plan.planned_homes(adapter)),
            "traffic_share": round(state.popularity.share(adapter, now), 4),
        }
        for adapter, where in sorted(places.items())
    ]


def _decisions_limit(request: web.Request, capacity: int) -> int:
    """`?decisions=N` (0..capacity; default DEFAULT_DECISIONS); a bad value is a 400."""
    raw = request.query.get("decisions")
    if raw is None:
        return min(DEFAULT_DECISIONS, capacity)
    try:
        limit = int(raw)
    except ValueError:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": "decisions must be an integer"}), content_type="application/json"
        ) from None
    if not 0 <= limit <= capacity:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": f"decisions must be in 0..{capacity}"}), content_type="application/json"
        )
    return limit


def pool_routes(
    director: Director, datastore: Datastore, decisions: DecisionLog, clock: Clock
) -> tuple[web.RouteDef, web.RouteDef]:
    """`GET /debug/pool.json[?decisions=N]` (the view) and `GET /debug/pool` (the page that shows it)."""

    async def view(request: web.Request) -> web.Response:
        limit = _decisions_limit(request, decisions.capacity)
        body = pool_view(director, datastore, decisions, clock, decisions_limit=limit)
        return web.json_response(
            body, dumps=lambda obj: json.dumps(obj, default=str), headers={"Cache-Control": "no-store"}
        )

    async def page(_: web.Request) -> web.Response:
        return web.Response(
            text=PAGE_HTML,
            content_type="text/html",
            charset="utf-8",
            headers={"Cache-Control": "no-store", "Content-Security-Policy": CONTENT_SECURITY_POLICY},
        )

    return web.get("/debug/pool.json", view), web.get("/debug/pool", page)
