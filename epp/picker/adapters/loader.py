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

- With sidecar push state (`pods`, see `epp.picker.adapters.push`) the pod's registered set comes
  from its last pushed State (a registered adapter costs no I/O at all), and loads and
  unloads go through the sidecar's `Load`/`Unload` while its stream is up, else over HTTP.

The loader remembers which adapters it loaded itself (`owned()`: on demand or by preload)
and when a request for each was last routed to each pod (`last_routed`); adapters a pod
already had (static `--lora-modules`, or loaded by anyone else) are never owned, so the
cold-adapter unloader (`epp.picker.adapters.unload`) never touches them. A request that arrives
while its adapter is being unloaded from its pod waits for the unload, then loads it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, Protocol

import aiohttp

from epp.clock import Clock
from epp.errors import EppError, ErrorCode
from epp.picker.adapters.catalog import Catalog
from epp.picker.datastore.types import AdapterState

log = logging.getLogger(__name__)

LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"
MODELS_PATH = "/v1/models"
ALREADY_LOADED = "has already been loaded"
REASON_FAILED = "adapter-load-failed"
REASON_TIMEOUT = "adapter-load-timeout"

Key = tuple[str, str]  # (pod address "ip:port", adapter name)
Origin = Literal["demand", "preload"]


class SidecarCallError(Exception):
    """The pod's sidecar answered a Load/Unload with an error (its gRPC code and message)."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


class PodAdapterSource(Protocol):
    """Per-pod push state and calls (an `AdapterStatePush`); None/None answers mean "use HTTP"."""

    def state(self, address: str) -> AdapterState | None: ...

    async def load(self, address: str, adapter: str, path: str) -> bool | None: ...

    async def unload(self, address: str, adapter: str) -> bool | None: ...


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
        unload_timeout_s: float = 30.0,
        remember_s: float = 30.0,
        scheme: str = "http",
        session: aiohttp.ClientSession | None = None,
        pods: PodAdapterSource | None = None,
    ) -> None:
        self._catalog = catalog
        self._pods = pods
        self._clock = clock
        self._load_timeout_s = load_timeout_s
        self._unload_timeout_s = unload_timeout_s
        self._remember_s = remember_s
        self._scheme = scheme
        self._session = session
        self._owns_session = session is None
        self._inflight: dict[Key, asyncio.Task[LoadResult]] = {}
        self._unloading: dict[Key, asyncio.Task[bool]] = {}
        self._loaded_at: dict[Key, float] = {}
        self._owned: dict[Key, Origin] = {}  # adapters this loader registered itself
        self._last_routed: dict[Key, float] = {}  # bounded by pods x catalogue adapters
        self.loads_started = 0  # load calls made, HTTP or sidecar (for metrics and tests)
        self.sidecar_loads = 0  # of those, through the pod's sidecar
        self.registered_hits = 0  # requests answered from push state with no I/O

    @property
    def catalog(self) -> Catalog:
        return self._catalog()

    def manages(self, adapter: str) -> bool:
        """True when `adapter` is in the catalogue (so requests for it may wait for a load)."""
        return self._catalog().path_of(adapter) is not None

    def is_loading(self, address: str, adapter: str) -> bool:
        return (address, adapter) in self._inflight

    def is_unloading(self, address: str, adapter: str) -> bool:
        return (address, adapter) in self._unloading

    def owned(self) -> Mapping[Key, Origin]:
        """(address, adapter) → how this loader registered it, for adapters it loaded itself."""
        return MappingProxyType(self._owned)

    def last_routed(self, address: str, adapter: str) -> float | None:
        """Clock time a request for `adapter` was last held for `address`; None if never."""
        return self._last_routed.get((address, adapter))

    def pushed(self, address: str) -> AdapterState | None:
        return self._pods.state(address) if self._pods is not None else None

    async def ensure_loaded(self, address: str, adapter: str, *, preload: bool = False) -> LoadResult | None:
        """Return once `adapter` is registered on the pod at `address`; None if not a catalogue adapter.

        `preload` marks a background preload: it does not count as a request for the adapter.
        Raises `EppError` (503) when the load fails or times out.
        """
        path = self._catalog().path_of(adapter)
        if path is None:
            return None
        key = (address, adapter)
        now = self._clock.now()
        if not preload:
            self._last_routed[key] = now
        unloading = self._unloading.get(key)
        if unloading is not None:
            with contextlib.suppress(EppError):
                await asyncio.shield(unloading)
        elif key not in self._inflight:
            pushed = self.pushed(address)
            if pushed is not None and adapter in pushed.registered:
                self.registered_hits += 1
                return LoadResult(address, adapter, loaded_now=False, duration_s=0.0)
            loaded_at = self._loaded_at.get(key)
            # A push that arrived after our load and lacks the adapter means someone unloaded it.
            if (
                loaded_at is not None
                and now - loaded_at < self._remember_s
                and (pushed is None or pushed.received_at <= loaded_at)
            ):
                return LoadResult(address, adapter, loaded_now=False, duration_s=0.0)
        task = self._inflight.get(key)
        if task is None:
            origin: Origin = "preload" if preload else "demand"
            trust_push = unloading is None
            task = asyncio.get_running_loop().create_task(self._load(key, path, origin, trust_push))
            self._inflight[key] = task
            task.add_done_callback(functools.partial(self._finished, self._inflight, key))
        return await asyncio.shield(task)

    @staticmethod
    def _finished(tasks: dict[Key, Any], key: Key, task: asyncio.Task[Any]) -> None:
        if tasks.get(key) is task:
            del tasks[key]
        if not task.cancelled():
            task.exception()  # retrieved here so a call no one awaits any more is not logged as lost

    async def unload(self, address: str, adapter: str) -> bool:
        """Unregister an adapter on a pod; False when it was not registered there.

        Requests for it on that pod wait until this is done (then load it again). Raises
        `EppError` when the pod refuses or cannot be reached.
        """
        key = (address, adapter)
        task = self._unloading.get(key)
        if task is None:
            self._loaded_at.pop(key, None)
            task = asyncio.get_running_loop().create_task(self._unload(address, adapter))
            self._unloading[key] = task
            task.add_done_callback(functools.partial(self._finished, self._unloading, key))
        return await asyncio.shield(task)

    async def _unload(self, address: str, adapter: str) -> bool:
        key = (address, adapter)
        loading = self._inflight.get(key)
        if loading is not None:  # let a load that is under way finish first
            with contextlib.suppress(EppError):
                await asyncio.shield(loading)
        try:
            async with asyncio.timeout(self._unload_timeout_s):
                unloaded = await self._unload_call(address, adapter)
        except TimeoutError:
            log.warning("adapter unload timed out", extra={"address": address, "adapter": adapter})
            raise EppError(
                ErrorCode.SERVICE_UNAVAILABLE,
                f"unloading adapter {adapter!r} on {address} took longer than {self._unload_timeout_s:g}s",
                reason=REASON_TIMEOUT,
            ) from None
        self._owned.pop(key, None)
        self._loaded_at.pop(key, None)
        if unloaded:
            log.info("adapter unloaded", extra={"address": address, "adapter": adapter})
        return unloaded

    async def _unload_call(self, address: str, adapter: str) -> bool:
        if self._pods is not None:
            try:
                via_sidecar = await self._pods.unload(address, adapter)
            except SidecarCallError as error:
                raise self._sidecar_failure(address, adapter, error, "unloaded") from error
            if via_sidecar is not None:
                return via_sidecar
        status, text = await self._post(address, UNLOAD_PATH, {"lora_name": adapter})
        if status == 404:
            return False
        if status != 200:
            raise self._failure(address, adapter, status, text, "unloaded")
        return True

    def forget(self, address: str) -> None:
        """A pod went away or restarted: whatever we loaded there is gone."""
        self.retain(lambda other: other != address)

    def retain(self, keep: Callable[[str], bool]) -> None:
        """Forget every pod whose address `keep` rejects (pods that left the pool)."""
        for table in (self._loaded_at, self._owned, self._last_routed):
            for key in [k for k in table if not keep(k[0])]:
                del table[key]

    async def close(self) -> None:
        for task in [*self._inflight.values(), *self._unloading.values()]:
            task.cancel()
        if self._session is not None and self._owns_session:
            await self._session.close()
        self._session = None

    # -- one load ----------------------------------------------------------------------------

    async def _load(self, key: Key, path: str, origin: Origin, trust_push: bool) -> LoadResult:
        address, adapter = key
        started = self._clock.now()
        try:
            async with asyncio.timeout(self._load_timeout_s):
                pushed = self.pushed(address) if trust_push else None
                registered = pushed.registered if pushed is not None else await self._registered(address)
                loaded_now = False
                if adapter not in registered:
                    loaded_now = await self._load_call(address, adapter, path)
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
            self._owned[key] = origin
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

    async def _load_call(self, address: str, adapter: str, path: str) -> bool:
        """Register the adapter (sidecar first, else HTTP); True if this call loaded it."""
        self.loads_started += 1
        if self._pods is not None:
            try:
                via_sidecar = await self._pods.load(address, adapter, path)
            except SidecarCallError as error:
                raise self._sidecar_failure(address, adapter, error, "loaded") from error
            if via_sidecar is not None:
                self.sidecar_loads += 1
                return via_sidecar
        return await self._post_load(address, adapter, path)

    async def _post_load(self, address: str, adapter: str, path: str) -> bool:
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
    def _failure(address: str, adapter: str, status: int, text: str, verb: str = "loaded") -> EppError:
        message = server_message(text)
        if status == 404 and message == "Not Found":
            message = "runtime LoRA updating is disabled (set VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)"
        log.warning(
            "adapter call refused",
            extra={"address": address, "adapter": adapter, "status": status, "detail": message},
        )
        return EppError(
            ErrorCode.SERVICE_UNAVAILABLE,
            f"adapter {adapter!r} could not be {verb} on {address}: HTTP {status}: {message}",
            reason=REASON_FAILED,
        )

    @staticmethod
    def _sidecar_failure(address: str, adapter: str, error: SidecarCallError, verb: str) -> EppError:
        log.warning(
            "adapter call refused by the sidecar",
            extra={"address": address, "adapter": adapter, "code": error.code, "detail": error.details},
        )
        # The sidecar quotes the model server ("HTTP 404: ..."), so the client sees vLLM's words.
        return EppError(
            ErrorCode.SERVICE_UNAVAILABLE,
            f"adapter {adapter!r} could not be {verb} on {address}: {error.details[:500]}",
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
