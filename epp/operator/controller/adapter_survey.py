"""Ask model-server pods which LoRA adapters they have registered (for `status.adapters`).

The catalogue says which adapters may be served; only the pods know which ones they hold
(with `preloadStrategy: demand` an adapter is registered when the first request names it).
Each pod is asked `GET /v1/models` on its model-server port (vLLM lists a registered adapter
as an entry with a `parent`). Pods are asked concurrently on the caller's event loop, at
most `max_concurrent` at a time, each within `timeout_s`; a pod that does not answer in
time, or answers with anything but a model list, counts as holding nothing, so one
unreachable pod never stalls a reconcile for longer than `timeout_s` per `max_concurrent`
pods.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

log = logging.getLogger(__name__)

MODELS_PATH = "/v1/models"
DEFAULT_TIMEOUT_S = 1.0
DEFAULT_MAX_CONCURRENT = 16


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
    """Concurrent `/v1/models` probes on the running event loop.

    Each `survey` opens its own HTTP session and closes it before returning: a survey runs
    once per object per resync, so keeping connections open in between buys little, and
    the survey holds nothing tied to one event loop or that needs closing.
    """

    def __init__(
        self,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
    ) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._max_concurrent = max_concurrent

    async def survey(self, pods: Sequence[PodAddress]) -> dict[str, frozenset[str] | None]:
        """Pod name → registered adapters, or None where the pod gave no usable answer."""
        if not pods:
            return {}
        # The semaphore, not the connector's limit, caps concurrency: a pod waiting for its turn
        # must not spend its own `timeout_s` waiting.
        turns = asyncio.Semaphore(self._max_concurrent)
        connector = aiohttp.TCPConnector(limit=self._max_concurrent, force_close=True)
        async with aiohttp.ClientSession(connector=connector, timeout=self._timeout) as session:
            answers = await asyncio.gather(*(self._ask(session, turns, pod) for pod in pods))
        return {pod.name: answer for pod, answer in zip(pods, answers, strict=True)}

    async def _ask(
        self, session: aiohttp.ClientSession, turns: asyncio.Semaphore, pod: PodAddress
    ) -> frozenset[str] | None:
        try:
            async with turns, session.get(pod.models_url, allow_redirects=False) as response:
                if response.status != 200:
                    log.debug("pod refused", extra={"pod": pod.name, "status": response.status})
                    return None
                body = await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            log.debug("pod did not answer", extra={"pod": pod.name, "error": str(error)})
            return None
        return registered_adapters(body)
