"""Request parsing and vLLM error bodies."""

from __future__ import annotations

from typing import Any

import pytest

from epp.sim import api


@pytest.mark.parametrize(
    ("body", "tokens", "max_tokens", "stream", "include_usage"),
    [
        ({"prompt": "a b c"}, ("<s>", "a", "b", "c"), None, False, False),
        ({"prompt": ["a b"], "max_tokens": 5}, ("<s>", "a", "b"), 5, False, False),
        ({"prompt": [1, 2, 3], "stream": True}, ("1", "2", "3"), None, True, False),
        (
            {"prompt": "x", "stream": True, "stream_options": {"include_usage": True}},
            ("<s>", "x"),
            None,
            True,
            True,
        ),
    ],
    ids=["string", "one-string-list", "token-ids", "include-usage"],
)
def test_parse_completion(
    body: dict[str, Any], tokens: tuple[str, ...], max_tokens: int | None, stream: bool, include_usage: bool
) -> None:
    request = api.parse_completion(body)
    assert (request.prompt_tokens, request.max_tokens, request.stream, request.include_usage) == (
        tokens,
        max_tokens,
        stream,
        include_usage,
    )


def test_parse_chat_renders_roles_and_parts() -> None:
    request = api.parse_chat(
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            ]
        }
    )
    assert request.prompt_tokens == ("<s>", "<|system|>", "be", "brief", "<|user|>", "hi", "<|assistant|>")


@pytest.mark.parametrize(
    ("parse", "body", "param"),
    [
        (api.parse_completion, {}, "body.prompt"),
        (api.parse_completion, {"prompt": {"a": 1}}, "prompt"),
        (api.parse_completion, {"prompt": "x", "max_tokens": 0}, "max_tokens"),
        (api.parse_completion, {"prompt": "x", "max_tokens": True}, "max_tokens"),
        (api.parse_completion, {"prompt": "x", "model": 3}, "model"),
        (api.parse_completion, {"prompt": "x", "stream": "yes"}, "stream"),
        (api.parse_chat, {}, "body.messages"),
        (api.parse_chat, {"messages": []}, "messages"),
        (api.parse_chat, {"messages": [{"content": "x"}]}, "messages"),
    ],
    ids=["no-prompt", "prompt-object", "zero-max-tokens", "bool-max-tokens", "model-not-string",
         "stream-not-bool", "no-messages", "empty-messages", "message-without-role"],
)  # fmt: skip
def test_bad_bodies_raise_400(parse: Any, body: dict[str, Any], param: str) -> None:
    with pytest.raises(api.ApiError) as caught:
        parse(body)
    assert caught.value.status == 400
    assert caught.value.body()["error"]["param"] == param


@pytest.mark.parametrize("raw", [b"", b"{bad", b"[1]", b"\xff"], ids=["empty", "broken", "array", "not-utf8"])
def test_parse_json_object_rejects_non_objects(raw: bytes) -> None:
    with pytest.raises(api.ApiError):
        api.parse_json_object(raw)


def test_model_not_found_body_is_vllms() -> None:
    error = api.model_not_found("no-such-model", ("tiny-llama",))
    assert error.status == 404
    assert error.body() == {
        "error": {
            "message": "The model `no-such-model` does not exist. Valid aliases: tiny-llama.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }


def test_sse_framing() -> None:
    assert api.sse("[DONE]") == b"data: [DONE]\n\n"
    assert api.sse({"a": 1}) == b'data: {"a":1}\n\n'
