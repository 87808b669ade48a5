"""The datastore: the pool, its pods and models, and each endpoint's newest metrics.

Sources (file, Kubernetes) and metrics refreshers write; requests read one immutable
`Snapshot`. Only code on the event loop calls the mutating methods.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from epp.clock import Clock
from epp.picker.datastore.types import (
    AdapterState,
    Endpoint,
    EndpointState,
    InferenceModel,
    InferenceObjective,
    Metrics,
    PodInfo,
    Pool,
    Snapshot,
    with_adapter_state,
)

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """Whether an InferenceModel won its modelName, for the status the Kubernetes source writes."""

    model: InferenceModel
    accepted: bool
    reason: str  # "Accepted" or "ModelNameInUse"
    message: str


def pod_matches(pool: Pool, pod: PodInfo) -> bool:
    if pod.namespace != pool.namespace:
        return False
    return all(pod.labels.get(k) == v for k, v in pool.selector.items())


def endpoints_for_pod(pool: Pool, pod: PodInfo) -> list[Endpoint]:
    """One endpoint per (active) target port of a Ready, not-deleting pod with an IP."""
    if not pod.ready or pod.deleting or not pod.ip or not pod_matches(pool, pod):
        return []
    endpoints = []
    for rank, port in enumerate(pool.target_ports):
        if pod.active_ports is not None and port not in pod.active_ports:
            continue
        endpoints.append(
            Endpoint(
                name=f"{pod.name}-rank-{rank}",
                pod_name=pod.name,
                namespace=pod.namespace,
                ip=pod.ip,
                port=port,
                labels=pod.labels,
            )
        )
    return endpoints


class Datastore:
    """Holds the pool state; publishes snapshots and endpoint-set changes."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._pool: Pool | None = None
        self._pods: dict[Key, PodInfo] = {}
        self._endpoints: dict[str, EndpointState] = {}
        # The newest scrape per endpoint as parsed; `EndpointState.metrics` is this merged with
        # the endpoint's push state, so losing the push falls back to it at once.
        self._scraped: dict[str, Metrics] = {}
        self._models: dict[Key, InferenceModel] = {}
        self._objectives: dict[Key, InferenceObjective] = {}
        self._winners: Mapping[str, InferenceModel] = MappingProxyType({})
        self._objectives_by_name: Mapping[str, InferenceObjective] = MappingProxyType({})
        self._snapshot: Snapshot | None = None
        self._version = 0
        self._endpoint_listeners: list[Callable[[], None]] = []
        self._model_listeners: list[Callable[[], None]] = []

    # -- subscriptions ---------------------------------------------------------------------

    def on_endpoints_changed(self, callback: Callable[[], None]) -> None:
        """Call `callback` (on the loop, synchronously) whenever the endpoint set changes."""
        self._endpoint_listeners.append(callback)

    def on_models_changed(self, callback: Callable[[], None]) -> None:
        self._model_listeners.append(callback)

    # -- pool ------------------------------------------------------------------------------

    @property
    def pool(self) -> Pool | None:
        return self._pool

    @property
    def pool_synced(self) -> bool:
        """True once an InferencePool has been read (readiness waits for this)."""
        return self._pool is not None

    def set_pool(self, pool: Pool | None) -> None:
        """Set, replace or clear (None: pool deleted) the pool; endpoints are recomputed."""
        self._pool = pool
        self._recompute_endpoints()
        self._recompute_models()

    # -- pods ------------------------------------------------------------------------------

    def upsert_pod(self, pod: PodInfo) -> None:
        self._pods[(pod.namespace, pod.name)] = pod
        self._recompute_endpoints()

    def delete_pod(self, namespace: str, name: str) -> None:
        if self._pods.pop((namespace, name), None) is not None:
            self._recompute_endpoints()

    def replace_pods(self, pods: Iterable[PodInfo]) -> None:
        """Resync: the given pods are now the whole set (after a relist or a file reload)."""
        self._pods = {(p.namespace, p.name): p for p in pods}
        self._recompute_endpoints()

    def pods(self) -> tuple[PodInfo, ...]:
        return tuple(self._pods.values())

    # -- models and objectives -------------------------------------------------------------

    def upsert_model(self, model: InferenceModel) -> None:
        self._models[(model.namespace, model.name)] = model
        self._recompute_models()

    def delete_model(self, namespace: str, name: str) -> None:
        if self._models.pop((namespace, name), None) is not None:
            self._recompute_models()

    def replace_models(self, models: Iterable[InferenceModel]) -> None:
        self._models = {(m.namespace, m.name): m for m in models}
        self._recompute_models()

    def upsert_objective(self, objective: InferenceObjective) -> None:
        self._objectives[(objective.namespace, objective.name)] = objective
        self._recompute_models()

    def delete_objective(self, namespace: str, name: str) -> None:
        if self._objectives.pop((namespace, name), None) is not None:
            self._recompute_models()

    def replace_objectives(self, objectives: Iterable[InferenceObjective]) -> None:
        self._objectives = {(o.namespace, o.name): o for o in objectives}
        self._recompute_models()

    def model_statuses(self) -> list[ModelStatus]:
        """Accepted / ModelNameInUse for every InferenceModel that references this pool."""
        statuses = []
        for model in self._models.values():
            if not self._references_pool(model.namespace, model.pool_name):
                continue
            winner = self._winners.get(model.model_name)
            if winner is not None and (winner.namespace, winner.name) == (model.namespace, model.name):
                statuses.append(ModelStatus(model, True, "Accepted", "accepted by the endpoint picker"))
            else:
                other = winner.name if winner is not None else "another InferenceModel"
                statuses.append(
                    ModelStatus(
                        model,
                        False,
                        "ModelNameInUse",
                        f"modelName {model.model_name!r} is already served by InferenceModel {other!r}",
                    )
                )
        return statuses

    # -- metrics ---------------------------------------------------------------------------

    def endpoints(self) -> tuple[Endpoint, ...]:
        return tuple(state.endpoint for state in self._endpoints.values())

    def update_metrics(self, endpoint_name: str, metrics: Metrics) -> None:
        """Record a successful scrape; ignored if the endpoint is gone."""
        state = self._endpoints.get(endpoint_name)
        if state is None:
            return
        self._scraped[endpoint_name] = metrics
        pushed = state.adapter_state
        merged = metrics if pushed is None else with_adapter_state(metrics, pushed)
        self._endpoints[endpoint_name] = replace(state, metrics=merged, scrape_failures=0, last_error="")
        self._invalidate()

    def set_adapter_state(self, endpoint_name: str, pushed: AdapterState | None) -> None:
        """Record the endpoint's pushed adapter state, or None when its sidecar stream is gone.

        Ignored if the endpoint is gone. The endpoint's metrics become the newest scrape merged
        with `pushed` (see `with_adapter_state`); None restores the plain scrape.
        """
        state = self._endpoints.get(endpoint_name)
        if state is None or (pushed is None and state.adapter_state is None):
            return
        scraped = self._scraped.get(endpoint_name)
        merged = scraped if scraped is None or pushed is None else with_adapter_state(scraped, pushed)
        self._endpoints[endpoint_name] = replace(state, metrics=merged, adapter_state=pushed)
        self._invalidate()

    def record_scrape_failure(self, endpoint_name: str, error: str) -> None:
        """Count a failed scrape; the previous metrics are kept but the endpoint reads as stale."""
        state = self._endpoints.get(endpoint_name)
        if state is None:
            return
        self._endpoints[endpoint_name] = replace(
            state, scrape_failures=state.scrape_failures + 1, last_error=error
        )
        self._invalidate()

    # -- snapshot --------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The current state; cached until something changes (cheap to call per request)."""
        if self._snapshot is None:
            self._version += 1
            self._snapshot = Snapshot(
                pool=self._pool,
                endpoints=tuple(self._endpoints.values()),
                models=self._winners,
                objectives=self._objectives_by_name,
                taken_at=self._clock.now(),
                version=self._version,
            )
        return self._snapshot

    # -- internals -------------------------------------------------------------------------

    def _invalidate(self) -> None:
        self._snapshot = None

    def _references_pool(self, namespace: str, pool_name: str) -> bool:
        pool = self._pool
        return pool is not None and pool.namespace == namespace and pool.name == pool_name

    def _recompute_endpoints(self) -> None:
        wanted: dict[str, Endpoint] = {}
        if self._pool is not None:
            for pod in self._pods.values():
                for endpoint in endpoints_for_pod(self._pool, pod):
                    wanted[endpoint.name] = endpoint
        current = {name: state.endpoint for name, state in self._endpoints.items()}
        if wanted == current:
            return
        updated: dict[str, EndpointState] = {}
        for name, endpoint in wanted.items():
            old = self._endpoints.get(name)
            if old is not None and old.endpoint == endpoint:
                # Same address: keep its metrics (labels may have changed).
                updated[name] = replace(old, endpoint=endpoint)
            else:
                updated[name] = EndpointState(endpoint=endpoint)
                self._scraped.pop(name, None)
        self._endpoints = updated
        for name in [n for n in self._scraped if n not in updated]:
            del self._scraped[name]
        self._invalidate()
        log.info("endpoints changed", extra={"endpoints": sorted(e.address for e in wanted.values())})
        for callback in self._endpoint_listeners:
            callback()

    def _recompute_models(self) -> None:
        winners: dict[str, InferenceModel] = {}
        for model in sorted(self._models.values(), key=lambda m: (m.creation_timestamp, m.namespace, m.name)):
            if self._references_pool(model.namespace, model.pool_name):
                winners.setdefault(model.model_name, model)
        objectives = {
            o.name: o for o in self._objectives.values() if self._references_pool(o.namespace, o.pool_name)
        }
        self._winners = MappingProxyType(winners)
        self._objectives_by_name = MappingProxyType(objectives)
        self._invalidate()
        for callback in self._model_listeners:
            callback()
