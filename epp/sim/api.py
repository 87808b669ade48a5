"""OpenAI/vLLM wire shapes: request parsing, error bodies and response objects (pure functions).

Bodies and messages follow real vLLM 0.32.0 (spec: vllm-metrics.md §6).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

BOS_TOKEN = "<s>"


class ApiError(Exception):
    """A request the server answers with a vLLM-style JSON error body."""

    def __init__(self, status: int, error_type: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.status,
            }
        }


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, "BadRequestError", message, param)


def model_not_found(model: str, base_names: tuple[str, ...]) -> ApiError:
    aliases = ", ".join(base_names)
    return ApiError(
        404, "NotFoundError", f"The model `{model}` does not exist. Valid aliases: {aliases}.", "model"
    )


def missing_field(field: str) -> ApiError:
    """Shape of vLLM's request-validation error for a missing body field."""
    detail = f"{{'type': 'missing', 'loc': ('body', '{field}'), 'msg': 'Field required', 'input': None}}"
    return ApiError(400, "Bad Request", f"1 validation error:\n  {detail}", f"body.{field}")


def tokenize(text: str) -> list[str]:
    """The simulator's tokenizer: a BOS token, then one token per whitespace-separated word."""
    return [BOS_TOKEN, *text.split()]


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What the engine needs from a completion or chat body."""

    model: str | None
    prompt_tokens: tuple[str, ...]
    max_tokens: int | None
    stream: bool
    include_usage: bool


def parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw) if raw else None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise bad_request(f"Invalid JSON body: {err}") from None
    if not isinstance(body, dict):
        raise bad_request("Request body must be a JSON object")
    return body


def _common(body: dict[str, Any], prompt_tokens: list[str]) -> GenerationRequest:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise bad_request("'max_tokens' must be a positive integer", "max_tokens")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    include_usage = bool(options.get("include_usage", False))
    return GenerationRequest(model, tuple(prompt_tokens), max_tokens, stream, include_usage)


def parse_completion(body: dict[str, Any]) -> GenerationRequest:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        tokens = tokenize(prompt)
    elif (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        tokens = [str(t) for t in prompt]
    elif prompt is None:
        raise missing_field("prompt")
    else:
        raise bad_request("'prompt' must be a string, a one-string list or a list of token ids", "prompt")
    return _common(body, tokens)


def parse_chat(body: dict[str, Any]) -> GenerationRequest:
    messages = body.get("messages")
    if messages is None:
        raise missing_field("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list", "messages")
    words: list[str] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
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
    words.append("<|assistant|>")
    return _common(body, [tokenize("")[0], *words])


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


def completion_choice(text: str, finish_reason: str | None) -> dict[str, Any]:
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}


def chat_choice(text: str, finish_reason: str | None) -> dict[str, Any]:
    return {
        "index": 0,
        "message": {"role": "assistant", "content": text, "refusal": None, "tool_calls": []},
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
    }


def chat_chunk_choice(delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()
