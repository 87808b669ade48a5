"""The hold the composition root plugs into every ext_proc stream when adapters load on demand.

`hold_for_adapter(loader, director, decision)` runs between the director's pick and the
stream's reply. It returns the decision unchanged unless the request's
target is a catalogue adapter; then it awaits the load on the primary endpoint (so only
this stream waits) and keeps as fallbacks only endpoints already running that adapter,
because Envoy's retry on a pod without it would get vLLM's 404. A failed load first
closes the request in the director (so the scheduler's in-flight count for the pod is
released), then propagates as `EppError` (503) for the stream to send as an immediate
response. A client that goes away while it waits closes the request the same way (as 499,
nginx's "client closed request"), or the pod would count it in flight for ever.
"""

from __future__ import annotations

import asyncio
import dataclasses

from epp.errors import EppError
from epp.operator.adapters.loader import AdapterLoader
from epp.picker.director import Director, RoutingDecision

CLIENT_CLOSED_REQUEST = 499


async def hold_for_adapter(
    loader: AdapterLoader, director: Director, decision: RoutingDecision
) -> RoutingDecision:
    adapter = decision.request.target_model
    if not adapter or not loader.manages(adapter):
        return decision
    try:
        await loader.ensure_loaded(decision.primary.address, adapter)
    except EppError as error:
        director.complete(decision, served_address=None, status=error.http_status)
        raise
    except asyncio.CancelledError:
        director.complete(decision, served_address=None, status=CLIENT_CLOSED_REQUEST)
        raise
    fallbacks = tuple(
        state
        for state in decision.endpoints[1:]
        if state.metrics is not None and adapter in state.metrics.active_adapters
    )
    if len(fallbacks) == len(decision.endpoints) - 1:
        return decision
    return dataclasses.replace(decision, endpoints=(decision.primary, *fallbacks))
