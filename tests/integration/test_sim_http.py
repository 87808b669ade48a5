"""`epp sim` as a real process on its own loopback address: every route, swaps, streaming, LoRA API."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0"
LISTEN_LINE = re.compile(r"listening on http://(?P<host>[\d.]+):(?P<port>\d+)")


@dataclass
class SimProcess:
    process: subprocess.Popen[str]
    url: str


def start_sim(host: str, *flags: str) -> SimProcess:
    process = subprocess.Popen(
        [sys.executable, "-m", "epp", "sim", "--host", host, "--port", "0", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()  # the one line printed when listening (or EOF on failure)
    match = LISTEN_LINE.search(line)
    if match is None:
        process.kill()
        _, err = process.communicate(timeout=10)
        raise AssertionError(f"sim did not start: {line!r} {err}")
    return SimProcess(process, f"http://{host}:{match['port']}")


def stop_sim(sim: SimProcess) -> int:
    if sim.process.poll() is None:
        sim.process.send_signal(signal.SIGTERM)
    try:
        return sim.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        sim.process.kill()
        sim.process.wait(timeout=10)
        raise


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimProcess]:
    adapter_dir = tmp_path / "lora-c"
    adapter_dir.mkdir()
    (adapter_dir / "adapter_config.json").write_text("{}")  # what makes a directory an adapter
    proc = start_sim(
        "127.0.0.2",
        "--pod-name", "pod-a",
        "--served-model-name", "base", "base-alias",
        "--lora-modules", "a=/x", "b=/y",
        "--max-loras", "1",
        "--max-cpu-loras", "2",
        "--time-to-first-token", "5ms",
        "--inter-token-latency", "1ms",
        "--lora-load-latency", "10ms",
        "--check-lora-paths",
        "--max-model-len", "512",
    )  # fmt: skip
    try:
        yield proc
    finally:
        assert stop_sim(proc) == 0


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        yield session


async def metrics(
    http: aiohttp.ClientSession, url: str
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with http.get(f"{url}/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        text = await response.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def loads_of(values: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[str, float]:
    return {
        dict(labels)["adapter"]: v
        for (name, labels), v in values.items()
        if name == "vllm_sim:lora_adapter_loads_total"
    }


async def running_on(http: aiohttp.ClientSession, url: str, count: int) -> None:
    """Until the sim counts `count` requests running (bounded: 10 s)."""
    for _ in range(1000):
        values = await metrics(http, url)
        if sum(v for (name, _), v in values.items() if name == "vllm:num_requests_running") >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{url}: not {count} requests running within 10 s")


async def complete(
    http: aiohttp.ClientSession, url: str, model: str | None, **extra: object
) -> dict[str, object]:
    body: dict[str, object] = {"prompt": "hello there world", "max_tokens": 3, **extra}
    if model is not None:
        body["model"] = model
    async with http.post(f"{url}/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()
        assert response.headers["x-inference-pod"] == "pod-a"
        payload: dict[str, object] = await response.json()
        return payload


async def test_simple_routes_carry_the_pod_header(sim: SimProcess, http: aiohttp.ClientSession) -> None:
    for method, path, status in [
        ("GET", "/health", 200),
        ("GET", "/ping", 200),
        ("POST", "/ping", 200),
        ("GET", "/version", 200),
        ("GET", "/load", 200),
        ("HEAD", "/metrics", 200),
        ("GET", "/no-such-route", 404),
    ]:
        async with http.request(method, f"{sim.url}{path}") as response:
            assert response.status == status, path
            assert response.headers["x-inference-pod"] == "pod-a", path
    async with http.get(f"{sim.url}/version") as response:
        assert await response.json() == {"version": "0.32.0"}
    async with http.get(f"{sim.url}/no-such-route") as response:
        assert await response.json() == {"detail": "Not Found"}


async def test_models_lists_base_then_adapters_with_parent(
    sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    async with http.get(f"{sim.url}/v1/models") as response:
        data = (await response.json())["data"]
    assert [(m["id"], m["parent"], m["max_model_len"]) for m in data] == [
        ("base", None, 512),
        ("base-alias", None, 512),
        ("a", "base", None),
        ("b", "base", None),
    ]
    assert {m["owned_by"] for m in data} == {"vllm"}
    real = json.loads((FIXTURES / "models_startup.json").read_text())["data"]
    assert {frozenset(m) for m in data} == {frozenset(m) for m in real}  # same fields as real vLLM
    assert {frozenset(p) for m in data for p in m["permission"]} == {
        frozenset(p) for m in real for p in m["permission"]
    }
    assert [m["root"] for m in data[2:]] == ["/x", "/y"]


async def test_completions_and_chat_answer_like_vllm(sim: SimProcess, http: aiohttp.ClientSession) -> None:
    base = await complete(http, sim.url, None)
    assert base["model"] == "base" and base["object"] == "text_completion"
    assert base["usage"] == {
        "prompt_tokens": 4,
        "total_tokens": 7,
        "completion_tokens": 3,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    aliased = await complete(http, sim.url, "base-alias")
    assert aliased["model"] == "base"  # the first served name, as vLLM answers
    adapter = await complete(http, sim.url, "a")
    assert adapter["model"] == "a"
    chat_body = {"model": "b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with http.post(f"{sim.url}/v1/chat/completions", json=chat_body) as response:
        chat = await response.json()
    assert chat["object"] == "chat.completion" and chat["model"] == "b"
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert chat["choices"][0]["finish_reason"] == "length"
    assert chat["usage"]["completion_tokens"] == 2


async def test_several_choices_and_logprobs_come_as_vllm_numbers_and_shapes_them(
    sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    body = {"model": "a", "prompt": ["one two", "three"], "max_tokens": 3, "n": 2, "logprobs": 2}
    async with http.post(f"{sim.url}/v1/completions", json=body) as response:
        reply = await response.json()
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2, 3]  # prompt index × n + sample
    assert reply["usage"]["completion_tokens"] == 12
    assert reply["usage"]["prompt_tokens"] == 3 + 2  # each prompt counted once, not per sample
    logprobs = reply["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == 3
    assert "".join(logprobs["tokens"]) == reply["choices"][0]["text"]
    assert logprobs["text_offset"][0] == 0 and logprobs["text_offset"][1] == len(logprobs["tokens"][0])
    for token, logprob, top in zip(
        logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
    ):
        assert top[token] == logprob and len(top) == 3  # the sampled token on top of the 2 best
    chat = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "n": 3,
            "logprobs": True, "top_logprobs": 1}  # fmt: skip
    async with http.post(f"{sim.url}/v1/chat/completions", json=chat) as response:
        reply = await response.json()
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2]
    [first, _] = reply["choices"][0]["logprobs"]["content"]
    assert first["bytes"] == list(first["token"].encode()) and len(first["top_logprobs"]) == 1
    chat["top_logprobs"], chat["logprobs"] = 2, False
    async with http.post(f"{sim.url}/v1/chat/completions", json=chat) as response:
        assert response.status == 400
        assert "`logprobs` must be set to true" in (await response.json())["error"]["message"]


async def test_the_responses_api_answers_a_plain_text_request(
    sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    body = {"model": "a", "input": "say hi", "max_output_tokens": 2}
    async with http.post(f"{sim.url}/v1/responses", json=body) as response:
        reply = await response.json()
    assert (reply["object"], reply["model"], reply["status"]) == ("response", "a", "incomplete")
    assert reply["incomplete_details"] == {"reason": "max_output_tokens"}
    assert reply["usage"]["output_tokens"] == 2
    [message] = reply["output"]
    assert message["role"] == "assistant" and message["content"][0]["type"] == "output_text"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "one two three four five", "max_tokens": 64}),
        ("/v1/responses", {"input": "one two three four five", "max_output_tokens": 64}),
    ],
    ids=["completions", "responses"],
)
async def test_a_request_the_kv_cache_cannot_hold_is_refused_and_leaves_no_load(
    http: aiohttp.ClientSession, path: str, body: dict[str, object]
) -> None:
    small = start_sim(
        "127.0.0.3", "--served-model-name", "base", "--kv-cache-tokens", "32", "--block-size", "16"
    )
    try:
        async with http.post(f"{small.url}{path}", json={"model": "base", **body}) as response:
            assert response.status == 400
            assert "exceeds the KV cache" in (await response.json())["error"]["message"]
        async with http.get(f"{small.url}/load") as response:
            assert await response.json() == {"server_load": 0}
    finally:
        assert stop_sim(small) == 0


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_streaming_is_well_formed_sse(sim: SimProcess, http: aiohttp.ClientSession, chat: bool) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body: dict[str, object] = {
        "model": "a",
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    body.update({"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"})
    async with http.post(f"{sim.url}{path}", json=body) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert response.headers["x-inference-pod"] == "pod-a"
        raw = (await response.read()).decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    token_chunks = [c for c in chunks if c["choices"] and (not chat or "content" in c["choices"][0]["delta"])]
    if chat:
        token_chunks = [c for c in token_chunks if c["choices"][0]["delta"].get("role") is None]
    assert len(token_chunks) == 4
    assert [c["choices"][0]["finish_reason"] for c in token_chunks] == [None, None, None, "length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert {c["model"] for c in chunks} == {"a"}


@pytest.mark.parametrize(
    ("body", "status", "error_type", "param"),
    [
        ({"model": "no-such-model", "prompt": "x"}, 404, "NotFoundError", "model"),
        ({"model": "base/a", "prompt": "x"}, 404, "NotFoundError", "model"),
        ({"model": "base", "prompt": "x", "max_tokens": 600}, 400, "BadRequestError", "max_tokens"),
        ({"model": "base"}, 400, "BadRequestError", "prompt"),
        ({"model": "base", "prompt": "x", "max_tokens": "many"}, 400, "Bad Request", "body.max_tokens"),
    ],
    ids=["unknown-model", "base-slash-adapter", "max-tokens-too-large", "no-prompt", "not-a-number"],
)
async def test_bad_requests_get_vllm_error_bodies(
    sim: SimProcess,
    http: aiohttp.ClientSession,
    body: dict[str, object],
    status: int,
    error_type: str,
    param: str,
) -> None:
    async with http.post(f"{sim.url}/v1/completions", json=body) as response:
        assert response.status == status
        assert response.headers["x-inference-pod"] == "pod-a"
        assert response.content_type == "application/json"
        error = (await response.json())["error"]
    assert (error["type"], error["param"], error["code"]) == (error_type, param, status)
    if error_type == "NotFoundError":
        assert (
            error["message"]
            == f"The model `{body['model']}` does not exist. Valid aliases: base, base-alias."
        )
    async with http.get(f"{sim.url}/health") as response:
        assert response.status == 200  # still serving


async def test_swaps_are_counted_per_adapter(sim: SimProcess, http: aiohttp.ClientSession) -> None:
    for model in ["a", "a", "b", "a", None, "b"]:
        await complete(http, sim.url, model, max_tokens=1)
    # one slot: a (load), a (hit), b (evicts a), a (evicts b), base (no slot), b (evicts a)
    assert loads_of(await metrics(http, sim.url)) == {"a": 2.0, "b": 2.0}
    values = await metrics(http, sim.url)
    success = values[
        (
            "vllm:request_success_total",
            (("engine", "0"), ("finished_reason", "length"), ("model_name", "base")),
        )
    ]
    assert success == 6


async def test_concurrent_requests_on_two_adapters_wait_deferred(
    sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    async def long_request(model: str, tokens: int) -> dict[str, object]:
        return await complete(http, sim.url, model, max_tokens=tokens)

    long_a = asyncio.create_task(long_request("a", 300))
    await running_on(http, sim.url, 1)  # a holds the only slot before b asks
    short_b = asyncio.create_task(long_request("b", 1))
    seen_deferred = 0.0
    for _ in range(50):  # bounded poll while a holds the only slot
        values = await metrics(http, sim.url)
        key = (
            "vllm:num_requests_waiting_by_reason",
            (("engine", "0"), ("model_name", "base"), ("reason", "deferred")),
        )
        seen_deferred = max(seen_deferred, values[key])
        if seen_deferred or long_a.done():
            break
        await asyncio.sleep(0.02)
    await asyncio.wait_for(asyncio.gather(long_a, short_b), timeout=20)
    assert seen_deferred == 1
    newest = max(
        (
            (dict(labels), v)
            for (name, labels), v in (await metrics(http, sim.url)).items()
            if name == "vllm:lora_requests_info"
        ),
        key=lambda item: item[1],
    )[0]
    assert newest["running_lora_adapters"] == "" == newest["waiting_lora_adapters"]  # drained


async def test_runtime_load_and_unload(sim: SimProcess, http: aiohttp.ClientSession, tmp_path: Path) -> None:
    adapter_dir = str(tmp_path / "lora-c")

    async def post(path: str, body: dict[str, object]) -> tuple[int, str, str | None]:
        async with http.post(f"{sim.url}{path}", json=body) as response:
            assert response.headers["x-inference-pod"] == "pod-a"
            return response.status, await response.text(), response.headers.get("Content-Type")

    status, text, _ = await post("/v1/load_lora_adapter", {"lora_name": "c", "lora_path": adapter_dir})
    assert (status, text) == (200, "Success: LoRA adapter 'c' added successfully.")
    assert (await complete(http, sim.url, "c"))["model"] == "c"
    async with http.get(f"{sim.url}/v1/models") as response:
        assert [m["id"] for m in (await response.json())["data"]][-1] == "c"

    status, text, ctype = await post("/v1/load_lora_adapter", {"lora_name": "c", "lora_path": adapter_dir})
    assert status == 400 and ctype is not None and ctype.startswith("application/json")
    assert json.loads(text)["error"] == {
        "message": "The lora adapter 'c' has already been loaded. If you want to load the adapter in place, "
        "set 'load_inplace' to True.",
        "type": "InvalidUserInput",
        "param": None,
        "code": 400,
    }
    status, _, _ = await post(
        "/v1/load_lora_adapter", {"lora_name": "c", "lora_path": adapter_dir, "load_inplace": True}
    )
    assert status == 200
    status, text, _ = await post("/v1/load_lora_adapter", {"lora_name": "base", "lora_path": adapter_dir})
    assert status == 400 and "conflicts with a served base model" in text
    status, text, _ = await post("/v1/load_lora_adapter", {"lora_name": "bad", "lora_path": "/no/such/dir"})
    assert status == 404  # absolute paths stay out of error messages, as in vLLM
    assert json.loads(text)["error"]["message"] == "Loading lora bad failed: No adapter found for <path>"
    status, text, _ = await post("/v1/load_lora_adapter", {"lora_name": "bad", "lora_path": str(tmp_path)})
    assert status == 404  # a directory, but no adapter in it
    status, text, _ = await post("/v1/load_lora_adapter", {"lora_name": "d"})
    assert status == 400 and json.loads(text)["error"]["param"] == "body.lora_path"

    status, text, _ = await post("/v1/unload_lora_adapter", {"lora_name": "c"})
    assert (status, text) == (200, "Success: LoRA adapter 'c' removed successfully.")
    async with http.post(f"{sim.url}/v1/completions", json={"model": "c", "prompt": "x"}) as response:
        assert response.status == 404
    status, text, _ = await post("/v1/unload_lora_adapter", {"lora_name": "c"})
    assert status == 404
    assert json.loads(text)["error"] == {
        "message": "The lora adapter 'c' cannot be found.",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }
    # aliases: POST /adapters and DELETE /adapters/{name}
    status, _, _ = await post("/adapters", {"lora_name": "c", "lora_path": adapter_dir})
    assert status == 200
    async with http.delete(f"{sim.url}/adapters/c") as response:
        assert response.status == 200


def test_runtime_lora_api_can_be_disabled() -> None:
    proc = start_sim("127.0.0.3", "--allow-runtime-lora-updating=false", "--lora-modules", "a=/x")
    try:

        async def probe() -> tuple[int, object]:
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    f"{proc.url}/v1/load_lora_adapter", json={"lora_name": "z", "lora_path": "/z"}
                ) as response,
            ):
                return response.status, await response.json()

        assert asyncio.run(probe()) == (404, {"detail": "Not Found"})
    finally:
        assert stop_sim(proc) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_exits_cleanly_on_signals(sig: signal.Signals) -> None:
    proc = start_sim("127.0.0.4", "--pod-name", "pod-z")
    proc.process.send_signal(sig)
    assert proc.process.wait(timeout=10) == 0


def test_bad_flags_exit_with_a_clear_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "epp", "sim", "--max-loras", "3", "--max-cpu-loras", "2"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ},
    )
    assert result.returncode == 2
    assert "--max-cpu-loras (2) must be ≥ --max-loras (3)" in result.stderr


async def test_client_leaving_a_stream_aborts_the_request(
    sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    body = {"model": "a", "prompt": "hi", "max_tokens": 400, "stream": True}
    async with http.post(f"{sim.url}/v1/completions", json=body) as response:
        assert response.status == 200
        await response.content.readline()  # first chunk arrived; now hang up
    abort_key = (
        "vllm:request_success_total",
        (("engine", "0"), ("finished_reason", "abort"), ("model_name", "base")),
    )
    aborted = 0.0
    for _ in range(100):  # bounded: the server notices the closed connection on its next write
        values = await metrics(http, sim.url)
        aborted = values[abort_key]
        running = values[("vllm:num_requests_running", (("engine", "0"), ("model_name", "base")))]
        if aborted and not running:
            break
        await asyncio.sleep(0.02)
    assert aborted == 1
    assert (await complete(http, sim.url, "b"))["model"] == "b"


async def test_sigterm_lets_in_flight_requests_finish(http: aiohttp.ClientSession) -> None:
    proc = start_sim("127.0.0.5", "--inter-token-latency", "2ms", "--time-to-first-token", "1ms")
    try:
        request = asyncio.create_task(
            http.post(f"{proc.url}/v1/completions", json={"prompt": "x", "max_tokens": 150})
        )
        await running_on(http, proc.url, 1)  # in flight when the signal comes
        proc.process.send_signal(signal.SIGTERM)
        response = await asyncio.wait_for(request, timeout=10)
        assert response.status == 200
        assert (await response.json())["usage"]["completion_tokens"] == 150
        response.release()
        assert proc.process.wait(timeout=10) == 0  # exits by itself once the request is done
    finally:
        if proc.process.poll() is None:
            proc.process.kill()
            proc.process.wait(timeout=10)
