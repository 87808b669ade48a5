"""One scheduler's learned costs: fed by its own picks and their outcomes, read by its scorers.

`scheduling.costs` holds the arithmetic; this wires it to a scheduler. The first plugin that asks
(`adapter-affinity-scorer` pricing its misses, `load-scorer` with its prefill term,
`predicted-ttft-scorer`) creates the scheduler's
`CostEstimator` with its priors and hooks it to the routing ledger, which hands it each request's
time to first byte as the request ends; every later plugin of that scheduler shares it. Each pick is
noted once per plugin that observes routing: the notes carry the same key and values, so a second
note replaces the first.
"""

from __future__ import annotations

from epp.errors import ConfigError
from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.costs import CostEstimator, CostPriors, Tier
from epp.picker.scheduling.framework import is_base_model
from epp.picker.scheduling.inflight import Flight
from epp.picker.scheduling.state import SchedulerState
from epp.picker.scheduling.types import LLMRequest

_DEFAULT_PRIORS = CostPriors()


def learned_costs(state: SchedulerState, priors: CostPriors) -> CostEstimator:
    """`state`'s estimator, created from `priors` and hooked to its ledger on the first call.

    Plugins are built before any request, so the priors one plugin sets are taken whichever plugin
    asked first; two plugins setting different ones is a config error.
    """
    existing = state.costs
    if existing is not None:
        if priors == existing.priors or priors == _DEFAULT_PRIORS:
            return existing
        if existing.priors == _DEFAULT_PRIORS:
            existing.start_from(priors)
            return existing
        raise ConfigError(
            "two plugins set different cost priors (hitSeconds, perRequestSeconds, hostLoadSeconds, "
            "storageLoadSeconds, priorWeight, alpha): set them on one plugin only"
        )
    estimator = state.costs = CostEstimator(priors)

    def on_outcome(flight: Flight, ttft_s: float | None, now: float) -> None:
        if flight.origin == "":  # a peer's request: its outcome is the peer's to learn from
            estimator.finished(flight.key, flight.endpoint, ttft_s)

    state.ledger.listen_outcomes(on_outcome)
    return estimator


def note_routed(
    state: SchedulerState, estimator: CostEstimator, request: LLMRequest, endpoint: EndpointState
) -> None:
    """Note what the request's observation needs: its pod, the pod's load, where the adapter stood
    (called before the ledger counts the request)."""
    name = endpoint.endpoint.name
    base = is_base_model(request, state, (endpoint,))
    tier = Tier.HIT if base else tier_of(state, name, request.target_model)
    estimator.routed(request.request_id, name, tier, outstanding(state, endpoint))


def tier_of(state: SchedulerState, endpoint: str, adapter: str) -> Tier:
    """Where `adapter` stands on `endpoint` by the residency view and the in-flight counts."""
    pod = state.residency.pods.get(endpoint)
    if pod is not None:
        if adapter in pod.gpu or adapter in pod.observed_active:
            return Tier.HIT
        if adapter in pod.cpu:
            return Tier.HOST
    elif state.inflight.adapter_count(endpoint, adapter) > 0:
        return Tier.HIT
    return Tier.STORAGE


def outstanding(state: SchedulerState, endpoint: EndpointState) -> float:
    """Waiting + running as last scraped, plus what was routed there since (or, unscraped, in flight)."""
    m = endpoint.metrics
    inflight = state.inflight
    if m is None:
        return float(inflight.count(endpoint.endpoint.name))
    since = inflight.routed_since(endpoint.endpoint.name, m.updated_at)
    return float(m.waiting_requests + m.running_requests + since)
