"""The engine's scheduling and timing model, stepped in simulated time."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from epp.tools.sim.engine import Engine, EngineConfig, EngineStats, FinishedRequest, StepPlan
from epp.tools.vllm_pod.cost import LatencyCost

FAST = EngineConfig(
    max_num_seqs=8,
    max_loras=1,
    max_cpu_loras=2,
    cost=LatencyCost(
        time_to_first_token_s=0.020,
        inter_token_latency_s=0.005,
        lora_load_latency_s=0.050,
        lora_cpu_load_latency_s=0.002,
        itl_batch_factor=0.0,
        lora_step_slowdown=0.0,
    ),
    kv_cache_tokens=4096,
    block_size=16,
)


@dataclass
class Run:
    """What a simulated run produced, step by step."""

    plans: list[StepPlan] = field(default_factory=list)
    stats_after_plan: list[EngineStats] = field(default_factory=list)
    finished: dict[str, FinishedRequest] = field(default_factory=dict)
    token_times: dict[str, list[float]] = field(default_factory=dict)
    end_s: float = 0.0


def drive(engine: Engine, start_s: float = 0.0, max_steps: int = 10_000) -> Run:
    """Step the engine until idle, advancing simulated time by each step's duration."""
    run, now = Run(), start_s
    for _ in range(max_steps):
        if not engine.has_work():
            break
        plan = engine.plan_step(now)
        run.plans.append(plan)
        run.stats_after_plan.append(engine.stats)
        now += plan.duration_s
        outcome = engine.finish_step(now)
        for token in outcome.tokens:
            run.token_times.setdefault(token.request_id, []).append(now)
        run.finished.update({f.request_id: f for f in outcome.finished})
    else:
        raise AssertionError("engine did not drain")
    run.end_s = now
    return run


def prompt(n: int, salt: str = "p") -> list[str]:
    return [f"{salt}{i}" for i in range(n)]


def test_single_base_request_timing() -> None:
    engine = Engine(FAST)
    engine.submit("r1", None, prompt(10), 4, now=0.0)
    run = drive(engine)
    # first token after one prefill step, then 3 decode steps
    assert run.token_times["r1"] == pytest.approx([0.020, 0.025, 0.030, 0.035])
    done = run.finished["r1"]
    assert done.finish_reason == "length"
    assert done.time_to_first_token_s == pytest.approx(0.020)
    assert done.inter_token_latencies_s == pytest.approx((0.005, 0.005, 0.005))
    assert done.e2e_latency_s == pytest.approx(0.035)


@pytest.mark.parametrize(
    ("preloaded", "expected_ttft_s"),
    [(False, 0.020 + 0.050), (True, 0.020 + 0.002)],
    ids=["load-from-storage", "load-from-host-memory"],
)
def test_first_request_on_adapter_pays_the_load(preloaded: bool, expected_ttft_s: float) -> None:
    engine = Engine(FAST)
    if preloaded:
        engine.lora.load_to_cpu("a", ())
    engine.submit("r1", "a", prompt(10), 1, now=0.0)
    run = drive(engine)
    assert run.finished["r1"].time_to_first_token_s == pytest.approx(expected_ttft_s)
    assert [a.adapter for p in run.plans for a in p.activations] == ["a"]
    # The adapter stays in its slot: a second request pays no load.
    engine.submit("r2", "a", prompt(10, "q"), 1, now=run.end_s)
    second = drive(engine, start_s=run.end_s)
    assert second.finished["r2"].time_to_first_token_s == pytest.approx(0.020)
    assert all(not p.activations for p in second.plans)


def test_request_for_another_adapter_waits_deferred_for_the_slot() -> None:
    engine = Engine(FAST)  # one GPU slot
    engine.submit("long-a", "a", prompt(4), 20, now=0.0)
    engine.submit("short-b", "b", prompt(4), 1, now=0.0)
    engine.submit("base", None, prompt(4), 1, now=0.0)
    run = drive(engine)
    first = run.stats_after_plan[0]
    assert (first.running, first.waiting_deferred, first.waiting_capacity) == (2, 1, 0)
    assert first.lora_in_flight == ("a",)
    # b only runs once a's request finished and freed the slot
    assert run.finished["short-b"].queue_time_s >= run.finished["long-a"].e2e_latency_s - 1e-9
    assert run.finished["base"].queue_time_s == 0.0
    assert [a.evicted_from_gpu for p in run.plans for a in p.activations] == [None, "a"]


def test_full_batch_waits_for_capacity() -> None:
    engine = Engine(FAST)
    for i in range(10):
        engine.submit(f"r{i}", None, prompt(4, f"s{i}"), 3, now=0.0)
    run = drive(engine)
    first = run.stats_after_plan[0]
    assert (first.running, first.waiting_capacity, first.waiting_deferred) == (8, 2, 0)
    assert max(s.running for s in run.stats_after_plan) <= FAST.max_num_seqs
    assert run.finished["r9"].queue_time_s > 0


@pytest.mark.parametrize(
    ("itl_batch_factor", "batch", "expected_itl_s"),
    [(0.0, 4, 0.005), (0.1, 1, 0.005), (0.1, 4, 0.005 * 1.3), (0.1, 8, 0.005 * 1.7)],
    ids=["flat", "batch-of-one", "batch-4", "batch-8"],
)
def test_inter_token_latency_grows_with_batch(
    itl_batch_factor: float, batch: int, expected_itl_s: float
) -> None:
    engine = Engine(EngineConfig(cost=LatencyCost(itl_batch_factor=itl_batch_factor, lora_step_slowdown=0.0)))
    for i in range(batch):
        engine.submit(f"r{i}", None, prompt(4, f"s{i}"), 5, now=0.0)
    run = drive(engine)
    assert run.finished["r0"].inter_token_latencies_s == pytest.approx((expected_itl_s,) * 4)


def test_distinct_adapters_in_a_batch_slow_every_step() -> None:
    cfg = EngineConfig(
        max_loras=2, max_cpu_loras=2, cost=LatencyCost(itl_batch_factor=0.0, lora_step_slowdown=0.5)
    )
    one, two = Engine(cfg), Engine(cfg)
    one.submit("x", "a", prompt(4), 3, now=0.0)
    one.submit("y", "a", prompt(4, "q"), 3, now=0.0)
    two.submit("x", "a", prompt(4), 3, now=0.0)
    two.submit("y", "b", prompt(4, "q"), 3, now=0.0)
    itl_one = drive(one).finished["x"].inter_token_latencies_s
    itl_two = drive(two).finished["x"].inter_token_latencies_s
    assert itl_one == pytest.approx((0.005, 0.005))
    assert itl_two == pytest.approx((0.0075, 0.0075))


def test_prefix_hits_only_on_the_same_adapter() -> None:
    engine = Engine(EngineConfig(max_loras=2, max_cpu_loras=2, block_size=16))
    text = prompt(40)
    hits = []
    for i, adapter in enumerate([None, None, "a", "a", "b"]):
        engine.submit(f"r{i}", adapter, text, 1, now=0.0)
        hits.append(sum(p.prefix_hits_tokens for p in drive(engine).plans))
    assert hits == [0, 32, 0, 32, 0]


def test_kv_usage_tracks_running_tokens_and_limits_admission() -> None:
    engine = Engine(EngineConfig(kv_cache_tokens=64, block_size=16))  # 4 blocks
    for name in ("r1", "r2", "r3"):
        engine.submit(name, None, prompt(10, name), 20, now=0.0)  # reserves ceil(30/16) = 2 blocks each
    engine.plan_step(0.0)
    stats = engine.stats
    assert (stats.running, stats.waiting_capacity) == (2, 1)  # the third has no KV room
    assert stats.kv_cache_usage == pytest.approx(2 / 4)  # 10 tokens each occupy one block each
    engine.finish_step(0.02)
    run = drive(engine, start_s=0.02)
    assert set(run.finished) == {"r1", "r2", "r3"}
    assert engine.stats.kv_cache_usage == 0.0


def test_submit_rejects_requests_that_can_never_fit() -> None:
    engine = Engine(EngineConfig(kv_cache_tokens=32, block_size=16))
    with pytest.raises(ValueError, match="KV cache"):
        engine.submit("big", None, prompt(30), 10, now=0.0)
    with pytest.raises(ValueError, match="at least one token"):
        engine.submit("empty", None, [], 1, now=0.0)
    assert not engine.has_work()


def test_abort_frees_the_request_and_reports_it() -> None:
    engine = Engine(FAST)
    engine.submit("r1", "a", prompt(4), 50, now=0.0)
    engine.plan_step(0.0)
    engine.finish_step(0.07)
    aborted = engine.abort("r1", now=0.08)
    assert aborted is not None and aborted.finish_reason == "abort"
    assert aborted.generation_tokens == 1
    assert engine.stats.running == 0 and engine.stats.lora_in_flight == ()
    assert engine.abort("r1", now=0.09) is None
    assert not engine.has_work()


def test_plan_and_finish_must_alternate() -> None:
    engine = Engine(FAST)
    engine.submit("r1", None, prompt(4), 2, now=0.0)
    with pytest.raises(RuntimeError):
        engine.finish_step(0.0)
    engine.plan_step(0.0)
    with pytest.raises(RuntimeError):
        engine.plan_step(0.0)


def test_real_busy_run_shape() -> None:
    """The captured busy run (tests/fixtures/vllm-0.32.0/busy.txt): 4 each on lora-0..3 and 2 on base,
    max-loras 2, max-num-seqs 8."""
    engine = Engine(EngineConfig(max_loras=2, max_cpu_loras=4, max_num_seqs=8))
    for adapter in ["lora-0", "lora-1", "lora-2", "lora-3"]:
        for i in range(4):
            engine.submit(f"{adapter}-{i}", adapter, prompt(72, adapter), 200, now=0.0)
    for i in range(2):
        engine.submit(f"base-{i}", None, prompt(72, "base"), 200, now=0.0)
    run = drive(engine)
    first = run.stats_after_plan[0]
    assert (first.running, first.waiting, first.waiting_capacity, first.waiting_deferred) == (8, 10, 10, 0)
    assert first.lora_in_flight == ("lora-0", "lora-1")
    assert all(len(s.lora_in_flight) <= 2 for s in run.stats_after_plan)
    assert all(s.running <= 8 for s in run.stats_after_plan)
    assert len(run.finished) == 18 and engine.stats.lora_in_flight == ()
    # lora-2/3 only start once lora-0/1 requests have left their slots
    assert (
        min(run.finished[f"lora-2-{i}"].queue_time_s for i in range(4))
        >= max(run.finished[f"lora-0-{i}"].e2e_latency_s for i in range(4)) - 1e-9
    )
