"""Responses lost when the EPP leaves the ext_proc stream after routing, per gateway profile.

Run:  .venv/bin/python benchmarks/leave_stream.py [--requests 5000] [--concurrency 16]

For each gateway profile (`epp.tools.envoy.profiles`: the ext_proc filter kgateway, Istio and
Envoy AI Gateway build, response processing on), starts a loopback stack: real Envoy, `epp serve`,
and simulated model servers that answer at once (no time to first token, none between tokens), the case where
a response can reach Envoy soonest after the request goes upstream. Once the gateway's access log
reaches the EPP (so it leaves streams after routing), sends `--requests` completions, half
streamed (SSE), half JSON, and counts those not whole: an SSE stream without every chunk, its
usage and `[DONE]`, or a JSON body that does not parse to the full usage. Prints one line per
profile with the EPP's ext_proc messages per request. The target is 0 lost.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from epp.picker.extproc.stream import BodyMode
from epp.tools.envoy.profiles import PROFILES, Gateway, apply_profile
from epp.tools.localstack import LocalStack, SimOptions, StackOptions

ADAPTERS = ("adapter-0", "adapter-1", "adapter-2", "adapter-3")
TOKENS = 3


def counts(stack: LocalStack) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{stack.epp_metrics_port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("inference_extension_ext_proc_"):
            for sample in family.samples:
                found[f"{sample.name}:{','.join(sample.labels.values())}"] = sample.value
    return found


def one(stack: LocalStack, index: int) -> bool:
    """One completion; whether it came back whole."""
    stream = index % 2 == 0
    body: dict[str, object] = {"model": ADAPTERS[index % len(ADAPTERS)], "prompt": "hi", "max_tokens": TOKENS}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    host, port = stack.gateway_url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
        response = connection.getresponse()
        data = response.read()
    except OSError:
        return False
    finally:
        connection.close()
    if response.status != 200:
        return False
    try:
        if not stream:
            return bool(json.loads(data)["usage"]["completion_tokens"] == TOKENS)
        events = [e.removeprefix(b"data: ") for e in data.split(b"\n\n") if e.strip()]
        if not events or events[-1] != b"[DONE]":
            return False
        payloads = [json.loads(e) for e in events[:-1]]
        texts = sum(1 for p in payloads for c in p.get("choices", []) if c.get("text"))
        usage = [p["usage"]["completion_tokens"] for p in payloads if p.get("usage")]
        return texts == TOKENS and usage == [TOKENS]
    except (ValueError, KeyError):
        return False


def run(gateway: Gateway, requests: int, concurrency: int) -> str:
    profile = PROFILES[gateway]
    sim = SimOptions(
        adapters=ADAPTERS, time_to_first_token_s=0.0, inter_token_latency_s=0.0, lora_load_latency_s=0.0
    )
    options = StackOptions(
        pods=3,
        sim=sim,
        body_mode=BodyMode.FULL_DUPLEX_STREAMED,
        envoy_bootstrap_hook=lambda bootstrap: apply_profile(bootstrap, profile),
    )
    with LocalStack(options) as stack:
        deadline = time.monotonic() + 30
        while counts(stack).get("inference_extension_ext_proc_streams_total:left-after-routing", 0) == 0:
            if time.monotonic() > deadline:
                return f"{gateway.value}: the EPP never left a stream (no access log reached it)"
            one(stack, 1)
        before = counts(stack)
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
            whole = list(pool.map(lambda i: one(stack, i), range(requests)))
        elapsed = time.monotonic() - started
        after = counts(stack)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    received = delta.get("inference_extension_ext_proc_messages_total:received", 0)
    sent = delta.get("inference_extension_ext_proc_messages_total:sent", 0)
    left = delta.get("inference_extension_ext_proc_streams_total:left-after-routing", 0)
    return (
        f"{gateway.value}: {requests} requests in {elapsed:.1f}s, lost {whole.count(False)}, "
        f"streams left after routing {left:.0f}, ext_proc messages per request "
        f"{received / requests:.2f} received + {sent / requests:.2f} sent"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--gateway", choices=[g.value for g in Gateway], action="append")
    args = parser.parse_args()
    gateways = [Gateway(g) for g in args.gateway] if args.gateway else list(Gateway)
    for gateway in gateways:
        print(run(gateway, args.requests, args.concurrency), flush=True)


if __name__ == "__main__":
    main()
