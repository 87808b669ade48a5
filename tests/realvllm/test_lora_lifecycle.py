"""Unloading and reloading an adapter on a real vLLM, as the pod model (`epp.tools.vllm_pod.lora`) assumes.

The pod model says an unload drops only the adapter's name: requests for it fail, its weights
stay cached until newer adapters push them out, and the same name loaded again is a new adapter
read from storage (`LoraSlots.forget`, `LoraSlots.register`). vLLM 0.32.0's `/metrics` shows none
of that, so it is checked through what a client sees: the status of a request for the unloaded
name, which weights the reloaded name answers with (temperature 0, adapters with distinct
weights), that more adapters than the host tier holds still all run after the unload, and that
no metric family reports the host tier. The adapters' paths come from `/v1/models`, so the test
also runs against servers it did not start (`EPP_VLLM_URLS`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.realvllm.client import (
    RawPage,
    RealPod,
    Reply,
    completion,
    concurrent_completions,
    get_text,
    post_json,
    scrape,
)

TOKENS = 4


def _text(pod: RealPod, model: str) -> str:
    reply = completion(pod.url, model, TOKENS)
    assert reply.status == 200, reply.body[:300]
    choices = reply.json()["choices"]
    assert isinstance(choices, list)
    return str(choices[0]["text"])


def _load(pod: RealPod, name: str, path: str) -> Reply:
    return post_json(f"{pod.url}/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})


def _unload(pod: RealPod, name: str) -> Reply:
    return post_json(f"{pod.url}/v1/unload_lora_adapter", {"lora_name": name})


def _paths(pod: RealPod) -> dict[str, str]:
    """Each registered adapter's directory, as `/v1/models` reports it (`root`)."""
    cards = json.loads(get_text(f"{pod.url}/v1/models"))["data"]
    return {str(card["id"]): str(card["root"]) for card in cards}


@pytest.fixture
def pod(real_pods: list[RealPod]) -> Iterator[RealPod]:
    """The second server; afterwards its adapters are registered again from their own directories,
    in their first order (`/v1/models` lists them in registration order, and other tests compare
    that listing with `epp sim`'s)."""
    target = real_pods[1]
    base = json.loads(get_text(f"{target.url}/v1/models"))["data"][0]["id"]
    original = {name: path for name, path in _paths(target).items() if name != base}
    yield target
    for name in original:
        _unload(target, name)  # whatever state the test left it in
    for name, path in original.items():
        assert _load(target, name, path).status == 200


def test_an_unloaded_adapter_is_gone_by_name_and_a_reload_reads_its_weights_again(pod: RealPod) -> None:
    paths = _paths(pod)
    lora_0, lora_1 = _text(pod, "lora-0"), _text(pod, "lora-1")
    assert lora_0 != lora_1  # distinct weights, so the reply tells which copy served it

    assert _unload(pod, "lora-0").status == 200
    assert completion(pod.url, "lora-0", TOKENS).status == 404  # not reloaded on demand
    assert "lora-0" not in _paths(pod)

    # The same name from lora-1's directory: vLLM gives it a new adapter id and reads storage,
    # so the copy it still caches under the old id must not answer.
    assert _load(pod, "lora-0", paths["lora-1"]).status == 200
    assert _text(pod, "lora-0") == lora_1


def test_the_unloaded_copys_room_is_reused(pod: RealPod) -> None:
    """With --max-cpu-loras 4 and the unloaded copy still cached, four more adapters still all run."""
    paths = _paths(pod)
    assert _text(pod, "lora-0")
    assert _unload(pod, "lora-0").status == 200
    assert _load(pod, "lora-0", paths["lora-0"]).status == 200  # a fifth adapter id
    replies = concurrent_completions(pod.url, ["lora-0", "lora-1", "lora-2", "lora-3"], TOKENS)
    assert [reply.status for reply in replies] == [200] * 4


def test_metrics_report_requests_per_adapter_and_nothing_of_the_host_tier(real_pods: list[RealPod]) -> None:
    """The scraper's inputs are all vLLM exposes about LoRA: residency has to be modelled, not read."""
    pod = real_pods[1]
    assert _text(pod, "lora-1")  # at least one adapter combination reported
    page = RawPage.parse(scrape(pod))
    lora_families = {name for name in page.types if "lora" in name}
    assert lora_families == {"vllm:lora_requests_info"}
    info_labels = {key for sample in page.series("vllm:lora_requests_info") for key in sample.labels}
    assert info_labels == {"max_lora", "running_lora_adapters", "waiting_lora_adapters"}
    reasons = {s.labels["reason"] for s in page.series("vllm:num_requests_waiting_by_reason")}
    assert reasons == {"capacity", "deferred"}
