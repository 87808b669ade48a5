"""`epp sim` exposes the same `/metrics` shape as real vLLM for the same load.

The simulator is started with the real servers' flags, both get the same requests, and then
every `vllm:` family is compared: type, sample names (`_total`, `_created`, `_bucket`, …),
label names, the values of enumerated labels (`reason`, `finished_reason`, `source`,
`sleep_state`) and histogram bucket bounds. Values themselves differ (the simulator's timings
are not the tiny model's); structure must not. `vllm_sim:` families are the simulator's own.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp.picker.datastore.types import Metrics
from epp.picker.scrape.parse import parse_metrics
from testkit.waiting import poll_until
from tests.realvllm.client import (
    BASE_MODEL,
    RawPage,
    RealPod,
    completion,
    get_text,
    idle,
)
from tests.realvllm.simpod import running_sim

ENUMERATED_LABELS = frozenset({"reason", "finished_reason", "source", "sleep_state", "le", "max_lora"})
SAME_LOAD = (BASE_MODEL, "lora-0", "lora-1", "lora-0")
MAX_TOKENS = 4
SIM_ONLY_PREFIX = "vllm_sim:"


@dataclasses.dataclass(frozen=True, slots=True)
class FamilyShape:
    kind: str
    documentation: str
    sample_names: frozenset[str]
    label_names: frozenset[tuple[str, frozenset[str]]]  # (sample name, its label names)
    enumerated: frozenset[tuple[str, str]]  # (label, value) for ENUMERATED_LABELS

    def diff(self, other: FamilyShape) -> list[str]:
        out = []
        for field in ("kind", "documentation", "sample_names", "label_names", "enumerated"):
            mine, theirs = getattr(self, field), getattr(other, field)
            if mine != theirs:
                if isinstance(mine, frozenset):
                    out.append(
                        f"{field}: real-only {sorted(mine - theirs)}, sim-only {sorted(theirs - mine)}"
                    )
                else:
                    out.append(f"{field}: real {mine!r}, sim {theirs!r}")
        return out


def shapes(text: str) -> dict[str, FamilyShape]:
    result = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(("vllm:", SIM_ONLY_PREFIX)):
            continue
        result[family.name] = FamilyShape(
            kind=family.type,
            documentation=family.documentation,
            sample_names=frozenset(s.name for s in family.samples),
            label_names=frozenset((s.name, frozenset(s.labels)) for s in family.samples),
            enumerated=frozenset(
                (k, v) for s in family.samples for k, v in s.labels.items() if k in ENUMERATED_LABELS
            ),
        )
    return result


def diff_pages(real_text: str, sim_text: str) -> list[str]:
    real, sim = shapes(real_text), shapes(sim_text)
    problems = [f"{name}: only in real vLLM" for name in sorted(real.keys() - sim.keys())]
    problems += [
        f"{name}: only in the simulator"
        for name in sorted(sim.keys() - real.keys())
        if not name.startswith(SIM_ONLY_PREFIX)
    ]
    for name in sorted(real.keys() & sim.keys()):
        problems += [f"{name}: {line}" for line in real[name].diff(sim[name])]
    return problems


@pytest.fixture(scope="module")
def sim_pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealPod]:
    with running_sim(tmp_path_factory.mktemp("sim") / "sim.log") as pod:
        yield pod


def load_counters(text: str) -> dict[str, float]:
    """The counters a load fixes exactly, whatever the server's speed or tokenizer."""
    page = RawPage.parse(text)
    counters = {
        f"request_success_total{{finished_reason={reason}}}": sum(
            s.value for s in page.series("vllm:request_success_total", finished_reason=reason)
        )
        for reason in ("stop", "length", "abort", "error", "repetition")
    }
    for name in (
        "vllm:generation_tokens_total",
        "vllm:request_params_max_tokens_sum",
        "vllm:request_params_max_tokens_count",
        "vllm:request_generation_tokens_sum",
        "vllm:request_params_n_sum",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
        "vllm:num_preemptions_total",
    ):
        counters[name] = page.counter_total(name)
    return counters


def run_same_load(pod: RealPod) -> dict[str, float]:
    before = load_counters(get_text(f"{pod.url}/metrics"))
    for model in SAME_LOAD:
        reply = completion(pod.url, model, MAX_TOKENS)
        assert reply.status == 200, reply.body[:300]
        assert reply.json()["model"] == model
    after = load_counters(get_text(f"{pod.url}/metrics"))
    return {name: after[name] - before[name] for name in after}


def test_simulator_metrics_have_the_real_shape(real_pods: list[RealPod], sim_pod: RealPod) -> None:
    real_pod = real_pods[1]
    real_delta, sim_delta = run_same_load(real_pod), run_same_load(sim_pod)
    problems = diff_pages(get_text(f"{real_pod.url}/metrics"), get_text(f"{sim_pod.url}/metrics"))
    assert not problems, "simulator /metrics drifted from real vLLM 0.32.0:\n" + "\n".join(problems)
    assert sim_delta == real_delta, "the same load moved the counters differently (real, sim)"


def test_simulator_lora_info_after_a_drain_matches_real(real_pods: list[RealPod], sim_pod: RealPod) -> None:
    """Both end a drained load with the all-empty combination as the newest sample."""
    for pod in (real_pods[1], sim_pod):
        assert completion(pod.url, "lora-3", 2).status == 200
        assert poll_until(functools.partial(idle, [pod]), within_s=30)
        newest = RawPage.parse(get_text(f"{pod.url}/metrics")).newest_lora()
        assert newest is not None
        assert (newest.labels["running_lora_adapters"], newest.labels["waiting_lora_adapters"]) == ("", ""), (
            pod
        )


def test_the_diff_catches_a_drift(real_pods: list[RealPod]) -> None:
    """A renamed label or a missing family must show up, or the test above proves nothing."""
    text = get_text(f"{real_pods[0].url}/metrics")
    assert diff_pages(text, text) == []
    renamed = text.replace('reason="deferred"', 'reason="lora"')
    assert any("num_requests_waiting_by_reason" in p for p in diff_pages(text, renamed))
    dropped = "\n".join(line for line in text.splitlines() if "vllm:num_preemptions" not in line) + "\n"
    assert "vllm:num_preemptions: only in real vLLM" in diff_pages(text, dropped)


def slot_pressure_view(pod: RealPod) -> tuple[int, int, int, frozenset[str], int]:
    """Both slots held by long requests, then a third adapter: the scrape once it is deferred."""
    assert poll_until(lambda: idle([pod]), within_s=60)
    with concurrent.futures.ThreadPoolExecutor(max_workers=5) as pool:
        holders = [pool.submit(completion, pod.url, m, 300) for m in ("lora-0", "lora-0", "lora-1", "lora-1")]
        assert poll_until(
            lambda: parse_metrics(get_text(f"{pod.url}/metrics"), 0.0).running_requests == 4, within_s=30
        )
        late = pool.submit(completion, pod.url, "lora-2", 5)
        seen: list[Metrics] = []

        def deferred() -> bool:
            seen.append(parse_metrics(get_text(f"{pod.url}/metrics"), 0.0))
            return seen[-1].deferred_requests > 0

        assert poll_until(deferred, within_s=30, interval_s=0.02), f"{pod.name}: nothing deferred"
        assert all(f.result().status == 200 for f in [*holders, late])
    m = seen[-1]
    return m.running_requests, m.waiting_requests, m.deferred_requests, m.active_adapters, m.max_lora


def test_simulator_defers_a_third_adapter_like_real(real_pods: list[RealPod], sim_pod: RealPod) -> None:
    real = slot_pressure_view(real_pods[1])
    assert real == (4, 1, 1, frozenset({"lora-0", "lora-1"}), 2)
    assert slot_pressure_view(sim_pod) == real
