"""Ask model-server pods which LoRA adapters they have registered (for `status.adapters`).

The catalogue says which adapters may be served; only the pods know which ones they hold
(with `preloadStrategy: demand` an adapter is registered when the first request names it).
Each pod is asked `GET /v1/models` on its model-server port (vLLM lists a registered adapter
as an entry with a `parent`). Pods are asked concurrently, each with `timeout_s`; a pod that
does not answer in time, or answers with anything but a model list, counts as holding
nothing, so one unreachable pod never stalls a reconcile for longer than `timeout_s` per
`max_workers` pods.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import urllib3

log = logging.getLogger(__name__)

MODELS_PATH = "/v1/models"
DEFAULT_TIMEOUT_S = 1.0
DEFAULT_MAX_WORKERS = 16


@dataclass(frozen=True, slots=True)
class PodAddress:
    name: str
    ip: str
    port: int

    @property
    def models_url(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"http://{host}:{self.port}{MODELS_PATH}"


def ready_model_servers(pods: Sequence[Mapping[str, Any]], default_port: int) -> list[PodAddress]:
    """The pods worth asking: Ready, with an IP, not being deleted.

    The port is the model-server container's port named `http` (what the controller renders),
    else `default_port`.
    """
    ready: list[PodAddress] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        ip = status.get("podIP")
        conditions = status.get("conditions") or []
        is_ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        if not ip or not is_ready or meta.get("deletionTimestamp"):
            continue
        ready.append(PodAddress(str(meta.get("name", ip)), str(ip), _http_port(pod, default_port)))
    return ready


def _http_port(pod: Mapping[str, Any], default_port: int) -> int:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == "http" and isinstance(port.get("containerPort"), int):
                return int(port["containerPort"])
    return default_port


def registered_adapters(body: bytes) -> frozenset[str] | None:
    """Adapter names in a `/v1/models` answer (entries with a `parent`); None if it is not one."""
    try:
        payload: Any = json.loads(body)
    except ValueError:
        return None
    data = payload.get("data") if isinstance(payload, Mapping) else None
    if not isinstance(data, list):
        return None
    return frozenset(
        str(entry["id"])
        for entry in data
        if isinstance(entry, Mapping) and entry.get("parent") and isinstance(entry.get("id"), str)
    )


class AdapterSurvey:
    """Concurrent `/v1/models` probes over one connection pool; safe to share between threads."""

    def __init__(
        self,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_workers: int = DEFAULT_MAX_WORKERS,
    ) -> None:
        self._timeout = urllib3.Timeout(total=timeout_s)
        self._http = urllib3.PoolManager(num_pools=max_workers, maxsize=1, retries=False)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="adapter-survey"
        )

    def survey(self, pods: Sequence[PodAddress]) -> dict[str, frozenset[str] | None]:
        """Pod name → registered adapters, or None where the pod gave no usable answer."""
        futures = {pod.name: self._executor.submit(self._ask, pod) for pod in pods}
        return {name: future.result() for name, future in futures.items()}

    def _ask(self, pod: PodAddress) -> frozenset[str] | None:
        try:
            response = self._http.request("GET", pod.models_url, timeout=self._timeout, redirect=False)
        except (urllib3.exceptions.HTTPError, OSError) as error:
            log.debug("pod did not answer", extra={"pod": pod.name, "error": str(error)})
            return None
        if response.status != 200:
            log.debug("pod refused", extra={"pod": pod.name, "status": response.status})
            return None
        return registered_adapters(response.data)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self._http.clear()
