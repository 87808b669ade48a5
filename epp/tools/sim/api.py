"""OpenAI/vLLM wire shapes: request meaning, error bodies and response objects (pure functions).

Shapes, defaults and messages are those of a real vLLM 0.32.0 server, checked side by side by
`tests/realvllm/test_sim_api_diff.py`. Body validation itself is in `epp.tools.sim.schema`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from epp.tools.sim.errors import bad_request, invalid_parameter
from epp.tools.sim.schema import ChatBody, CompletionBody, StreamOptions

BOS_TOKEN = "<s>"


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
    return GenerationRequest(body.model, prompts, body.max_tokens, stream, include_usage)


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
    words: list[str] = []
    for message in body.messages:
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
    prompts = ((BOS_TOKEN, *words, "<|assistant|>"),) if body.messages else ()
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    return GenerationRequest(body.model, prompts, max_tokens, stream, include_usage)


def usage(prompt_tokens: int, completion_tokens: int, *, stream: bool = False) -> dict[str, Any]:
    totals = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    return totals if stream else {**totals, "prompt_tokens_details": None, "completion_tokens_details": None}


def completion_choice(index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
    return {
        "index": index,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "token_ids": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "routed_experts": None,
    }


def completion_chunk_choice(index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
    return {
        "index": index,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "prompt_token_ids": None,
        "token_ids": None,
    }


def chat_choice(text: str, finish_reason: str | None) -> dict[str, Any]:
    return {
        "index": 0,
        "message": {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": None,
        },
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "token_ids": None,
        "routed_experts": None,
    }


def chat_role_chunk_choice() -> dict[str, Any]:
    """The first chunk of a chat stream: the role, no text, no stop or token fields yet."""
    return {
        "index": 0,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }


def chat_chunk_choice(text: str, finish_reason: str | None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "logprobs": None}
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


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()
