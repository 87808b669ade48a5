"""What a BUFFERED request body costs against FULL_DUPLEX_STREAMED, through real Envoy.

Run:  .venv/bin/python benchmarks/buffered_body.py [--requests 30] [--concurrency 16] [--tokens 200000]

Starts two loopback gateways side by side (`epp sim` pods, `epp serve`, Envoy from `epp
envoy-config`'s builder), one per request body mode, and sends both the same long-prompt
completions (`--tokens` words, about 1 MB of JSON at 200k), alternating between them so that
machine noise falls on both alike:

- latency: requests one at a time, client-side time from the first byte sent to the last byte of
  the answer (one output token, so the body's trip dominates); median and p90 per mode;
- Envoy memory: `--concurrency` requests at once, the bytes Envoy has allocated (admin `/memory`,
  what the `server.memory_allocated` stat reports at each flush) sampled every 10 ms; the peak
  above the idle value per mode.

In BUFFERED Envoy holds each body whole while the EPP routes (and can fail open if the EPP dies);
in FULL_DUPLEX_STREAMED it streams the body to the EPP, which holds it instead and streams it back.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import http.client
import json
import statistics
import threading
import time

from epp.picker.extproc.stream import BodyMode
from epp.tools.localstack import LocalStack, SimOptions, StackOptions


def _stack_options(mode: BodyMode, tokens: int) -> StackOptions:
    sim = SimOptions(
        adapters=("adapter-0",),
        time_to_first_token_s=0.0,
        extra_args=("--max-model-len", str(tokens * 2), "--kv-cache-tokens", str(tokens * 64)),
    )
    return StackOptions(pods=2, sim=sim, body_mode=mode)


def _body(tokens: int) -> bytes:
    # The simulator counts one token per word: `tokens` words of about five bytes each.
    prompt = " ".join(f"w{i % 1000:03d}" for i in range(tokens - 1))
    return json.dumps({"model": "adapter-0", "prompt": prompt, "max_tokens": 1}).encode()


def _post(stack: LocalStack, body: bytes) -> float:
    """Seconds from sending `body` to the end of its answer; raises unless the answer is 200."""
    host, port = stack.gateway_url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        started = time.perf_counter()
        connection.request("POST", "/v1/completions", body, {"content-type": "application/json"})
        response = connection.getresponse()
        data = response.read()
        elapsed = time.perf_counter() - started
    finally:
        connection.close()
    if response.status != 200:
        raise RuntimeError(f"status {response.status}: {data[:200]!r}")
    return elapsed


def _allocated(stack: LocalStack) -> int:
    assert stack.envoy is not None
    # `/memory` reads the allocator now; the `server.memory_allocated` gauge moves once per stats flush.
    return int(json.loads(stack.envoy.admin_get("/memory"))["allocated"])


@dataclasses.dataclass(slots=True)
class Figures:
    latencies_s: list[float] = dataclasses.field(default_factory=list)
    idle_bytes: int = 0
    peak_bytes: int = 0


def _burst(stack: LocalStack, body: bytes, concurrency: int, figures: Figures) -> None:
    """`concurrency` requests at once while Envoy's allocated memory is sampled."""
    figures.idle_bytes = _allocated(stack)
    done = threading.Event()
    peak = figures.idle_bytes

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _allocated(stack))
            done.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(lambda _: _post(stack, body), range(concurrency)))
    done.set()
    sampler.join(timeout=5)
    figures.peak_bytes = peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30, help="sequential requests per mode")
    parser.add_argument("--concurrency", type=int, default=16, help="requests at once for the memory peak")
    parser.add_argument("--tokens", type=int, default=200_000, help="prompt length in (simulated) tokens")
    args = parser.parse_args()
    body = _body(args.tokens)
    modes = (BodyMode.FULL_DUPLEX_STREAMED, BodyMode.BUFFERED)
    figures = {mode: Figures() for mode in modes}
    stacks = {mode: LocalStack(_stack_options(mode, args.tokens)) for mode in modes}
    try:
        for stack in stacks.values():
            stack.start()
        for mode in modes:  # warm both: connections to the EPP and the pods open
            for _ in range(3):
                _post(stacks[mode], body)
        for _ in range(args.requests):
            for mode in modes:
                figures[mode].latencies_s.append(_post(stacks[mode], body))
        for mode in modes:
            _burst(stacks[mode], body, args.concurrency, figures[mode])
    finally:
        for stack in stacks.values():
            stack.stop()
    print(f"body {len(body) / 1e6:.2f} MB ({args.tokens} tokens), {args.requests} requests per mode")
    print(f"{'mode':<22}{'p50 ms':>9}{'p90 ms':>9}{'Envoy peak above idle, MB':>28}")
    for mode in modes:
        fig = figures[mode]
        ordered = sorted(fig.latencies_s)
        p50 = statistics.median(ordered) * 1000
        p90 = ordered[int(0.9 * (len(ordered) - 1))] * 1000
        extra = (fig.peak_bytes - fig.idle_bytes) / 1e6
        print(f"{mode.value:<22}{p50:>9.1f}{p90:>9.1f}{extra:>28.1f}")
    fdx, buffered = (statistics.median(figures[m].latencies_s) for m in modes)
    print(f"BUFFERED / FULL_DUPLEX_STREAMED median latency: {buffered / fdx:.2f}")


if __name__ == "__main__":
    main()
