"""A small blocking OpenAI-style client for the checks: one request, what the user sees."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence

POD_HEADER = "x-inference-pod"  # set by `epp sim` on every response
REQUEST_ID_HEADER = "x-request-id"


@dataclasses.dataclass(frozen=True, slots=True)
class Reply:
    status: int
    request_id: str
    headers: Mapping[str, str]  # lower-cased names
    body: bytes

    @property
    def pod(self) -> str:
        """The pod that answered (`x-inference-pod`), "" when the reply did not come from a pod."""
        return self.headers.get(POD_HEADER, "")

    @property
    def model(self) -> str:
        """`model` of a JSON completion body ("" for errors and non-JSON bodies)."""
        try:
            body = json.loads(self.body)
        except ValueError:
            return ""
        model = body.get("model") if isinstance(body, dict) else None
        return model if isinstance(model, str) else ""


def complete(
    base_url: str,
    model: str,
    prompt: str = "Say hello.",
    *,
    headers: Mapping[str, str] | None = None,
    max_tokens: int = 4,
    timeout_s: float = 30.0,
) -> Reply:
    """POST /v1/completions; never raises for an HTTP status (connection errors give status 0)."""
    request_id = str(uuid.uuid4())
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens}).encode()
    request = urllib.request.Request(
        f"{base_url}/v1/completions",
        data=body,
        method="POST",
        headers={"content-type": "application/json", REQUEST_ID_HEADER: request_id, **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return Reply(
                response.status,
                request_id,
                {k.lower(): v for k, v in response.headers.items()},
                response.read(),
            )
    except urllib.error.HTTPError as err:
        return Reply(err.code, request_id, {k.lower(): v for k, v in err.headers.items()}, err.read())
    except (urllib.error.URLError, OSError):
        return Reply(0, request_id, {}, b"")


def complete_many(
    base_url: str,
    models: Sequence[str],
    *,
    headers: Mapping[str, str] | None = None,
    concurrency: int = 4,
    timeout_s: float = 30.0,
) -> list[Reply]:
    """One request per entry of `models`, `concurrency` at a time; replies in the same order."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [
            pool.submit(
                complete, base_url, model, f"Request {i} for {model}.", headers=headers, timeout_s=timeout_s
            )
            for i, model in enumerate(models)
        ]
        return [future.result() for future in futures]
