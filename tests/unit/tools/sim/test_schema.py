"""Body validation: pydantic's lax acceptance, and errors rendered as vLLM renders them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from epp.tools.sim import errors, schema


def rejection(raw: bytes, body: type[schema.RequestBody] = schema.CompletionBody) -> dict[str, Any]:
    with pytest.raises(errors.ApiError) as caught:
        schema.read_body(raw, body)
    assert caught.value.status == 400
    error: dict[str, Any] = caught.value.body()["error"]
    assert error["type"] == "Bad Request"
    return error


def test_lax_types_are_accepted_as_vllm_accepts_them() -> None:
    body = schema.read_body(b'{"prompt": "x", "max_tokens": "2", "stream": "true", "temperature": 0.1}',
                            schema.CompletionBody)  # fmt: skip
    assert (body.max_tokens, body.stream) == (2, True)


def test_one_error_names_the_field() -> None:
    error = rejection(b'{"prompt": "x", "max_tokens": 2.5}')
    assert error["param"] == "body.max_tokens"
    assert error["message"] == (
        "1 validation error:\n  {'type': 'int_from_float', 'loc': 'body.max_tokens', "
        "'msg': 'Input should be a valid integer, got a number with a fractional part', 'input': '2.5'}"
    )


def test_every_error_is_listed_and_union_branches_are_not_fields() -> None:
    error = rejection(b'{"prompt": 5, "max_tokens": "x"}')
    lines = str(error["message"]).splitlines()
    count = int(lines[0].split()[0])
    assert lines[0] == f"{count} validation errors:" and len(lines) == count + 1
    assert count > 2  # each alternative of the prompt union reports, plus max_tokens
    assert error["param"] == "body.prompt"
    assert all("list[" not in line and "'loc': 'body.prompt" in line for line in lines[1:-1])
    assert "'loc': 'body.max_tokens'" in lines[-1]


def test_containers_and_long_strings_are_summarised() -> None:
    error = rejection(json.dumps({"prompt": "x", "model": ["a", "b"], "max_tokens": "y" * 300}).encode())
    assert "'input': '<list of 2 items>'" in str(error["message"])
    assert "'input': '" + "y" * 200 + "...[truncated]'" in str(error["message"])


def test_more_than_ten_errors_are_counted_not_listed() -> None:
    error = rejection(b'{"prompt": [[1], {"a": 1}, {"a": 1}, {"a": 1}, {"a": 1}, 3]}')
    lines = str(error["message"]).splitlines()
    count = int(lines[0].split()[0])
    assert len(lines) == 1 + schema.MAX_REPORTED_ERRORS + 1
    assert lines[-1] == f"  ...and {count - schema.MAX_REPORTED_ERRORS} more errors"


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        (b"", "missing"),
        (b"{bad", "json_invalid"),
        (b"\xff", "json_invalid"),
        (b"[1]", "model_attributes_type"),
    ],
    ids=["empty", "broken", "not-utf8", "array"],
)
def test_undecodable_bodies(raw: bytes, kind: str) -> None:
    assert f"'type': '{kind}'" in str(rejection(raw)["message"])


def test_required_fields_of_the_lora_bodies() -> None:
    error = rejection(b'{"lora_name": "a"}', schema.LoadLoraBody)
    assert error["param"] == "body.lora_path"
    assert "'msg': 'Field required'" in str(error["message"])
    error = rejection(b"{}", schema.ChatBody)
    assert error["param"] == "body.messages"
