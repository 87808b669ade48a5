"""Leader election with a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does.

Every `retry_period_s` each replica reads the Lease. It takes the Lease when it is free
(no holder) or expired (its holder has not renewed it for `leaseDurationSeconds`, measured
on our own clock from when we last saw the record change, so clock skew between replicas
does not matter). The leader renews; if it cannot renew for `renew_deadline_s`, it steps
down. Writes carry the resourceVersion they read, so two replicas racing for the Lease
cannot both win (the API server answers 409 to the loser). On cancellation the leader
releases the Lease (holder cleared), so another replica takes over at its next retry.

Every API call goes through `API_CALLS`, which the RBAC Role is checked against.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from epp.clock import Clock
from epp.kube.api import load_api_client

log = logging.getLogger(__name__)

GROUP = "coordination.k8s.io"
API_CALLS: frozenset[tuple[str, str, str]] = frozenset(
    {(GROUP, "leases", "get"), (GROUP, "leases", "create"), (GROUP, "leases", "update")}
)
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409


def lease_name_for(pool_namespace: str, pool_name: str) -> str:
    """The Lease name upstream's EPP uses for a pool."""
    return f"epp-{pool_namespace}-{pool_name}.gateway-api-inference-extension.sigs.k8s.io"


def _micro_time(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _lease(body: dict[str, Any]) -> k8s.V1Lease:
    lease = k8s.V1Lease.from_dict(body)
    if lease is None:
        raise _LeaseError("cannot build the Lease body")
    return lease


class _LeaseError(Exception):
    """The Lease could not be read or written this round."""


@dataclass(frozen=True, slots=True)
class LeaseClaim:
    """Which Lease we campaign for, and the identity we write into it as holder.

    Every replica of one pool names the same Lease and a different identity (its pod name).
    """

    name: str
    namespace: str
    identity: str


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """client-go's leader-election timing (same defaults), plus the timeout of one API call.

    A Lease is held for `lease_duration_s`; the leader steps down if it cannot renew for
    `renew_deadline_s`; every replica tries again each `retry_period_s`.
    """

    lease_duration_s: float = 15
    renew_deadline_s: float = 10
    retry_period_s: float = 2
    request_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            # Bad values would let two replicas lead at once; client-go refuses them too.
            raise ValueError("need retry_period_s < renew_deadline_s < lease_duration_s")


class LeaderElector:
    """Campaigns for one Lease until cancelled; `is_leader` says whether we hold it now."""

    def __init__(
        self,
        *,
        claim: LeaseClaim,
        kubeconfig: str | None,
        clock: Clock,
        timing: LeaseTiming = LeaseTiming(),
        api_client: k8s.ApiClient | None = None,
        wall_clock: Callable[[], datetime.datetime] = _utc_now,
    ) -> None:
        self._claim = claim
        self._kubeconfig = kubeconfig
        self._clock = clock
        self._timing = timing
        self._api_client = api_client
        self._wall_clock = wall_clock
        self._is_leader = False
        self._callbacks: list[Callable[[bool], None]] = []
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._last_renew_at = 0.0

    @property
    def is_leader(self) -> bool:
        return self._is_leader

    def on_change(self, callback: Callable[[bool], None]) -> None:
        """Call `callback(is_leader)` on the loop whenever leadership is gained or lost."""
        self._callbacks.append(callback)

    async def run(self) -> None:
        if self._api_client is None:
            self._api_client = await asyncio.to_thread(load_api_client, self._kubeconfig)
        self._api = k8s.CoordinationV1Api(self._api_client)
        try:
            while True:
                try:
                    held = await asyncio.to_thread(self._try_acquire_or_renew)
                except _LeaseError as error:
                    log.warning("lease round failed", extra={"lease": self._claim.name, "error": str(error)})
                    held = self._is_leader and (
                        self._clock.now() - self._last_renew_at < self._timing.renew_deadline_s
                    )
                else:
                    if held:
                        self._last_renew_at = self._clock.now()
                self._set_leader(held)
                await self._clock.sleep(self._timing.retry_period_s)
        finally:
            if self._is_leader:
                self._set_leader(False)
                try:
                    await asyncio.to_thread(self._release)
                except _LeaseError as error:
                    log.warning(
                        "lease release failed", extra={"lease": self._claim.name, "error": str(error)}
                    )

    def _set_leader(self, leader: bool) -> None:
        if leader == self._is_leader:
            return
        self._is_leader = leader
        log.info(
            "leadership changed",
            extra={"lease": self._claim.name, "identity": self._claim.identity, "leader": leader},
        )
        for callback in self._callbacks:
            callback(leader)

    # -- one round (runs in a worker thread; touches no loop state but the observed record) --

    def _call(self, verb: str, call: Callable[[], Any]) -> Any:
        if (GROUP, "leases", verb) not in API_CALLS:
            raise AssertionError(f"lease call {verb!r} is missing from API_CALLS")
        try:
            response = call()
        except ApiException as error:
            if (error.status == HTTP_NOT_FOUND and verb == "get") or error.status == HTTP_CONFLICT:
                return None  # no Lease yet / someone else wrote first
            raise _LeaseError(f"{verb}: HTTP {error.status} {error.reason}") from error
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise _LeaseError(f"{verb}: {error}") from error
        try:
            return json.loads(response.data)
        except ValueError as error:
            raise _LeaseError(f"{verb}: unreadable response") from error

    def _get(self) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self._call(
            "get",
            lambda: self._api.read_namespaced_lease(
                self._claim.name,
                self._claim.namespace,
                _preload_content=False,
                _request_timeout=self._timing.request_timeout_s,
            ),
        )
        return result

    def _spec(self, *, acquire_time: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self._claim.identity,
            "leaseDurationSeconds": max(1, round(self._timing.lease_duration_s)),
            "acquireTime": acquire_time,
            "renewTime": _micro_time(self._wall_clock()),
            "leaseTransitions": transitions,
        }

    def _try_acquire_or_renew(self) -> bool:
        now = self._clock.now()
        lease = self._get()
        if lease is None:
            body = {
                "apiVersion": f"{GROUP}/v1",
                "kind": "Lease",
                "metadata": {"name": self._claim.name, "namespace": self._claim.namespace},
                "spec": self._spec(acquire_time=_micro_time(self._wall_clock()), transitions=0),
            }
            created = self._call(
                "create",
                lambda: self._api.create_namespaced_lease(
                    self._claim.namespace,
                    _lease(body),
                    _preload_content=False,
                    _request_timeout=self._timing.request_timeout_s,
                ),
            )
            return created is not None
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, str(spec.get("renewTime") or ""))
        if record != self._observed:
            self._observed = record
            self._observed_at = now
        duration_s = float(spec.get("leaseDurationSeconds") or self._timing.lease_duration_s)
        if holder and holder != self._claim.identity and now - self._observed_at < duration_s:
            return False  # held by a live leader
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self._claim.identity:
            acquire_time = str(spec.get("acquireTime") or _micro_time(self._wall_clock()))
        else:
            acquire_time = _micro_time(self._wall_clock())
            transitions += 1
        lease["spec"] = self._spec(acquire_time=acquire_time, transitions=transitions)
        updated = self._call(
            "update",
            lambda: self._api.replace_namespaced_lease(
                self._claim.name,
                self._claim.namespace,
                _lease(lease),
                _preload_content=False,
                _request_timeout=self._timing.request_timeout_s,
            ),
        )
        if updated is None:
            return False  # another replica wrote first
        new_spec = updated.get("spec") or {}
        self._observed = (self._claim.identity, str(new_spec.get("renewTime") or ""))
        self._observed_at = now
        return True

    def _release(self) -> None:
        """Clear the holder so the next replica need not wait out the lease."""
        lease = self._get()
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self._claim.identity:
            return
        spec = dict(lease.get("spec") or {})
        spec.update(
            {"holderIdentity": None, "leaseDurationSeconds": 1, "renewTime": _micro_time(self._wall_clock())}
        )
        lease["spec"] = spec
        self._call(
            "update",
            lambda: self._api.replace_namespaced_lease(
                self._claim.name,
                self._claim.namespace,
                _lease(lease),
                _preload_content=False,
                _request_timeout=self._timing.request_timeout_s,
            ),
        )
        log.info("lease released", extra={"lease": self._claim.name, "identity": self._claim.identity})
