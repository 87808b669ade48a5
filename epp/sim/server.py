"""The simulator's aiohttp app: vLLM's OpenAI routes, /metrics and the runtime LoRA API."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from epp.clock import Clock
from epp.sim import api
from epp.sim.driver import EngineDriver
from epp.sim.engine import Engine, EngineConfig, TokenEvent
from epp.sim.metrics import CONTENT_TYPE, SimMetrics

log = logging.getLogger(__name__)

POD_HEADER = "x-inference-pod"
VLLM_VERSION = "0.32.0"
_VOCABULARY = (
    "the",
    "model",
    "says",
    "hello",
    "world",
    "and",
    "then",
    "some",
    "more",
    "tokens",
    "of",
    "text",
)


@dataclass(frozen=True, slots=True)
class SimSettings:
    """Everything `epp sim` is configured with."""

    host: str = "127.0.0.1"
    port: int = 8000
    pod_name: str = "sim"
    served_model_names: tuple[str, ...] = ("base",)
    model_path: str | None = None
    lora_modules: tuple[tuple[str, str], ...] = ()
    enable_lora: bool = True
    allow_runtime_lora_updating: bool = True
    check_lora_paths: bool = False
    max_model_len: int = 2048
    default_max_tokens: int = 16
    seed: int = 0
    engine: EngineConfig = field(default_factory=EngineConfig)


def _json(payload: Any, status: int = 200) -> web.Response:
    """JSON the way vLLM's FastAPI writes it: compact separators."""
    return web.json_response(payload, status=status, dumps=_compact_dumps)


def _compact_dumps(payload: Any) -> str:
    return json.dumps(payload, separators=(",", ":"))


class SimServer:
    """One simulated pod: adapter registry, engine driver and the HTTP handlers."""

    def __init__(
        self, settings: SimSettings, clock: Clock, wall_clock: Callable[[], float] = time.time
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.wall_clock = wall_clock
        self.base_name = settings.served_model_names[0]
        self.engine = Engine(settings.engine)
        self.metrics = SimMetrics(
            model_name=self.base_name,
            config=settings.engine,
            max_model_len=settings.max_model_len,
            lora_enabled=settings.enable_lora,
            wall_clock=wall_clock,
        )
        self.driver = EngineDriver(self.engine, self.metrics, clock)
        self._rng = random.Random(settings.seed)
        self._created = int(wall_clock())
        # Registered adapters (API-server table), in registration order: name -> path.
        self.adapters: dict[str, str] = {}
        for name, path in settings.lora_modules:
            self.adapters[name] = path
            self.engine.lora.load_to_cpu(name, ())
        self._in_flight = 0

    # ---- app ------------------------------------------------------------------------------
    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._not_found_middleware], client_max_size=16 * 1024 * 1024)
        app.on_response_prepare.append(self._add_pod_header)
        r = app.router
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_get("/v1/models", self.models)
        r.add_get("/health", self.health)
        r.add_get("/ping", self.health)
        r.add_post("/ping", self.health)
        r.add_get("/load", self.load)
        r.add_get("/version", self.version)
        r.add_get("/metrics", self.metrics_page)  # aiohttp answers HEAD for GET routes
        r.add_post("/v1/load_lora_adapter", self.load_lora_adapter)
        r.add_post("/v1/unload_lora_adapter", self.unload_lora_adapter)
        r.add_post("/adapters", self.load_lora_adapter)
        r.add_delete("/adapters/{adapter_name}", self.unload_lora_adapter)
        return app

    async def _add_pod_header(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers[POD_HEADER] = self.settings.pod_name

    @web.middleware
    async def _not_found_middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return _json({"detail": "Not Found"}, status=404)
        except web.HTTPMethodNotAllowed:
            return _json({"detail": "Method Not Allowed"}, status=405)
        except api.ApiError as err:
            return _json(err.body(), status=err.status)

    # ---- simple routes --------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def load(self, request: web.Request) -> web.Response:
        return _json({"server_load": self._in_flight})

    async def version(self, request: web.Request) -> web.Response:
        return _json({"version": VLLM_VERSION})

    async def metrics_page(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def models(self, request: web.Request) -> web.Response:
        data = [
            self._model_card(name, self.settings.model_path or name, None, self.settings.max_model_len)
            for name in self.settings.served_model_names
        ]
        data += [self._model_card(name, path, self.base_name, None) for name, path in self.adapters.items()]
        return _json({"object": "list", "data": data})

    def _model_card(
        self, name: str, root: str, parent: str | None, max_model_len: int | None
    ) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": self._created,
            "owned_by": "vllm",
            "root": root,
            "parent": parent,
            "max_model_len": max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{secrets.token_hex(8)}",
                    "object": "model_permission",
                    "created": self._created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }

    # ---- generation -----------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = api.parse_json_object(await request.read())
        return await self._generate(request, api.parse_completion(body), chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = api.parse_json_object(await request.read())
        return await self._generate(request, api.parse_chat(body), chat=True)

    def _resolve(self, model: str | None) -> tuple[str | None, str]:
        """(adapter or None for the base, the name responses carry)."""
        if model is None or model in self.settings.served_model_names:
            return None, self.base_name
        if self.settings.enable_lora and model in self.adapters:
            return model, model
        raise api.model_not_found(model, self.settings.served_model_names)

    async def _generate(
        self, request: web.Request, gen: api.GenerationRequest, *, chat: bool
    ) -> web.StreamResponse:
        adapter, response_model = self._resolve(gen.model)
        prompt_len = len(gen.prompt_tokens)
        limit = self.settings.max_model_len
        if prompt_len >= limit:
            raise api.bad_request(
                f"This model's maximum context length is {limit} tokens. However, your request has "
                f"{prompt_len} input tokens. Please reduce the length of the input messages.",
                "input_tokens",
            )
        max_tokens = (
            gen.max_tokens
            if gen.max_tokens is not None
            else min(self.settings.default_max_tokens, limit - prompt_len)
        )
        if prompt_len + max_tokens > limit:
            raise api.bad_request(
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
                f"context length is {limit} tokens and your request has {prompt_len} input tokens "
                f"({max_tokens} > {limit} - {prompt_len}).",
                "max_tokens",
            )
        try:
            request_id, tokens = self.driver.submit(adapter, gen.prompt_tokens, max_tokens)
        except ValueError as err:
            raise api.bad_request(str(err), "max_tokens") from None
        self._in_flight += 1
        prefix = "chatcmpl" if chat else "cmpl"
        response_id = f"{prefix}-{secrets.token_hex(16)}"
        created = int(self.wall_clock())
        try:
            if gen.stream:
                return await self._stream(
                    request, tokens, chat, response_id, created, response_model, prompt_len, gen.include_usage
                )
            texts: list[str] = []
            finish: str | None = None
            while finish is None:
                event = await tokens.get()
                texts.append(self._token_text())
                finish = event.finish_reason
            text = "".join(texts)
            payload: dict[str, Any] = {
                "id": response_id,
                "object": "chat.completion" if chat else "text_completion",
                "created": created,
                "model": response_model,
                "choices": [api.chat_choice(text, finish) if chat else api.completion_choice(text, finish)],
                "usage": api.usage(prompt_len, len(texts)),
            }
            return _json(payload)
        finally:
            self._in_flight -= 1
            self.driver.release(request_id)

    async def _stream(
        self,
        request: web.Request,
        tokens: asyncio.Queue[TokenEvent],
        chat: bool,
        response_id: str,
        created: int,
        model: str,
        prompt_len: int,
        include_usage: bool,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            status=200, headers={"Content-Type": "text/event-stream; charset=utf-8"}
        )
        await response.prepare(request)
        try:
            await self._write_stream(
                response, tokens, chat, response_id, created, model, prompt_len, include_usage
            )
        except ConnectionResetError:
            log.info("client closed the stream", extra={"response_id": response_id})
        return response

    async def _write_stream(
        self,
        response: web.StreamResponse,
        tokens: asyncio.Queue[TokenEvent],
        chat: bool,
        response_id: str,
        created: int,
        model: str,
        prompt_len: int,
        include_usage: bool,
    ) -> None:
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices: list[dict[str, Any]]) -> dict[str, Any]:
            return {"id": response_id, "object": obj, "created": created, "model": model, "choices": choices}

        if chat:
            await response.write(
                api.sse(chunk([api.chat_chunk_choice({"role": "assistant", "content": ""}, None)]))
            )
        generated = 0
        finish: str | None = None
        while finish is None:
            event = await tokens.get()
            generated += 1
            finish = event.finish_reason
            text = self._token_text()
            choice = (
                api.chat_chunk_choice({"content": text}, finish)
                if chat
                else api.completion_choice(text, finish)
            )
            await response.write(api.sse(chunk([choice])))
        if include_usage:
            final = chunk([])
            final["usage"] = api.usage(prompt_len, generated)
            await response.write(api.sse(final))
        await response.write(api.sse("[DONE]"))
        await response.write_eof()

    def _token_text(self) -> str:
        return " " + self._rng.choice(_VOCABULARY)

    # ---- runtime LoRA ---------------------------------------------------------------------
    def _runtime_lora_allowed(self) -> bool:
        return self.settings.enable_lora and self.settings.allow_runtime_lora_updating

    async def load_lora_adapter(self, request: web.Request) -> web.Response:
        if not self._runtime_lora_allowed():
            return _json({"detail": "Not Found"}, status=404)
        body = api.parse_json_object(await request.read())
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name:
            raise api.missing_field("lora_name")
        if not isinstance(path, str):
            raise api.missing_field("lora_path")
        if name in self.settings.served_model_names:
            raise api.ApiError(
                400, "InvalidUserInput", f"The lora adapter '{name}' conflicts with a served base model."
            )
        if name in self.adapters and not body.get("load_inplace", False):
            raise api.ApiError(
                400,
                "InvalidUserInput",
                f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in "
                "place, set 'load_inplace' to True.",
            )
        if not path or (self.settings.check_lora_paths and not await asyncio.to_thread(os.path.isdir, path)):
            raise api.ApiError(
                404, "NotFoundError", f"Loading lora {name} failed: No adapter found for {path}"
            )
        await self.clock.sleep(self.settings.engine.lora_load_latency_s)
        self.engine.lora.load_to_cpu(name, self.engine.pinned_adapters())
        self.adapters[name] = path
        log.info("lora adapter loaded", extra={"adapter": name, "path": path})
        return self._plain_text(f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora_adapter(self, request: web.Request) -> web.Response:
        if not self._runtime_lora_allowed():
            return _json({"detail": "Not Found"}, status=404)
        name: Any = request.match_info.get("adapter_name")
        if name is None:
            body = api.parse_json_object(await request.read())
            name = body.get("lora_name")
            if not isinstance(name, str) or not name:
                raise api.missing_field("lora_name")
        if name not in self.adapters:
            raise api.ApiError(404, "NotFoundError", f"The lora adapter '{name}' cannot be found.")
        # Like vLLM: only the API table forgets it; weights leave the caches by LRU eviction.
        del self.adapters[name]
        log.info("lora adapter unloaded", extra={"adapter": name})
        return self._plain_text(f"Success: LoRA adapter '{name}' removed successfully.")

    @staticmethod
    def _plain_text(text: str) -> web.Response:
        response = web.Response(body=text.encode())
        response.content_type = "text/plain"
        return response
