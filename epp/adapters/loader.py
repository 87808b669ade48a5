"""On-demand LoRA loading: make sure a model-server pod has an adapter before routing to it.

`AdapterLoader.ensure_loaded(address, adapter)` is awaited by the ext_proc stream after the
director has picked `address` and before the routing headers go back to Envoy, so
scheduling stays pure and only this request's stream waits; other streams run on.

- One load per (pod, adapter) at a time: the first caller starts a task, every concurrent
  caller awaits the same task (a single-flight future). The task is shielded, so a client
  that goes away does not cancel a load other requests wait on. When it finishes the entry
  is dropped: a failed load is retried by the next request, not cached.
- A load is `GET /v1/models` (already registered there, e.g. a static `--lora-modules`
  adapter or one loaded earlier: done) then `POST /v1/load_lora_adapter` with the path from
  the catalogue. vLLM's 400 "has already been loaded" counts as success (someone else won
  the race). A success is remembered for `remember_s`, so the hot path does no I/O.
- Adapters not in the catalogue are not ours to load: `ensure_loaded` returns None and the
  request is routed as before (a static adapter, or the base model).
- Failures are `EppError`s the stream turns into the client's reply: 503
  `adapter-load-failed` (the server refused or is unreachable; its own message quoted) or
  `adapter-load-timeout`. Nothing else changes: other requests and other adapters go on.

Unloading cold adapters is `unload(address, adapter)`; when to call it follows the
residency model (`epp.scheduling.residency`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp

from epp.adapters.catalog import Catalog
from epp.clock import Clock
from epp.errors import EppError, ErrorCode

log = logging.getLogger(__name__)

LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"
MODELS_PATH = "/v1/models"
ALREADY_LOADED = "has already been loaded"
REASON_FAILED = "adapter-load-failed"
REASON_TIMEOUT = "adapter-load-timeout"

Key = tuple[str, str]  # (pod address "ip:port", adapter name)


@dataclass(frozen=True, slots=True)
class LoadResult:
    """An adapter is registered on a pod; `loaded_now` is True when this call loaded it."""

    address: str
    adapter: str
    loaded_now: bool
    duration_s: float


class AdapterLoader:
    """Loads catalogue adapters onto pods through vLLM's runtime LoRA API (see module doc)."""

    def __init__(
        self,
        catalog: Callable[[], Catalog],
        *,
        clock: Clock,
        load_timeout_s: float = 120.0,
        remember_s: float = 30.0,
        scheme: str = "http",
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self._catalog = catalog
        self._clock = clock
        self._load_timeout_s = load_timeout_s
        self._remember_s = remember_s
        self._scheme = scheme
        self._session = session
        self._owns_session = session is None
        self._inflight: dict[Key, asyncio.Task[LoadResult]] = {}
        self._loaded_at: dict[Key, float] = {}
        self.loads_started = 0  # POST /v1/load_lora_adapter calls made (for metrics and tests)

    def manages(self, adapter: str) -> bool:
        """True when `adapter` is in the catalogue (so requests for it may wait for a load)."""
        return self._catalog().path_of(adapter) is not None

    def is_loading(self, address: str, adapter: str) -> bool:
        return (address, adapter) in self._inflight

    async def ensure_loaded(self, address: str, adapter: str) -> LoadResult | None:
        """Return once `adapter` is registered on the pod at `address`; None if not a catalogue adapter.

        Raises `EppError` (503) when the load fails or times out.
        """
        path = self._catalog().path_of(adapter)
        if path is None:
            return None
        key = (address, adapter)
        loaded_at = self._loaded_at.get(key)
        if loaded_at is not None and self._clock.now() - loaded_at < self._remember_s:
            return LoadResult(address, adapter, loaded_now=False, duration_s=0.0)
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._load(key, path))
            self._inflight[key] = task
            task.add_done_callback(functools.partial(self._finished, key))
        return await asyncio.shield(task)

    def _finished(self, key: Key, task: asyncio.Task[LoadResult]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved here so a load no one awaits any more is not logged as lost

    async def preload(self, addresses: Iterable[str]) -> list[LoadResult | EppError]:
        """Load every catalogue adapter on every pod (preloadStrategy `all`); one result per pair."""
        pairs = [(a, name) for a in addresses for name in self._catalog().paths]

        async def one(address: str, adapter: str) -> LoadResult | EppError:
            try:
                result = await self.ensure_loaded(address, adapter)
            except EppError as error:
                return error
            assert result is not None  # every name comes from the catalogue
            return result

        return list(await asyncio.gather(*(one(a, n) for a, n in pairs)))

    async def unload(self, address: str, adapter: str) -> bool:
        """Unregister an adapter on a pod; False when it was not registered there."""
        self._loaded_at.pop((address, adapter), None)
        status, text = await self._post(address, UNLOAD_PATH, {"lora_name": adapter})
        if status == 404:
            return False
        if status != 200:
            raise self._failure(address, adapter, status, text)
        return True

    def forget(self, address: str) -> None:
        """A pod went away or restarted: whatever we loaded there is gone."""
        for key in [k for k in self._loaded_at if k[0] == address]:
            del self._loaded_at[key]

    async def close(self) -> None:
        for task in list(self._inflight.values()):
            task.cancel()
        if self._session is not None and self._owns_session:
            await self._session.close()
        self._session = None

    # -- one load ----------------------------------------------------------------------------

    async def _load(self, key: Key, path: str) -> LoadResult:
        address, adapter = key
        started = self._clock.now()
        try:
            async with asyncio.timeout(self._load_timeout_s):
                loaded_now = False
                if adapter not in await self._registered(address):
                    loaded_now = await self._post_load(address, adapter, path)
        except TimeoutError:
            log.warning("adapter load timed out", extra={"address": address, "adapter": adapter})
            raise EppError(
                ErrorCode.SERVICE_UNAVAILABLE,
                f"loading adapter {adapter!r} on {address} took longer than {self._load_timeout_s:g}s",
                reason=REASON_TIMEOUT,
            ) from None
        now = self._clock.now()
        self._loaded_at[key] = now
        if loaded_now:
            log.info(
                "adapter loaded",
                extra={"address": address, "adapter": adapter, "duration_s": round(now - started, 3)},
            )
        return LoadResult(address, adapter, loaded_now=loaded_now, duration_s=now - started)

    async def _registered(self, address: str) -> frozenset[str]:
        """Model ids the pod serves now (base and adapters); empty if it cannot tell."""
        try:
            async with self._http().get(self._url(address, MODELS_PATH)) as response:
                if response.status != 200:
                    return frozenset()
                payload: Any = await response.json(content_type=None)
        except (aiohttp.ClientError, ValueError):
            return frozenset()  # the load itself will report what is wrong
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list):
            return frozenset()
        return frozenset(str(m.get("id")) for m in data if isinstance(m, dict))

    async def _post_load(self, address: str, adapter: str, path: str) -> bool:
        self.loads_started += 1
        body = {"lora_name": adapter, "lora_path": path, "load_inplace": False}
        status, text = await self._post(address, LOAD_PATH, body)
        if status == 200:
            return True
        if status == 400 and ALREADY_LOADED in text:
            return False
        raise self._failure(address, adapter, status, text)

    async def _post(self, address: str, route: str, body: dict[str, Any]) -> tuple[int, str]:
        try:
            async with self._http().post(self._url(address, route), json=body) as response:
                return response.status, await response.text()
        except aiohttp.ClientError as error:
            log.warning(
                "model server unreachable for an adapter call",
                extra={"address": address, "route": route, "error": str(error)},
            )
            raise EppError(
                ErrorCode.SERVICE_UNAVAILABLE,
                f"adapter call {route} to {address} failed: {error}",
                reason=REASON_FAILED,
            ) from error

    @staticmethod
    def _failure(address: str, adapter: str, status: int, text: str) -> EppError:
        message = server_message(text)
        if status == 404 and message == "Not Found":
            message = "runtime LoRA updating is disabled (set VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)"
        log.warning(
            "adapter call refused",
            extra={"address": address, "adapter": adapter, "status": status, "detail": message},
        )
        return EppError(
            ErrorCode.SERVICE_UNAVAILABLE,
            f"adapter {adapter!r} could not be loaded on {address}: HTTP {status}: {message}",
            reason=REASON_FAILED,
        )

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=5))
            self._owns_session = True
        return self._session

    def _url(self, address: str, route: str) -> str:
        return f"{self._scheme}://{address}{route}"


def server_message(text: str) -> str:
    """vLLM's error message from its JSON body (`error.message` or `detail`), else the text."""
    try:
        payload: Any = json.loads(text)
    except ValueError:
        return text.strip()[:500]
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:500]
        if isinstance(payload.get("detail"), str):
            return str(payload["detail"])
    return text.strip()[:500]
