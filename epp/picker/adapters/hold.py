"""The hold the composition root plugs into every ext_proc stream when adapters load on demand.

`hold_for_adapter(loader, life)` runs between a request's dispatch and its stream's reply, a wait
in the request's own lifecycle. It does nothing unless the request's target is a catalogue
adapter; then it awaits the load on the primary endpoint (so only this stream waits) and keeps as
fallbacks only endpoints already running that adapter, because Envoy's retry on a pod without it
would get vLLM's 404. A failed load propagates as `EppError` (503) for the stream to answer; the
request's finish then releases its in-flight count, as it does when the client leaves meanwhile.
"""

from __future__ import annotations

import dataclasses

from epp.picker.adapters.loader import AdapterLoader
from epp.picker.lifecycle import RequestLife


async def hold_for_adapter(loader: AdapterLoader, life: RequestLife) -> None:
    decision = life.decision
    assert decision is not None
    adapter = decision.request.target_model
    if not adapter or not loader.manages(adapter):
        return
    await loader.ensure_loaded(decision.primary.address, adapter)
    fallbacks = tuple(
        state
        for state in decision.endpoints[1:]
        if state.metrics is not None and adapter in state.metrics.active_adapters
    )
    if len(fallbacks) != len(decision.endpoints) - 1:
        life.decision = dataclasses.replace(decision, endpoints=(decision.primary, *fallbacks))
