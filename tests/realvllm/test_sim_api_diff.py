"""`epp sim` answers the HTTP API as real vLLM does: status, headers, body shape, error text.

The same requests go to a real server and to the simulator (started with the server's flags,
`--model` and `--check-lora-paths`), in the same order, and the replies are compared:

- status code and Content-Type header (or its absence) always;
- JSON bodies by shape: the same keys at every level, the same JSON types, the same number of
  choices; error bodies exactly (message, type, param, code);
- streams chunk by chunk: the same sequence of chunk shapes and finish reasons for each choice,
  then the usage chunk and `[DONE]` (a real stream that joined several tokens into one chunk is
  sent again, see `real_stream_joined`);
- plain-text bodies exactly.

Prompts are token-id lists so both count the same input tokens, and `ignore_eos` makes both
generate exactly `max_tokens`, so usage is compared exactly too. Left out on purpose: generated
text, ids and timestamps, token counts of text prompts (a different tokenizer), and vLLM's
per-message-type validation of chat messages (its 11–22 union errors for one bad message).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.realvllm.client import BASE_MODEL, RealPod
from tests.realvllm.simpod import running_sim

IDS = [5, 6, 7, 8, 9, 10, 11, 12]
CHAT = [{"role": "user", "content": "hi there"}]


@dataclasses.dataclass(frozen=True, slots=True)
class Case:
    method: str
    path: str
    body: Any = None  # JSON body, or raw bytes sent as is
    name: str = ""

    def send(self, pod: RealPod) -> tuple[int, str | None, bytes]:
        data = (
            self.body if isinstance(self.body, bytes) or self.body is None else json.dumps(self.body).encode()
        )
        request = urllib.request.Request(
            pod.url + self.path, data=data, method=self.method, headers={"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, response.headers.get("Content-Type"), response.read()
        except urllib.error.HTTPError as err:
            return err.code, err.headers.get("Content-Type"), err.read()


def gen(path: str, name: str, **body: Any) -> Case:
    base: dict[str, Any] = {"model": BASE_MODEL, "ignore_eos": True}
    base.update({"messages": CHAT} if "chat" in path else {"prompt": IDS})
    return Case("POST", path, {**base, **body}, name)


COMPLETIONS, CHAT_PATH = "/v1/completions", "/v1/chat/completions"

GENERATION = [
    gen(COMPLETIONS, "base", max_tokens=3),
    gen(COMPLETIONS, "adapter", model="lora-0", max_tokens=3),
    gen(COMPLETIONS, "no-model-field", model=None, max_tokens=2),
    gen(COMPLETIONS, "default-max-tokens"),
    gen(COMPLETIONS, "batch-of-token-lists", prompt=[IDS, IDS[:3]], max_tokens=2),
    gen(COMPLETIONS, "batch-of-strings", prompt=["a b", "c"], max_tokens=2),
    gen(COMPLETIONS, "max-tokens-capped-by-context", prompt=[5] * 500, max_tokens=20),
    gen(COMPLETIONS, "lax-types", max_tokens="2", stream="false"),
    gen(COMPLETIONS, "stream", model="lora-1", max_tokens=3, stream=True),
    gen(COMPLETIONS, "stream-usage", max_tokens=3, stream=True, stream_options={"include_usage": True}),
    gen(COMPLETIONS, "stream-empty-options", max_tokens=2, stream=True, stream_options={}),
    gen(COMPLETIONS, "stream-batch", prompt=[IDS, IDS], max_tokens=2, stream=True,
        stream_options={"include_usage": True}),
    gen(CHAT_PATH, "chat", model="lora-0", max_tokens=3),
    gen(CHAT_PATH, "chat-max-completion-tokens-wins", max_tokens=2, max_completion_tokens=3),
    gen(CHAT_PATH, "chat-content-parts", max_tokens=2,
        messages=[{"role": "user", "content": [{"type": "text", "text": "x"}]}]),
    gen(CHAT_PATH, "chat-stream", max_tokens=3, stream=True),
    gen(CHAT_PATH, "chat-stream-usage", max_tokens=3, stream=True, stream_options={"include_usage": True}),
    gen(COMPLETIONS, "n-2", max_tokens=2, n=2),
    gen(COMPLETIONS, "n-2-batch", prompt=[IDS, IDS[:3]], max_tokens=2, n=2),
    gen(COMPLETIONS, "n-2-stream", max_tokens=2, n=2, stream=True, stream_options={"include_usage": True}),
    gen(COMPLETIONS, "logprobs", max_tokens=2, logprobs=2),
    gen(COMPLETIONS, "logprobs-0", max_tokens=2, logprobs=0),
    gen(COMPLETIONS, "logprobs-stream", max_tokens=2, logprobs=1, stream=True),
    gen(CHAT_PATH, "chat-n-2", max_tokens=2, n=2),
    gen(CHAT_PATH, "chat-n-2-stream", max_tokens=2, n=2, stream=True, stream_options={"include_usage": True}),
    gen(CHAT_PATH, "chat-logprobs", max_tokens=2, logprobs=True, top_logprobs=2),
    gen(CHAT_PATH, "chat-logprobs-no-top", max_tokens=2, logprobs=True),
    gen(CHAT_PATH, "chat-logprobs-stream", max_tokens=2, logprobs=True, top_logprobs=1, stream=True),
]  # fmt: skip

ERRORS = [
    gen(COMPLETIONS, "unknown-model", model="nope", max_tokens=2),
    gen(COMPLETIONS, "max-tokens-over-context", max_tokens=513),
    gen(COMPLETIONS, "prompt-over-context", prompt=[5] * 600, max_tokens=1),
    gen(COMPLETIONS, "prompt-fills-context", prompt=[5] * 512, max_tokens=1),
    gen(COMPLETIONS, "zero-max-tokens", max_tokens=0),
    gen(COMPLETIONS, "negative-max-tokens", max_tokens=-1),
    gen(COMPLETIONS, "fractional-max-tokens", max_tokens=2.5),
    gen(COMPLETIONS, "two-type-errors", max_tokens="x", stream="q"),
    gen(COMPLETIONS, "model-not-a-string", model=5, max_tokens=2),
    gen(COMPLETIONS, "prompt-missing", prompt=None, max_tokens=2),
    gen(COMPLETIONS, "prompt-empty", prompt="", max_tokens=2),
    gen(COMPLETIONS, "prompt-empty-list", prompt=[], max_tokens=2),
    gen(COMPLETIONS, "prompt-empty-in-batch", prompt=[IDS, []], max_tokens=2),
    gen(COMPLETIONS, "prompt-of-no-type", prompt=5, max_tokens=2),
    gen(COMPLETIONS, "prompt-mixed-list", prompt=["a", 1], max_tokens=2),
    gen(COMPLETIONS, "stream-options-without-stream", max_tokens=2, stream_options={"include_usage": True}),
    gen(COMPLETIONS, "stream-options-not-an-object", max_tokens=2, stream=True, stream_options=5),
    Case("POST", COMPLETIONS, b"{not json", "broken-json"),
    Case("POST", COMPLETIONS, b"[1, 2]", "array-body"),
    Case("POST", CHAT_PATH, {"model": BASE_MODEL}, "chat-messages-missing"),
    gen(CHAT_PATH, "chat-messages-null", messages=None),
    gen(CHAT_PATH, "chat-messages-not-a-list", messages="hi", max_tokens=2),
    gen(CHAT_PATH, "chat-messages-empty", messages=[], max_tokens=2),
    gen(CHAT_PATH, "chat-max-tokens-over-context", max_tokens=600),
    gen(CHAT_PATH, "chat-zero-max-completion-tokens", max_tokens=5, max_completion_tokens=0),
    Case("GET", "/no-such-route", name="unknown-route"),
    Case("GET", COMPLETIONS, name="wrong-method"),
]


def lora_lifecycle(models: pathlib.Path) -> list[Case]:
    lora_4 = str(models / "lora-4")

    def load(name: str, **body: Any) -> Case:
        return Case("POST", "/v1/load_lora_adapter", body, name)

    def unload(name: str, **body: Any) -> Case:
        return Case("POST", "/v1/unload_lora_adapter", body, name)

    return [
        load("load", lora_name="lora-4", lora_path=lora_4),
        Case("GET", "/v1/models", name="models-after-load"),
        gen(COMPLETIONS, "use-loaded", model="lora-4", max_tokens=2),
        load("load-again", lora_name="lora-4", lora_path=lora_4),
        load("load-in-place", lora_name="lora-4", lora_path=lora_4, load_inplace=True),
        load("load-base-name", lora_name=BASE_MODEL, lora_path=lora_4),
        load("load-missing-dir", lora_name="lora-x", lora_path=str(models / "no-such-adapter")),
        load("load-relative-missing-dir", lora_name="lora-x", lora_path="no-such/adapter"),
        load("load-not-an-adapter", lora_name="lora-x", lora_path=str(models / BASE_MODEL)),
        load("load-empty-name", lora_name="", lora_path=lora_4),
        load("load-empty-path", lora_name="lora-y", lora_path=""),
        load("load-name-not-a-string", lora_name=5, lora_path=lora_4),
        load("load-no-path", lora_name="lora-y"),
        Case("POST", "/v1/load_lora_adapter", b"", "load-no-body"),
        unload("unload", lora_name="lora-4"),
        gen(COMPLETIONS, "use-unloaded", model="lora-4", max_tokens=2),
        unload("unload-again", lora_name="lora-4"),
        unload("unload-empty-name", lora_name=""),
        unload("unload-no-name"),
        Case("GET", "/v1/models", name="models-after-unload"),
    ]


ROUTES = [
    Case("GET", "/v1/models", name="models"),
    Case("GET", f"/v1/models/{BASE_MODEL}", name="model-by-id"),
    Case("GET", "/v1/models/lora-0", name="adapter-by-id"),
    Case("GET", "/v1/models/nope", name="unknown-model-by-id"),
    Case("POST", "/v1/embeddings", {"model": BASE_MODEL, "input": "hi"}, "embeddings-on-a-generation-model"),
    Case("POST", "/v1/responses", {"model": BASE_MODEL, "input": "hi", "max_output_tokens": 2}, "responses"),
    Case("GET", "/health", name="health"),
    Case("GET", "/ping", name="ping"),
    Case("GET", "/version", name="version"),
    Case("GET", "/load", name="load"),
]


def shape(value: Any, key: str = "") -> Any:
    """Keys and JSON types, not values; lists by their items' shapes.

    Two logprobs fields hold token text: a token's UTF-8 `bytes` (as long as the token) and the
    completions API's `top_logprobs` entries (objects keyed by token text, with the sampled token
    on top of the k best unless it is one of them). Those are compared as what they hold.
    """
    if key == "bytes" and isinstance(value, list):
        return "utf-8 bytes" if all(isinstance(b, int) for b in value) else [shape(b) for b in value]
    if key == "top_logprobs" and isinstance(value, list):
        return [
            "token -> logprob" if isinstance(item, dict) and "token" not in item else shape(item)
            for item in value
        ]
    if isinstance(value, dict):
        return {k: shape(item, k) for k, item in value.items()}
    if isinstance(value, list):
        return [shape(item) for item in value]
    return type(value).__name__


def sse_chunks(body: bytes) -> list[Any]:
    events = body.decode().split("\n\n")
    assert events[-1] == "", "a stream ends with a blank line"
    return [json.loads(e.removeprefix("data: ")) if e != "data: [DONE]" else "[DONE]" for e in events[:-1]]


def counts_prompt_alike(case: Case) -> bool:
    """Token-id prompts count the same on both; text goes through two different tokenizers."""
    prompt = case.body.get("prompt") if isinstance(case.body, dict) else None
    return isinstance(prompt, list) and all(isinstance(p, int | list) for p in prompt)


def usage_view(case: Case, usage: dict[str, Any]) -> Any:
    return usage if counts_prompt_alike(case) else usage.get("completion_tokens")


def stream_view(case: Case, chunk: Any) -> Any:
    if chunk == "[DONE]":
        return chunk
    view = shape(chunk)
    view["finish_reasons"] = [c.get("finish_reason") for c in chunk["choices"]]
    view["indices"] = [c["index"] for c in chunk["choices"]]
    if "usage" in chunk:
        view["usage_values"] = usage_view(case, chunk["usage"])
    return view


def per_choice(views: list[Any]) -> list[Any]:
    """Chunks grouped by choice, in order within each: how a batch's choices interleave follows
    the engine's step timing in vLLM (seen both 0,1,0,1 and 0,0,1,1 for the same request)."""

    def choice(view: Any) -> float:
        return view["indices"][0] if view != "[DONE]" and view["indices"] else float("inf")

    return sorted(views, key=choice)


def compare(case: Case, real: tuple[int, str | None, bytes], sim: tuple[int, str | None, bytes]) -> list[str]:
    (r_status, r_type, r_body), (s_status, s_type, s_body) = real, sim
    problems = []
    if r_status != s_status:
        problems.append(f"status: real {r_status}, sim {s_status}")
    if r_type != s_type:
        problems.append(f"Content-Type: real {r_type!r}, sim {s_type!r}")
    if problems:
        return [*problems, f"real body: {r_body[:400]!r}", f"sim body: {s_body[:400]!r}"]
    if r_type and r_type.startswith("text/event-stream"):
        real_view = per_choice([stream_view(case, c) for c in sse_chunks(r_body)])
        sim_view = per_choice([stream_view(case, c) for c in sse_chunks(s_body)])
        if real_view != sim_view:
            problems.append(f"stream: real {real_view}\n      sim {sim_view}")
        return problems
    if r_type != "application/json":
        return [] if r_body == s_body else [f"body: real {r_body!r}, sim {s_body!r}"]
    r_json, s_json = json.loads(r_body), json.loads(s_body)
    if "error" in r_json:
        if r_json != s_json:
            problems.append(f"error: real {r_json['error']}\n      sim {s_json.get('error', s_json)}")
        return problems
    if shape(r_json) != shape(s_json):
        return [f"shape: real {shape(r_json)}\n      sim {shape(s_json)}"]
    for key in ("object", "model"):
        if r_json.get(key) != s_json.get(key):
            problems.append(f"{key}: real {r_json.get(key)!r}, sim {s_json.get(key)!r}")
    if "choices" in r_json:
        finishes = [[c["finish_reason"] for c in j["choices"]] for j in (r_json, s_json)]
        if finishes[0] != finishes[1]:
            problems.append(f"finish reasons: real {finishes[0]}, sim {finishes[1]}")
        usages = [usage_view(case, j["usage"]) for j in (r_json, s_json)]
        if usages[0] != usages[1]:
            problems.append(f"usage: real {usages[0]}, sim {usages[1]}")
    if r_json.get("object") == "list":  # /v1/models: ids, parents, roots (by name), context

        def cards(j: Any) -> list[tuple[Any, ...]]:
            return [
                (m["id"], m["parent"], pathlib.Path(m["root"]).name, m["max_model_len"]) for m in j["data"]
            ]

        if cards(r_json) != cards(s_json):
            problems.append(f"models: real {cards(r_json)}, sim {cards(s_json)}")
    return problems


JOINED_STREAM_RESENDS = 5


def chunks_per_choice(body: bytes) -> collections.Counter[int]:
    return collections.Counter(
        c["index"] for chunk in sse_chunks(body) if chunk != "[DONE]" for c in chunk["choices"]
    )


def real_stream_joined(real: tuple[int, str | None, bytes], sim: tuple[int, str | None, bytes]) -> bool:
    """Whether the real stream has fewer chunks for some choice than the simulator's.

    When its API server falls behind the engine (CPU load), vLLM merges the outputs a stream has
    not sent yet, so one chunk carries several tokens; the simulator sends one chunk per token.
    Such a stream is sent again rather than compared. A simulator that sends too many chunks
    still fails: every resend has too few.
    """
    if (real[0], sim[0]) != (200, 200) or not all(
        (t or "").startswith("text/event-stream") for t in (real[1], sim[1])
    ):
        return False
    real_counts, sim_counts = chunks_per_choice(real[2]), chunks_per_choice(sim[2])
    return any(real_counts[i] < n for i, n in sim_counts.items())


def run_side_by_side(cases: list[Case], real: RealPod, sim: RealPod) -> list[str]:
    report = []
    for case in cases:
        real_reply, sim_reply = case.send(real), case.send(sim)
        for _ in range(JOINED_STREAM_RESENDS):
            if not real_stream_joined(real_reply, sim_reply):
                break
            real_reply = case.send(real)
        problems = compare(case, real_reply, sim_reply)
        report += [f"{case.method} {case.path} [{case.name}] {p}" for p in problems]
    return report


@pytest.fixture(scope="module")
def sim_pod(tmp_path_factory: pytest.TempPathFactory, models_dir: pathlib.Path) -> Iterator[RealPod]:
    log = tmp_path_factory.mktemp("sim-api") / "sim.log"
    with running_sim(log, "--model", str(models_dir / BASE_MODEL), "--check-lora-paths") as pod:
        yield pod


@pytest.mark.parametrize("cases", [ROUTES, GENERATION, ERRORS], ids=["routes", "generation", "errors"])
def test_simulator_answers_like_real_vllm(
    real_pods: list[RealPod], sim_pod: RealPod, cases: list[Case]
) -> None:
    report = run_side_by_side(cases, real_pods[1], sim_pod)
    assert not report, "epp sim differs from real vLLM 0.32.0:\n" + "\n".join(report)


def test_runtime_lora_api_answers_like_real_vllm(
    real_pods: list[RealPod], sim_pod: RealPod, models_dir: pathlib.Path
) -> None:
    report = run_side_by_side(lora_lifecycle(models_dir), real_pods[1], sim_pod)
    assert not report, "epp sim's runtime LoRA API differs from real vLLM 0.32.0:\n" + "\n".join(report)


def test_the_comparison_catches_a_difference() -> None:
    """A changed key, status, header or error text must be reported, or the tests above prove nothing."""
    case = Case("POST", COMPLETIONS, name="self-check")
    ok = (200, "application/json", b'{"object":"text_completion","model":"m","choices":[],"usage":{}}')
    assert compare(case, ok, ok) == []
    renamed = (200, "application/json", b'{"object":"text_completion","model":"m","choice":[],"usage":{}}')
    assert any(p.startswith("shape") for p in compare(case, ok, renamed))
    assert any(p.startswith("status") for p in compare(case, ok, (404, "application/json", ok[2])))
    assert any(
        p.startswith("Content-Type")
        for p in compare(case, ok, (200, "application/json; charset=utf-8", ok[2]))
    )
    error = b'{"error":{"message":"a","type":"BadRequestError","param":null,"code":400}}'
    reworded = b'{"error":{"message":"b","type":"BadRequestError","param":null,"code":400}}'
    assert any(
        p.startswith("error")
        for p in compare(case, (400, "application/json", error), (400, "application/json", reworded))
    )


def test_streams_are_compared_per_choice() -> None:
    """Interleaving of a batch's choices may differ; a chunk's shape or finish reason may not."""
    case = Case("POST", COMPLETIONS, {"prompt": [IDS, IDS]}, "self-check-stream")

    def stream(*chunks: tuple[int, str | None]) -> tuple[int, str, bytes]:
        events = [
            {"object": "text_completion", "choices": [{"index": i, "finish_reason": f}]} for i, f in chunks
        ]
        body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
        return 200, "text/event-stream; charset=utf-8", body

    interleaved = stream((0, None), (1, None), (0, "length"), (1, "length"))
    in_turn = stream((0, None), (0, "length"), (1, None), (1, "length"))
    assert compare(case, interleaved, in_turn) == []
    stopped = stream((0, None), (0, "stop"), (1, None), (1, "length"))
    assert any(p.startswith("stream") for p in compare(case, interleaved, stopped))
    # vLLM under load: choice 1's two tokens in one chunk. Sent again, never compared as is.
    joined = stream((0, None), (1, "length"), (0, "length"))
    assert real_stream_joined(joined, interleaved)
    assert not real_stream_joined(in_turn, interleaved)
    assert not real_stream_joined(interleaved, joined)
