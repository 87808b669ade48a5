"""Active-active replicas found through the Kubernetes API: `epp serve --peer-selector LABELS`.

The replicas are the Pods of the pool's namespace that carry the labels (the chart passes the EPP
Deployment's own selector): each one's IP as soon as the API server has it, Ready or not, so
starting replicas find each other; none that is being deleted or has ended, so a replica that is
shutting down stops receiving batches at once. This needs no cluster DNS and no Service, and only
the `list` on pods the EPP is granted anyway (`epp.kube.watch.API_CALLS`).

A refused or failed list counts as no peers for this round (the exchange looks again at its next
resolve) and is logged; each replica then routes on what it alone knows, as with a DNS name that
does not resolve.
"""

from __future__ import annotations

import logging
from typing import Any

from epp.kube.api import API_ERRORS, AsyncKubeApi, ResourceRef

log = logging.getLogger(__name__)

POD = ResourceRef("v1", "Pod")
API_CALLS: frozenset[tuple[str, str, str]] = frozenset({("", "pods", "list")})
_ENDED = ("Succeeded", "Failed")


class PodAddresses:
    """`await addresses()`: the IPs of the Pods with `selector` in `namespace`, now."""

    def __init__(self, api: AsyncKubeApi, namespace: str, selector: str) -> None:
        self._api = api
        self._namespace = namespace
        self._selector = selector

    async def __call__(self) -> list[str]:
        try:
            pods = await self._api.list(POD, self._namespace, self._selector)
        except API_ERRORS as error:
            log.warning(
                "cannot list the peer replicas' Pods",
                extra={"selector": self._selector, "namespace": self._namespace, "error": str(error)},
            )
            return []
        return replica_ips(pods)


def replica_ips(pods: list[dict[str, Any]]) -> list[str]:
    """The IPs of the Pods that run or start (not deleted, not ended), in order, once each."""
    found: list[str] = []
    for pod in pods:
        status = pod.get("status") or {}
        if (pod.get("metadata") or {}).get("deletionTimestamp") or status.get("phase") in _ENDED:
            continue
        ip = status.get("podIP")
        if ip and ip not in found:
            found.append(str(ip))
    return found
