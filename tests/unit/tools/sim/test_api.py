"""What a validated completion or chat body means to the engine, and vLLM's error bodies."""

from __future__ import annotations

from typing import Any

import pytest

from epp.tools.sim import api, errors, schema


def completion(body: dict[str, Any]) -> api.GenerationRequest:
    return api.parse_completion(schema.CompletionBody.model_validate(body))


def chat(body: dict[str, Any]) -> api.GenerationRequest:
    return api.parse_chat(schema.ChatBody.model_validate(body))


@pytest.mark.parametrize(
    ("body", "prompts", "max_tokens", "stream", "include_usage"),
    [
        ({"prompt": "a b c"}, (("<s>", "a", "b", "c"),), None, False, False),
        ({"prompt": ["a b", "c"], "max_tokens": 5}, (("<s>", "a", "b"), ("<s>", "c")), 5, False, False),
        ({"prompt": [1, 2, 3], "stream": True}, (("1", "2", "3"),), None, True, False),
        ({"prompt": [[1, 2], [3]]}, (("1", "2"), ("3",)), None, False, False),
        ({"prompt": "x", "stream": True, "stream_options": {"include_usage": True}}, (("<s>", "x"),), None,
         True, True),
        ({"prompt": "x", "max_tokens": "2", "stream": "yes"}, (("<s>", "x"),), 2, True, False),
    ],
    ids=["string", "batch-of-strings", "token-ids", "batch-of-token-lists", "include-usage", "lax-types"],
)  # fmt: skip
def test_parse_completion(
    body: dict[str, Any],
    prompts: tuple[tuple[str, ...], ...],
    max_tokens: int | None,
    stream: bool,
    include_usage: bool,
) -> None:
    request = completion(body)
    assert (request.prompts, request.max_tokens, request.stream, request.include_usage) == (
        prompts,
        max_tokens,
        stream,
        include_usage,
    )


def test_completions_ignore_max_completion_tokens() -> None:
    assert completion({"prompt": "x", "max_completion_tokens": 3}).max_tokens is None


def test_parse_chat_renders_roles_and_parts() -> None:
    request = chat(
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            ]
        }
    )
    assert request.prompts == (("<s>", "<|system|>", "be", "brief", "<|user|>", "hi", "<|assistant|>"),)


def test_chat_max_completion_tokens_wins_over_max_tokens() -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "max_completion_tokens": 3}
    assert chat(body).max_tokens == 3


def test_chat_without_messages_has_no_prompt() -> None:
    assert chat({"messages": []}).prompts == ()


@pytest.mark.parametrize(
    ("parse", "body", "message", "param"),
    [
        (completion, {}, "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)",
         "prompt"),
        (completion, {"prompt": ""}, "Either prompt or prompt_embeds must be provided and non-empty. "
         "(parameter=prompt)", "prompt"),
        (completion, {"prompt": "x", "stream_options": {"include_usage": True}},
         "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
         "stream_options"),
        (chat, {"messages": None}, "'NoneType' object is not iterable", None),
        (chat, {"messages": [{"content": "x"}]}, "each message needs a string 'role'", "messages"),
    ],
    ids=["no-prompt", "empty-prompt", "stream-options-without-stream", "null-messages",
         "message-without-role"],
)  # fmt: skip
def test_meaningless_bodies_raise_400(
    parse: Any, body: dict[str, Any], message: str, param: str | None
) -> None:
    with pytest.raises(errors.ApiError) as caught:
        parse(body)
    assert caught.value.body() == {
        "error": {"message": message, "type": "BadRequestError", "param": param, "code": 400}
    }


def test_empty_stream_options_without_stream_are_accepted() -> None:
    assert completion({"prompt": "x", "stream_options": {}}).stream is False


def test_model_not_found_body_is_vllms() -> None:
    error = errors.model_not_found("no-such-model", ("tiny-llama",))
    assert error.status == 404
    assert error.body() == {
        "error": {
            "message": "The model `no-such-model` does not exist. Valid aliases: tiny-llama.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }


def test_usage_details_differ_between_replies_and_streams() -> None:
    assert api.usage(3, 2) == {
        "prompt_tokens": 3,
        "total_tokens": 5,
        "completion_tokens": 2,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    assert api.usage(3, 2, stream=True) == {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2}


def test_sse_framing() -> None:
    assert api.sse("[DONE]") == b"data: [DONE]\n\n"
    assert api.sse({"a": 1}) == b'data: {"a":1}\n\n'
