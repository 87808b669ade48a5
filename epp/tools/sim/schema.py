"""Request bodies the simulator accepts, validated the way vLLM's server validates them.

vLLM declares its bodies as pydantic models behind FastAPI, so type errors follow pydantic's
lax rules (`"stream": "yes"` is true, `"max_tokens": "2"` is 2) and come back as one 400 whose
message lists every error. Declaring the same fields with pydantic gives the same acceptance and
the same error entries; `read_body` renders them as vLLM 0.32.0 does: a `loc` dotted from
`body`, union branch names dropped, containers in `input` summarised by size.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from epp.tools.sim.errors import ApiError

MAX_REPORTED_ERRORS = 10
_MAX_INPUT_CHARS = 200
# Union branches and wrappers pydantic adds to `loc`; they are not field names a client sent.
_TYPE_SEGMENTS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "nullable", "union"})


class RequestBody(BaseModel):
    """A JSON request body; the fields of each route are declared by its subclass."""

    # Unknown fields (temperature, ignore_eos, …) are accepted and ignored, as vLLM does;
    # from_attributes gives a nested object of the wrong type vLLM's error type.
    model_config = ConfigDict(extra="allow", from_attributes=True)


class StreamOptions(RequestBody):
    include_usage: bool | None = False


class CompletionBody(RequestBody):
    model: str | None = None
    # vLLM's order of alternatives: it decides the order of the errors for a prompt of no type.
    prompt: list[int] | list[list[int]] | str | list[str] | None = None
    max_tokens: int | None = None  # the server's default (16, as vLLM) when unset or null
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int = 1  # choices per prompt
    logprobs: int | None = None  # alternatives per token (the sampled one comes on top)


class ChatBody(RequestBody):
    model: str | None = None
    messages: list[dict[str, Any]] | None  # required, yet null passes validation (as in vLLM)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = 1
    logprobs: bool | None = False
    top_logprobs: int | None = 0


class ResponsesBody(RequestBody):
    model: str | None = None
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    stream: bool | None = False


class LoadLoraBody(RequestBody):
    lora_name: str
    lora_path: str
    load_inplace: bool = False


class UnloadLoraBody(RequestBody):
    lora_name: str


BodyT = TypeVar("BodyT", bound=RequestBody)


def read_body(raw: bytes, schema: type[BodyT]) -> BodyT:
    """Decode and validate a JSON body; any problem is a 400 `ApiError` shaped like vLLM's."""
    if not raw:
        raise validation_failed([_error("missing", (), "Field required", None)])
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as err:
        raise validation_failed(
            [_error("json_invalid", (err.pos,), "JSON decode error", {}, {"error": err.msg})]
        ) from None
    except UnicodeDecodeError as err:
        raise validation_failed(
            [_error("json_invalid", (err.start,), "JSON decode error", {}, {"error": err.reason})]
        ) from None
    if not isinstance(value, dict):
        message = "Input should be a valid dictionary or object to extract fields from"
        raise validation_failed([_error("model_attributes_type", (), message, value)])
    try:
        return schema.model_validate(value)
    except ValidationError as err:
        errors = [
            _error(e["type"], e["loc"], e["msg"], e["input"], e.get("ctx"))
            for e in err.errors(include_url=False)
        ]
        raise validation_failed(errors) from None


def _error(
    kind: str, loc: Sequence[str | int], msg: str, value: object, ctx: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": kind, "loc": ("body", *loc), "msg": msg, "input": value}
    if ctx:
        entry["ctx"] = {key: str(item) for key, item in ctx.items()}
    return entry


def validation_failed(errors: Sequence[Mapping[str, Any]]) -> ApiError:
    """vLLM's 400 for a body that fails validation: "N validation error(s):" then one line each."""
    count = len(errors)
    noun = "error" if count == 1 else "errors"
    lines = [f"  {_render(e)}" for e in errors[:MAX_REPORTED_ERRORS]]
    if count > MAX_REPORTED_ERRORS:
        lines.append(f"  ...and {count - MAX_REPORTED_ERRORS} more {noun}")
    param = dotted_loc(errors[0]["loc"]) if errors else None
    return ApiError(400, "Bad Request", "\n".join([f"{count} validation {noun}:", *lines]), param)


def _render(entry: Mapping[str, Any]) -> str:
    shown = dict(entry)
    shown["loc"] = dotted_loc(entry["loc"])
    shown["input"] = summarise(entry["input"])
    return str(shown)


def dotted_loc(loc: Sequence[str | int]) -> str:
    """('body', 'prompt', 'list[int]', 0) → 'body.prompt.0': field names and indices only."""
    parts = [str(p) for p in loc if not _is_type_segment(str(p))]
    return ".".join(parts or [str(p) for p in loc])


def _is_type_segment(segment: str) -> bool:
    return any(c in segment for c in "[]{}()") or segment.lower() in _TYPE_SEGMENTS


def summarise(value: object) -> str:
    """The `input` of an error entry: strings as sent (cut at 200), containers by their size."""
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = str(value)
    return text if len(text) <= _MAX_INPUT_CHARS else text[:_MAX_INPUT_CHARS] + "...[truncated]"
