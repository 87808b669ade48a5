"""Reconcile one LLMInferenceService: make its owned objects match the spec, report status.

Idempotent by get + compare + merge-patch: an object is written only when a field we set
differs from what the API server holds (fields the server or other controllers add, such
as defaults or `status`, are left alone), so a second pass over an unchanged object makes
no writes. InferenceModels of adapters removed from the spec are deleted. Deleting the
LLMInferenceService deletes everything through owner references (garbage collection).

Status: `observedGeneration`, `replicas`, `readyReplicas` (model-server pods ready),
`adapters` (`desired`: adapters in the catalogue; `loaded`/`loadedNames`: catalogue adapters
registered on at least one ready model-server pod, asked of the pods by `AdapterSurvey`;
`readyPods`/`reportingPods`; `summary` "loaded/desired" for the printer column), and a
`Ready` condition with reason Available | Progressing | InvalidSpec | ApplyFailed. An
invalid spec or a failed write also gets a Warning Event (once per distinct message) and
changes nothing else.

A reconcile is a coroutine: it waits on the API server (`AsyncKubeApi`) and the pods
(`AdapterSurvey`) without holding the event loop, so other objects' reconciles go on.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from epp.errors import ConfigError
from epp.kube.api import AsyncKubeApi, KubeApiError, ResourceRef, ref_of
from epp.operator.controller.adapter_survey import AdapterSurvey, ready_model_servers
from epp.operator.controller.render import (
    COMPONENT_LABEL,
    MODEL_API_VERSION,
    SERVICE_LABEL,
    Owner,
    RenderSettings,
    desired_objects,
    epp_name,
)
from epp.operator.controller.spec import API_VERSION, KIND, ServiceSpec, parse_spec

log = logging.getLogger(__name__)

Obj = dict[str, Any]
SERVICE_REF = ResourceRef(API_VERSION, KIND)
DEPLOYMENT_REF = ResourceRef("apps/v1", "Deployment")
MODEL_REF = ResourceRef(MODEL_API_VERSION, "InferenceModel")
POD_REF = ResourceRef("v1", "Pod")
READY = "Ready"
COMPONENT = "lora-epp-controller"


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def contains(current: Any, desired: Any) -> bool:
    """True when every field of `desired` is present and equal in `current`.

    Mappings compare key by key (extra keys in `current` are server defaults and ignored; a key
    absent from `current` matches an empty list or mapping, which the API server does not store);
    lists must have the same length and contain each other element-wise.
    """
    if isinstance(desired, Mapping):
        return isinstance(current, Mapping) and all(
            contains(current[key], value) if key in current else _empty(value)
            for key, value in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(current, list)
            and len(current) == len(desired)
            and all(contains(c, d) for c, d in zip(current, desired, strict=True))
        )
    return bool(current == desired)


def _empty(value: Any) -> bool:
    return isinstance(value, (list, Mapping)) and not value


def _patch_for(desired: Mapping[str, Any]) -> Obj:
    """The merge patch that sets our fields: everything but apiVersion/kind and identity."""
    meta = desired["metadata"]
    patch: Obj = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind", "metadata")}
    patch["metadata"] = {"labels": meta["labels"], "ownerReferences": meta["ownerReferences"]}
    return patch


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one reconcile did: `writes` lists `verb kind/name` for every write made."""

    ready: bool
    reason: str
    message: str
    writes: tuple[str, ...]


class Reconciler:
    def __init__(
        self,
        api: AsyncKubeApi,
        settings: RenderSettings | None = None,
        wall_clock: Callable[[], datetime.datetime] = _utc_now,
        survey: AdapterSurvey | None = None,
    ) -> None:
        self._api = api
        self._settings = settings or RenderSettings()
        self._wall_clock = wall_clock
        self._survey = survey or AdapterSurvey()

    async def reconcile_namespace(self, namespace: str) -> dict[str, Outcome]:
        """Reconcile every LLMInferenceService in `namespace`; one failing never stops the rest."""
        outcomes: dict[str, Outcome] = {}
        for obj in await self._api.list(SERVICE_REF, namespace):
            name = str(obj["metadata"]["name"])
            outcomes[name] = await self.reconcile(obj)
        return outcomes

    async def reconcile(self, obj: Mapping[str, Any]) -> Outcome:
        meta = obj["metadata"]
        owner = Owner(str(meta["name"]), str(meta["namespace"]), str(meta["uid"]))
        if meta.get("deletionTimestamp"):
            return Outcome(False, "Deleting", "", ())
        writes: list[str] = []
        try:
            spec = parse_spec(obj.get("spec"))
        except ConfigError as error:
            message = str(error)
            await self._finish(obj, owner, None, "InvalidSpec", message, writes, warn=True)
            return Outcome(False, "InvalidSpec", message, tuple(writes))
        try:
            for desired in desired_objects(owner, spec, self._settings):
                await self._apply(desired, writes)
            await self._prune_models(owner, spec, writes)
        except KubeApiError as error:
            message = f"applying owned objects failed: {error}"
            await self._finish(obj, owner, spec, "ApplyFailed", message, writes, warn=True)
            return Outcome(False, "ApplyFailed", message, tuple(writes))
        ready, reason, message = await self._readiness(owner, spec)
        await self._finish(obj, owner, spec, reason, message, writes, warn=False)
        return Outcome(ready, reason, message, tuple(writes))

    # -- owned objects ---------------------------------------------------------------------

    async def _apply(self, desired: Obj, writes: list[str]) -> None:
        ref = ref_of(desired)
        meta = desired["metadata"]
        current = await self._api.get(ref, meta["namespace"], meta["name"])
        if current is None:
            await self._api.create(desired)
            writes.append(f"create {ref.kind}/{meta['name']}")
            return
        patch = _patch_for(desired)
        if contains(current, patch):
            return
        await self._api.patch(ref, meta["namespace"], meta["name"], patch)
        writes.append(f"patch {ref.kind}/{meta['name']}")

    async def _prune_models(self, owner: Owner, spec: ServiceSpec, writes: list[str]) -> None:
        wanted = {spec.model, *(a.name for a in spec.adapters.items)}
        selector = f"{SERVICE_LABEL}={owner.name},{COMPONENT_LABEL}=model"
        for model in await self._api.list(MODEL_REF, owner.namespace, selector):
            owners = model["metadata"].get("ownerReferences") or []
            if not any(o.get("uid") == owner.uid for o in owners):
                continue  # labelled like ours but not ours: leave it
            if (model.get("spec") or {}).get("modelName") in wanted:
                continue
            name = str(model["metadata"]["name"])
            if await self._api.delete(MODEL_REF, owner.namespace, name):
                writes.append(f"delete InferenceModel/{name}")

    # -- status ----------------------------------------------------------------------------

    async def _readiness(self, owner: Owner, spec: ServiceSpec) -> tuple[bool, str, str]:
        servers = await self._api.get(DEPLOYMENT_REF, owner.namespace, owner.name) or {}
        epp = await self._api.get(DEPLOYMENT_REF, owner.namespace, epp_name(owner)) or {}
        ready_servers = int((servers.get("status") or {}).get("readyReplicas") or 0)
        ready_epp = int((epp.get("status") or {}).get("readyReplicas") or 0)
        if ready_servers >= spec.replicas and ready_epp >= 1:
            return True, "Available", f"{ready_servers}/{spec.replicas} model servers and the EPP are ready"
        return (
            False,
            "Progressing",
            f"{ready_servers}/{spec.replicas} model servers ready, EPP ready: {ready_epp >= 1}",
        )

    async def _finish(
        self,
        obj: Mapping[str, Any],
        owner: Owner,
        spec: ServiceSpec | None,
        reason: str,
        message: str,
        writes: list[str],
        *,
        warn: bool,
    ) -> None:
        status = dict(obj.get("status") or {})
        generation = int(obj["metadata"].get("generation") or 0)
        condition_status = "True" if reason == "Available" else "False"
        old = next((c for c in status.get("conditions") or [] if c.get("type") == READY), None)
        condition = {
            "type": READY,
            "status": condition_status,
            "reason": reason,
            "message": message,
            "observedGeneration": generation,
            "lastTransitionTime": (
                old["lastTransitionTime"]
                if old is not None and old.get("status") == condition_status and old.get("lastTransitionTime")
                else self._wall_clock().strftime("%Y-%m-%dT%H:%M:%SZ")
            ),
        }
        desired: Obj = {"observedGeneration": generation, "conditions": [condition]}
        if spec is not None:
            servers = await self._api.get(DEPLOYMENT_REF, owner.namespace, owner.name) or {}
            desired["replicas"] = spec.replicas
            desired["readyReplicas"] = int((servers.get("status") or {}).get("readyReplicas") or 0)
            adapters = await self._adapter_status(owner, spec)
            if adapters is not None:
                desired["adapters"] = adapters
        if contains(status, desired):
            return
        changed_message = old is None or old.get("message") != message or old.get("reason") != reason
        try:
            await self._api.patch_status(SERVICE_REF, owner.namespace, owner.name, desired)
            writes.append(f"patch {KIND}/{owner.name}/status")
        except KubeApiError as error:
            log.warning("status update failed", extra={"object": owner.name, "error": str(error)})
        if warn and changed_message:
            await self._warn(owner, reason, message, writes)

    async def _adapter_status(self, owner: Owner, spec: ServiceSpec) -> Obj | None:
        """What the ready model-server pods hold of the catalogue; None if pods cannot be listed."""
        selector = f"{SERVICE_LABEL}={owner.name},{COMPONENT_LABEL}=model-server"
        try:
            pods = await self._api.list(POD_REF, owner.namespace, selector)
        except KubeApiError as error:
            log.warning("listing model-server pods failed", extra={"object": owner.name, "error": str(error)})
            return None
        servers = ready_model_servers(pods, self._settings.model_port)
        answers = await self._survey.survey(servers)
        registered: set[str] = set()
        for adapters in answers.values():
            registered |= adapters or frozenset()
        catalogue = [a.name for a in spec.adapters.items]
        loaded = [name for name in catalogue if name in registered]
        return {
            "desired": len(catalogue),
            "loaded": len(loaded),
            "loadedNames": loaded,
            "readyPods": len(servers),
            "reportingPods": sum(1 for adapters in answers.values() if adapters is not None),
            "summary": f"{len(loaded)}/{len(catalogue)}",
        }

    async def _warn(self, owner: Owner, reason: str, message: str, writes: list[str]) -> None:
        now = self._wall_clock().strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{owner.name}.", "namespace": owner.namespace},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": owner.name,
                "namespace": owner.namespace,
                "uid": owner.uid,
            },
            "type": "Warning",
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._api.create(event)
            writes.append(f"create Event/{reason}")
        except KubeApiError as error:
            log.warning("event not recorded", extra={"object": owner.name, "error": str(error)})
        log.warning("reconcile failed", extra={"object": owner.name, "reason": reason, "detail": message})
