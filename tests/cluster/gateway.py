"""One completion through a gateway, as the cluster tier's routing tests send it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # the sample pool's base model (manifests/sim)


def ask(gateway: str, model: str = MODEL) -> tuple[int, str]:
    """(status, the pod that served it (`x-inference-pod`), or why it failed)."""
    body = json.dumps({"model": model, "prompt": "Say hello.", "max_tokens": 4}).encode()
    request = urllib.request.Request(
        f"{gateway}/v1/completions", data=body, headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            return response.status, response.headers.get("x-inference-pod", "")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")[:200]  # why, for the assertion
