"""OpenAI/vLLM wire shapes: request meaning, error bodies and response objects (pure functions).

Shapes, defaults and messages are those of a real vLLM 0.32.0 server, checked side by side by
`tests/realvllm/test_sim_api_diff.py`. Body validation itself is in `epp.tools.sim.schema`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from epp.tools.sim.errors import bad_request, invalid_parameter
from epp.tools.sim.schema import ChatBody, CompletionBody, ResponsesBody, StreamOptions

BOS_TOKEN = "<s>"
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
VOCAB_SIZE = 32000  # a Llama tokenizer's, for `logprobs: -1` (the whole vocabulary)


@dataclass(frozen=True, slots=True)
class SampledToken:
    """One generated token: its text, its logprob and the best alternatives (the sampled one first)."""

    text: str
    logprob: float
    ranked: tuple[tuple[str, float], ...]  # (text, logprob), the sampled token first, no repeats


def tokenize(text: str) -> list[str]:
    """The simulator's tokenizer: a BOS token, then one token per whitespace-separated word."""
    return [BOS_TOKEN, *text.split()]


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What the engine needs from a completion or chat body: one or more prompts, same settings."""

    model: str | None
    prompts: tuple[tuple[str, ...], ...]
    max_tokens: int | None  # None: the rest of the context (chat's default)
    stream: bool
    include_usage: bool
    n: int = 1  # choices per prompt: choice index = prompt index × n + sample
    top_logprobs: int | None = None  # None: no logprobs; else alternatives listed per token


def _choices(n: int | None) -> int:
    if n is None:
        return 1
    if n < 1:
        raise invalid_parameter(f"n must be at least 1, got {n}.", "n", n)
    return n


def _top(count: int, name: str) -> int:
    """A top-k count: 0 to `MAX_LOGPROBS`; -1 (the whole vocabulary) is over it, as on vLLM."""
    if count < 0 and count != -1:
        raise invalid_parameter(f"`{name}` must be a positive value or -1.", name, count)
    requested = VOCAB_SIZE if count == -1 else count
    if requested > MAX_LOGPROBS:
        raise invalid_parameter(
            f"Requested sample logprobs of {requested}, which is greater than max allowed: {MAX_LOGPROBS}",
            "logprobs",
            requested,
        )
    return requested


def _stream_settings(stream: bool | None, options: StreamOptions | None) -> tuple[bool, bool]:
    """(stream, include_usage); non-empty stream_options without streaming is refused, as vLLM does."""
    if options is not None and options.model_fields_set and not stream:
        raise invalid_parameter("Stream options can only be defined when `stream=True`.", "stream_options")
    return bool(stream), bool(options and options.include_usage)


def parse_completion(body: CompletionBody) -> GenerationRequest:
    """A string, a token-id list, or a batch of either; an empty prompt is refused before any lookup."""
    stream, include_usage = _stream_settings(body.stream, body.stream_options)
    prompt = body.prompt
    if prompt is None or prompt == "":
        raise invalid_parameter("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
    batch: list[str | list[int]]
    if isinstance(prompt, str):
        batch = [prompt]
    elif prompt and isinstance(prompt[0], int):
        batch = [[t for t in prompt if isinstance(t, int)]]  # one token-id prompt
    else:
        batch = [p for p in prompt if isinstance(p, (str, list))]  # a batch (the filter only narrows)
    prompts = tuple(_prompt_tokens(p) for p in batch)
    top = None if body.logprobs is None else _top(body.logprobs, "logprobs")
    n = _choices(body.n)
    return GenerationRequest(body.model, prompts, body.max_tokens, stream, include_usage, n, top)


def _prompt_tokens(prompt: str | list[int]) -> tuple[str, ...]:
    """Token ids as they are; text through the tokenizer, except "" (no tokens, refused later)."""
    if isinstance(prompt, str):
        return tuple(tokenize(prompt)) if prompt else ()
    return tuple(str(t) for t in prompt)


def parse_chat(body: ChatBody) -> GenerationRequest:
    """Messages rendered as role markers plus words; chat's max_completion_tokens wins over max_tokens."""
    stream, include_usage = _stream_settings(body.stream, body.stream_options)
    if body.messages is None:
        raise bad_request("'NoneType' object is not iterable")
    prompts = (_chat_prompt(body.messages),) if body.messages else ()
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    top_logprobs = body.top_logprobs or 0
    if top_logprobs and not body.logprobs:
        raise invalid_parameter(
            "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs", top_logprobs
        )
    top = _top(top_logprobs, "top_logprobs") if body.logprobs else None
    n = _choices(body.n)
    return GenerationRequest(body.model, prompts, max_tokens, stream, include_usage, n, top)


def parse_responses(body: ResponsesBody) -> GenerationRequest:
    """The Responses API's input (text, or messages as in chat) as one chat prompt; no streaming."""
    if body.stream:
        raise invalid_parameter("epp sim answers /v1/responses without streaming", "stream", True)
    if body.input is None or body.input == "":
        raise invalid_parameter("input must be a non-empty string or a list of messages", "input")
    messages = [{"role": "user", "content": body.input}] if isinstance(body.input, str) else body.input
    if body.instructions:
        messages = [{"role": "system", "content": body.instructions}, *messages]
    return GenerationRequest(body.model, (_chat_prompt(messages),), body.max_output_tokens, False, False)


def _chat_prompt(messages: list[dict[str, Any]]) -> tuple[str, ...]:
    """Messages as the simulator's chat template renders them: role markers and words."""
    words: list[str] = []
    for message in messages:
        if not isinstance(message.get("role"), str):
            raise bad_request("each message needs a string 'role'", "messages")
        content = message.get("content")
        words.append(f"<|{message['role']}|>")
        if isinstance(content, str):
            words.extend(content.split())
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    words.extend(part["text"].split())
        elif content is not None:
            raise bad_request("message 'content' must be a string or a list of parts", "messages")
    return (BOS_TOKEN, *words, "<|assistant|>")


def usage(prompt_tokens: int, completion_tokens: int, *, stream: bool = False) -> dict[str, Any]:
    totals = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    return totals if stream else {**totals, "prompt_tokens_details": None, "completion_tokens_details": None}


def completion_logprobs(
    tokens: list[SampledToken], top: int | None, offset: int = 0
) -> dict[str, Any] | None:
    """The completions API's logprobs: per token its text, offset, logprob and up to top + 1 entries."""
    if top is None:
        return None
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token.text)
    return {
        "text_offset": offsets,
        "token_logprobs": [t.logprob for t in tokens],
        "tokens": [t.text for t in tokens],
        "top_logprobs": [dict(t.ranked[: top + 1]) for t in tokens],
    }


def chat_logprobs(tokens: list[SampledToken], top: int | None) -> dict[str, Any] | None:
    """The chat API's logprobs: per token its text, logprob, UTF-8 bytes and the first `top` entries."""
    if top is None:
        return None

    def entry(text: str, logprob: float) -> dict[str, Any]:
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {
        "content": [
            {**entry(t.text, t.logprob), "top_logprobs": [entry(*alt) for alt in t.ranked[:top]]}
            for t in tokens
        ]
    }


def completion_choice(
    index: int, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "token_ids": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "routed_experts": None,
    }


def completion_chunk_choice(
    index: int, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "prompt_token_ids": None,
        "token_ids": None,
    }


def chat_choice(
    index: int, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "index": index,
        "message": {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": None,
        },
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "token_ids": None,
        "routed_experts": None,
    }


def chat_role_chunk_choice(index: int) -> dict[str, Any]:
    """A chat stream's first chunk for each choice: the role, no text, no stop or token fields yet."""
    return {
        "index": index,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }


def chat_chunk_choice(
    index: int, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None = None
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": index, "delta": {"content": text}, "logprobs": logprobs}
    if finish_reason is None:
        return {**choice, "finish_reason": None, "token_ids": None}
    return {**choice, "finish_reason": finish_reason, "stop_reason": None, "token_ids": None}


def response(
    chat: bool,
    response_id: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    totals: dict[str, Any],
    fingerprint: str,
) -> dict[str, Any]:
    """A whole (non-stream) completion or chat response, with vLLM's fields in vLLM's order."""
    body: dict[str, Any] = {
        "id": response_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": totals,
    }
    if chat:
        body.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
    body.update(kv_transfer_params=None, ec_transfer_params=None, metrics=None)
    return body


def responses_body(
    response_id: str,
    message_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str,
    max_output_tokens: int | None,
    instructions: str | None,
    prompt_tokens: int,
    output_tokens: int,
) -> dict[str, Any]:
    """A whole Responses API object for one assistant message, with vLLM 0.32's fields in its order."""
    cut = finish_reason == "length"
    return {
        "id": response_id,
        "created_at": created,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "instructions": instructions,
        "metadata": None,
        "model": model,
        "object": "response",
        "output": [
            {
                "id": message_id,
                "content": [{"annotations": [], "text": text, "type": "output_text", "logprobs": None}],
                "role": "assistant",
                "status": "completed",
                "type": "message",
                "phase": None,
            }
        ],
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "tool_choice": "none",
        "tools": [],
        "top_p": 1.0,
        "background": False,
        "max_output_tokens": max_output_tokens,
        "max_tool_calls": None,
        "previous_response_id": None,
        "prompt": None,
        "reasoning": None,
        "service_tier": "auto",
        "status": "incomplete" if cut else "completed",
        "text": None,
        "top_logprobs": None,
        "truncation": "disabled",
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {
                "cached_tokens": 0,
                "cache_write_tokens": 0,
                "input_tokens_per_turn": [],
                "cached_tokens_per_turn": [],
            },
            "output_tokens": output_tokens,
            "output_tokens_details": {
                "reasoning_tokens": 0,
                "tool_output_tokens": 0,
                "output_tokens_per_turn": [],
                "tool_output_tokens_per_turn": [],
            },
            "total_tokens": prompt_tokens + output_tokens,
        },
        "user": None,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "input_messages": None,
        "output_messages": None,
    }


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()
