"""The simulator's aiohttp app: vLLM's OpenAI routes, /metrics and the runtime LoRA API."""

from __future__ import annotations

import asyncio
import hashlib
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
from epp.tools.sim import api, errors, schema
from epp.tools.sim.driver import EngineDriver
from epp.tools.sim.engine import Engine, EngineConfig, TokenEvent
from epp.tools.sim.metrics import CONTENT_TYPE, SimMetrics

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
    "a",
    "small",
    "vocabulary",
    "for",
    "simulated",
    "answers",
    "that",
    "look",
    "like",
    "words",
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


@dataclass(frozen=True, slots=True)
class _Reply:
    """What every choice and chunk of one response shares."""

    response_id: str
    created: int
    model: str
    prompt_tokens: int
    fingerprint: str


def _json(payload: Any, status: int = 200) -> web.Response:
    """JSON the way vLLM's FastAPI writes it: compact separators, `application/json` with no charset."""
    body = json.dumps(payload, separators=(",", ":")).encode()
    return web.Response(body=body, status=status, content_type="application/json")


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
        config = f"{settings.served_model_names}|{settings.max_model_len}|{settings.engine}"
        self.fingerprint = f"vllm-{VLLM_VERSION}-{hashlib.sha256(config.encode()).hexdigest()[:8]}"
        # Registered adapters (API-server table), in registration order: name -> path.
        self.adapters: dict[str, str] = {}
        for name, path in settings.lora_modules:
            self.adapters[name] = path
            self.engine.lora.register(name, ())
        self._in_flight = 0

    # ---- app ------------------------------------------------------------------------------
    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._not_found_middleware], client_max_size=16 * 1024 * 1024)
        app.on_response_prepare.append(self._add_pod_header)
        r = app.router
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_post("/v1/responses", self.responses)
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
        if isinstance(response, _UntypedResponse):
            response.headers.popall("Content-Type", None)

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
        except errors.ApiError as err:
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
        created = int(self.wall_clock())  # vLLM stamps the cards when asked, not at start
        data = [
            self._model_card(
                name, self.settings.model_path or name, None, self.settings.max_model_len, created
            )
            for name in self.settings.served_model_names
        ]
        data += [
            self._model_card(name, path, self.base_name, None, created)
            for name, path in self.adapters.items()
        ]
        return _json({"object": "list", "data": data})

    @staticmethod
    def _model_card(
        name: str, root: str, parent: str | None, max_model_len: int | None, created: int
    ) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": root,
            "parent": parent,
            "max_model_len": max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{secrets.token_hex(8)}",
                    "object": "model_permission",
                    "created": created,
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
        body = schema.read_body(await request.read(), schema.CompletionBody)
        gen = api.parse_completion(body)
        adapter, response_model = self._resolve(gen.model)
        if not gen.prompts:
            raise errors.bad_request("You must pass at least one prompt")
        if not all(gen.prompts):
            raise errors.bad_request("The decoder prompt cannot be empty")
        return await self._generate(request, gen, adapter, response_model, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = schema.read_body(await request.read(), schema.ChatBody)
        gen = api.parse_chat(body)
        adapter, response_model = self._resolve(gen.model)
        if not gen.prompts:
            raise errors.bad_request(
                "Cannot apply chat template to an empty conversation. Provide at least one message."
            )
        return await self._generate(request, gen, adapter, response_model, chat=True)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        """The Responses API for a plain text answer (no tools, no streaming), as vLLM 0.32 shapes it."""
        body = schema.read_body(await request.read(), schema.ResponsesBody)
        gen = api.parse_responses(body)
        adapter, response_model = self._resolve(gen.model)
        [prompt] = gen.prompts
        budget = self._output_budget(gen, True, len(prompt))
        request_id: str | None = None
        self._in_flight += 1
        try:
            request_id, queue = self._submit(adapter, prompt, budget)
            tokens, finish = await self._drain(queue, None)
        finally:
            self._in_flight -= 1
            if request_id is not None:
                self.driver.release(request_id)
        return _json(
            api.responses_body(
                response_id=f"resp_{secrets.token_hex(8)}",
                message_id=f"msg_{secrets.token_hex(8)}",
                created=int(self.wall_clock()),
                model=response_model,
                text="".join(t.text for t in tokens),
                finish_reason=finish,
                max_output_tokens=body.max_output_tokens,
                instructions=body.instructions,
                prompt_tokens=len(prompt),
                output_tokens=len(tokens),
            )
        )

    def _resolve(self, model: str | None) -> tuple[str | None, str]:
        """(adapter or None for the base, the name responses carry)."""
        if model is None or model in self.settings.served_model_names:
            return None, self.base_name
        if self.settings.enable_lora and model in self.adapters:
            return model, model
        raise errors.model_not_found(model, self.settings.served_model_names)

    def _output_budget(self, gen: api.GenerationRequest, chat: bool, prompt_len: int) -> int:
        """Tokens to generate for one prompt, checked in vLLM's order.

        max_tokens may not exceed the context; a prompt may not fill it; what the prompt leaves
        then caps max_tokens (vLLM generates up to the context rather than refusing), and the
        result must be at least 1. Without max_tokens: 16 for completions, the rest of the context
        for chat.
        """
        limit = self.settings.max_model_len
        if gen.max_tokens is not None and gen.max_tokens > limit:
            raise errors.invalid_parameter(
                f"max_tokens={gen.max_tokens} cannot be greater than max_model_len={limit}. "
                "Please request fewer output tokens.",
                "max_tokens",
                gen.max_tokens,
            )
        if prompt_len > limit:
            raise errors.invalid_parameter(
                f"This model's maximum context length is {limit} tokens. However, your prompt contains "
                f"{prompt_len} input tokens, which exceeds this limit even without any output tokens. "
                "Please reduce the length of the input prompt.",
                "input_tokens",
                prompt_len,
            )
        requested = gen.max_tokens
        if requested is None:
            requested = limit if chat else self.settings.default_max_tokens
        budget = min(requested, limit - prompt_len)
        if budget < 1:
            raise errors.invalid_parameter(
                f"max_tokens must be at least 1, got {budget}.", "max_tokens", budget
            )
        return budget

    async def _generate(
        self,
        request: web.Request,
        gen: api.GenerationRequest,
        adapter: str | None,
        response_model: str,
        *,
        chat: bool,
    ) -> web.StreamResponse:
        budgets = [self._output_budget(gen, chat, len(prompt)) for prompt in gen.prompts]
        submitted: list[tuple[str, asyncio.Queue[TokenEvent]]] = []
        self._in_flight += 1
        try:
            # Each prompt `n` times: choice index = prompt index × n + sample, as vLLM numbers them.
            for prompt, budget in zip(gen.prompts, budgets, strict=True):
                for _ in range(gen.n):
                    submitted.append(self._submit(adapter, prompt, budget))
            reply = _Reply(
                response_id=f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(8)}",
                created=int(self.wall_clock()),
                model=response_model,
                prompt_tokens=sum(len(p) for p in gen.prompts),
                fingerprint=self.fingerprint,
            )
            queues = [queue for _, queue in submitted]
            if gen.stream:
                return await self._stream(request, queues, chat, reply, gen)
            return _json(await self._collect(queues, chat, reply, gen.top_logprobs))
        finally:
            self._in_flight -= 1
            for request_id, _ in submitted:
                self.driver.release(request_id)

    def _submit(
        self, adapter: str | None, prompt: tuple[str, ...], budget: int
    ) -> tuple[str, asyncio.Queue[TokenEvent]]:
        """Hand one prompt to the engine; one it refuses (no room in the KV cache) is a 400."""
        try:
            return self.driver.submit(adapter, prompt, budget)
        except ValueError as err:
            raise errors.bad_request(str(err), "max_tokens") from None

    async def _drain(
        self, queue: asyncio.Queue[TokenEvent], top: int | None
    ) -> tuple[list[api.SampledToken], str]:
        """Every token of one sequence, until the engine says why it finished."""
        tokens: list[api.SampledToken] = []
        finish: str | None = None
        while finish is None:
            finish = (await queue.get()).finish_reason
            tokens.append(self._token(top))
        return tokens, finish

    async def _collect(
        self, queues: list[asyncio.Queue[TokenEvent]], chat: bool, reply: _Reply, top: int | None
    ) -> dict[str, Any]:
        choices: list[dict[str, Any]] = []
        generated = 0
        for index, queue in enumerate(queues):
            tokens, finish = await self._drain(queue, top)
            generated += len(tokens)
            text = "".join(t.text for t in tokens)
            if chat:
                choices.append(api.chat_choice(index, text, finish, api.chat_logprobs(tokens, top)))
            else:
                choices.append(
                    api.completion_choice(index, text, finish, api.completion_logprobs(tokens, top))
                )
        totals = api.usage(reply.prompt_tokens, generated)
        return api.response(
            chat, reply.response_id, reply.created, reply.model, choices, totals, reply.fingerprint
        )

    async def _stream(
        self,
        request: web.Request,
        queues: list[asyncio.Queue[TokenEvent]],
        chat: bool,
        reply: _Reply,
        gen: api.GenerationRequest,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            status=200, headers={"Content-Type": "text/event-stream; charset=utf-8"}
        )
        await response.prepare(request)
        try:
            await self._write_stream(response, queues, chat, reply, gen)
        except ConnectionResetError:
            log.info("client closed the stream", extra={"response_id": reply.response_id})
        return response

    async def _write_stream(
        self,
        response: web.StreamResponse,
        queues: list[asyncio.Queue[TokenEvent]],
        chat: bool,
        reply: _Reply,
        gen: api.GenerationRequest,
    ) -> None:
        """vLLM's chunk sequence: (chat) a role chunk per choice, then one chunk per token.

        The choices of a request decode side by side, so their chunks interleave step by step.
        The fingerprint rides on the usage chunk when there is one, else on the last token chunk.
        Each token chunk carries that token's logprobs when they were asked for.
        """
        include_usage, top = gen.include_usage, gen.top_logprobs
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
            return {
                "id": reply.response_id, "object": obj, "created": reply.created, "model": reply.model,
                "choices": choices, **extra,
            }  # fmt: skip

        if chat:
            for index in range(len(queues)):
                role = api.chat_role_chunk_choice(index)
                await response.write(api.sse(chunk([role], prompt_token_ids=None, prompt_text=None)))
        generated = 0
        offsets = [0] * len(queues)  # each choice's text so far, for completion logprobs' text_offset
        decoding = list(enumerate(queues))
        while decoding:
            still_decoding = []
            for position, (index, queue) in enumerate(decoding):
                finish = (await queue.get()).finish_reason
                generated += 1
                if finish is None:
                    still_decoding.append((index, queue))
                token = self._token(top)
                offset = offsets[index]
                offsets[index] += len(token.text)
                choice = (
                    api.chat_chunk_choice(index, token.text, finish, api.chat_logprobs([token], top))
                    if chat
                    else api.completion_chunk_choice(
                        index, token.text, finish, api.completion_logprobs([token], top, offset)
                    )
                )
                last = not include_usage and not still_decoding and position == len(decoding) - 1
                extra = {"system_fingerprint": reply.fingerprint} if last else {}
                await response.write(api.sse(chunk([choice], **extra)))
            decoding = still_decoding
        if include_usage:
            totals = api.usage(reply.prompt_tokens, generated, stream=True)
            await response.write(api.sse(chunk([], usage=totals, system_fingerprint=reply.fingerprint)))
        await response.write(api.sse("[DONE]"))
        await response.write_eof()

    def _token(self, top: int | None) -> api.SampledToken:
        """A random word. With logprobs asked for (`top` not None), synthetic ones: the sampled word
        first, then `top` other words of the vocabulary with falling logprobs."""
        rng = self._rng
        if top is None:
            return api.SampledToken(" " + rng.choice(_VOCABULARY), 0.0, ())
        words = rng.sample(_VOCABULARY, top + 1)
        logprob = -rng.uniform(0.01, 3.0)
        ranked = [(" " + words[0], logprob)]
        ranked += [(" " + w, round(-0.5 * (i + 1) - rng.random(), 4)) for i, w in enumerate(words[1:])]
        return api.SampledToken(ranked[0][0], logprob, tuple(ranked))

    # ---- runtime LoRA ---------------------------------------------------------------------
    def _runtime_lora_allowed(self) -> bool:
        return self.settings.enable_lora and self.settings.allow_runtime_lora_updating

    async def load_lora_adapter(self, request: web.Request) -> web.Response:
        if not self._runtime_lora_allowed():
            return _json({"detail": "Not Found"}, status=404)
        body = schema.read_body(await request.read(), schema.LoadLoraBody)
        name, path = body.lora_name, body.lora_path
        if not name or not path:
            raise _invalid_lora_input("Both 'lora_name' and 'lora_path' must be provided.")
        if name in self.settings.served_model_names:
            raise _invalid_lora_input(f"The lora adapter '{name}' conflicts with a served base model.")
        if name in self.adapters and not body.load_inplace:
            raise _invalid_lora_input(
                f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in "
                "place, set 'load_inplace' to True."
            )
        if self.settings.check_lora_paths and not await asyncio.to_thread(_holds_adapter, path):
            shown = "<path>" if os.path.isabs(path) else path  # vLLM keeps absolute paths out of errors
            raise errors.ApiError(
                404, "NotFoundError", f"Loading lora {name} failed: No adapter found for {shown}"
            )
        await self.clock.sleep(self.settings.engine.cost.lora_load_latency_s)
        self.engine.lora.register(name, self.engine.pinned_adapters())
        self.adapters[name] = path
        log.info("lora adapter loaded", extra={"adapter": name, "path": path})
        return _untyped_text(f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora_adapter(self, request: web.Request) -> web.Response:
        if not self._runtime_lora_allowed():
            return _json({"detail": "Not Found"}, status=404)
        name = request.match_info.get("adapter_name")
        if name is None:
            name = schema.read_body(await request.read(), schema.UnloadLoraBody).lora_name
        if not name:
            raise _invalid_lora_input("'lora_name' needs to be provided to unload a LoRA adapter.")
        if name not in self.adapters:
            raise errors.ApiError(404, "NotFoundError", f"The lora adapter '{name}' cannot be found.")
        # Like vLLM: only the API table forgets it; weights leave the caches by LRU eviction.
        del self.adapters[name]
        self.engine.lora.forget(name)
        log.info("lora adapter unloaded", extra={"adapter": name})
        return _untyped_text(f"Success: LoRA adapter '{name}' removed successfully.")


def _holds_adapter(path: str) -> bool:
    """A PEFT adapter directory: vLLM reads its adapter_config.json first."""
    return os.path.isfile(os.path.join(path, "adapter_config.json"))


def _invalid_lora_input(message: str) -> errors.ApiError:
    return errors.ApiError(400, "InvalidUserInput", message)


class _UntypedResponse(web.Response):
    """A body sent with no Content-Type header (aiohttp would add application/octet-stream)."""


def _untyped_text(text: str) -> web.Response:
    """vLLM answers a LoRA load or unload with bare text and no Content-Type header at all."""
    return _UntypedResponse(body=text.encode())
