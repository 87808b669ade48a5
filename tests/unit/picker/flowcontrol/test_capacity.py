"""Gates: which endpoints can start a request now (pool saturation, or request headroom and LoRA slots)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from epp.picker.admission.saturation import SaturationDetector
from epp.picker.datastore.types import EndpointState
from epp.picker.flowcontrol.capacity import OVERLOADED_HOLD_S, SaturationGate, SlotGate
from epp.picker.scheduling.ledger import BASE_MODEL
from epp.picker.scheduling.state import SchedulerState
from epp.picker.scheduling.types import LLMRequest, NamedCandidates
from tests.unit.picker.scheduling.helpers import BASE, endpoint_state

NOW = 100.0
DETECTOR = SaturationDetector(queue_depth_threshold=5, kv_cache_util_threshold=0.8, staleness_threshold_s=2.0)
DRAIN_AFTER_S = 1.0


def request(model: str) -> LLMRequest:
    return LLMRequest(request_id=f"ask-{model}", incoming_model=model, target_model=model)


class Pool:
    """A scheduler state, a slot gate over it, and the routing ledger driven by hand."""

    def __init__(self) -> None:
        self.state = SchedulerState.create(seed=0, staleness_threshold_s=DETECTOR.staleness_threshold_s)
        self.gate = SlotGate(self.state, DETECTOR, drain_after_s=DRAIN_AFTER_S)
        self._keys = itertools.count()

    def route(self, pod: EndpointState, adapter: str, at: float = NOW - 10.0) -> str:
        key = f"k{next(self._keys)}"
        self.state.ledger.routed(key, pod.name, adapter, at)
        return key

    def finish(self, key: str, at: float) -> None:
        assert self.state.ledger.finished(key, at) is not None

    def can_start(self, model: str, pods: Sequence[EndpointState], now: float = NOW) -> list[str]:
        return [e.name for e in self.gate.placeable(request(model), pods, now)]


# -- one endpoint, one request ------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    pod: EndpointState
    ours: tuple[str, ...]  # adapters of the requests we have in flight there (BASE_MODEL: the base model)
    model: str
    starts: bool


CASES = {
    # slots
    "joins-its-adapter-in-flight-on-a-full-pod": Case(
        endpoint_state(0, updated_at=NOW), ("a", "b"), "a", True
    ),
    "a-new-adapter-waits-on-a-full-pod": Case(endpoint_state(0, updated_at=NOW), ("a", "b"), "c", False),
    "a-free-slot-admits-a-new-adapter": Case(endpoint_state(0, updated_at=NOW), ("a", "a"), "c", True),
    "scraped-adapters-hold-slots": Case(endpoint_state(0, updated_at=NOW, active={"x"}), ("a",), "c", False),
    "an-adapter-both-scraped-and-ours-counts-once": Case(
        endpoint_state(0, updated_at=NOW, active={"a"}), ("a",), "c", True
    ),
    "deferred-requests-mean-full": Case(
        endpoint_state(0, updated_at=NOW, max_lora=4, deferred=1), ("a",), "c", False
    ),
    "deferred-requests-still-let-an-adapter-join": Case(
        endpoint_state(0, updated_at=NOW, max_lora=4, deferred=1), ("a",), "a", True
    ),
    "base-model-needs-no-slot": Case(endpoint_state(0, updated_at=NOW, max_lora=1), ("a",), BASE, True),
    "base-model-in-flight-holds-no-slot": Case(
        endpoint_state(0, updated_at=NOW, max_lora=1), (BASE_MODEL, BASE_MODEL), "c", True
    ),
    # vLLM writes max_lora only once it has served a LoRA request: until then, the default 4 slots.
    "no-lora-slots-reported-counts-the-default-slots": Case(
        endpoint_state(0, updated_at=NOW, lora_enabled=False), ("a", "b", "c"), "d", True
    ),
    "no-lora-slots-reported-is-full-at-the-default": Case(
        endpoint_state(0, updated_at=NOW, lora_enabled=False), ("a", "b", "c", "d"), "e", False
    ),
    "never-scraped-counts-the-default-slots": Case(
        endpoint_state(0, updated_at=None), ("a", "b", "c"), "d", True
    ),
    "never-scraped-is-full-at-the-default": Case(
        endpoint_state(0, updated_at=None), ("a", "b", "c", "d"), "e", False
    ),
    # headroom
    "queue-at-threshold": Case(endpoint_state(0, updated_at=NOW, waiting=5), (), "a", True),
    "queue-over-threshold": Case(endpoint_state(0, updated_at=NOW, waiting=6), ("a",), "a", False),
    "deferred-requests-are-not-queue-depth": Case(
        endpoint_state(0, updated_at=NOW, waiting=8, deferred=3, max_lora=4), ("a",), "a", True
    ),
    "kv-at-threshold": Case(endpoint_state(0, updated_at=NOW, kv=0.8), (), "a", True),
    "kv-over-threshold": Case(endpoint_state(0, updated_at=NOW, kv=0.81), (), "a", False),
    "headroom-binds-the-base-model-too": Case(endpoint_state(0, updated_at=NOW, waiting=6), (), BASE, False),
    "stale-metrics-are-not-evidence": Case(
        endpoint_state(0, updated_at=NOW - 2.5, waiting=50, kv=1.0), (), "a", True
    ),
    "failed-scrape-is-not-evidence": Case(
        endpoint_state(0, updated_at=NOW, waiting=50, kv=1.0, scrape_failures=1), (), "a", True
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_an_endpoint_can_start_a_request_with_headroom_and_a_slot(case: Case) -> None:
    pool = Pool()
    for adapter in case.ours:
        pool.route(case.pod, adapter)

    assert pool.can_start(case.model, [case.pod]) == ([case.pod.name] if case.starts else [])


@pytest.mark.parametrize(
    ("finished_at", "starts"),
    [(NOW - 0.5, True), (NOW - 1.5, False)],
    ids=["finish-after-the-scrape", "finish-before-the-scrape"],
)
def test_deferred_requests_count_only_when_scraped_after_our_last_finish_there(
    finished_at: float, starts: bool
) -> None:
    pool = Pool()
    pod = endpoint_state(0, updated_at=NOW - 1.0, max_lora=3, deferred=2)
    pool.route(pod, "a")
    pool.finish(pool.route(pod, "b"), at=finished_at)

    assert pool.can_start("c", [pod]) == ([pod.name] if starts else [])


@pytest.mark.parametrize(
    ("finished_at", "starts"),
    [(None, False), (NOW - 0.5, True), (NOW - 1.5, False)],
    ids=["never-ours", "we-saw-it-finish-after-the-scrape", "it-finished-before-the-scrape"],
)
def test_a_scraped_active_adapter_holds_a_slot_until_we_see_it_finish(
    finished_at: float | None, starts: bool
) -> None:
    pool = Pool()
    pod = endpoint_state(0, updated_at=NOW - 1.0, max_lora=2, active={"x", "y"})
    if finished_at is not None:
        pool.finish(pool.route(pod, "x", at=NOW - 5.0), at=finished_at)

    assert pool.can_start("c", [pod]) == ([pod.name] if starts else [])
    # x itself can always start there: it joins the batch the scrape shows it in, or takes the
    # slot it left.
    assert pool.can_start("x", [pod]) == [pod.name]


def test_a_slot_frees_when_the_last_request_of_an_adapter_finishes() -> None:
    pool = Pool()
    pod = endpoint_state(0, updated_at=NOW, max_lora=1)
    first, second = pool.route(pod, "a"), pool.route(pod, "a")

    pool.finish(first, at=NOW - 1.0)
    assert pool.can_start("b", [pod]) == []
    pool.finish(second, at=NOW - 1.0)
    assert pool.can_start("b", [pod]) == [pod.name]


def test_placeable_is_the_candidates_themselves_when_all_can_start() -> None:
    pool = Pool()
    pods = (
        endpoint_state(0, updated_at=NOW),
        endpoint_state(1, updated_at=NOW),
        endpoint_state(2, updated_at=None),
    )

    assert pool.gate.placeable(request("a"), pods, NOW) is pods


def test_placeable_keeps_free_slots_in_candidate_order_then_the_pods_an_adapter_joins() -> None:
    pool = Pool()
    pods = [endpoint_state(i, updated_at=NOW, max_lora=1) for i in range(4)]
    pool.route(pods[1], "busy")
    pool.route(pods[2], "a")

    assert pool.can_start("a", pods) == [pods[0].name, pods[3].name, pods[2].name]
    assert pool.can_start("b", list(reversed(pods))) == [pods[3].name, pods[0].name]
    start = pool.gate.placeable(request("a"), pods, NOW)
    assert isinstance(start, NamedCandidates)  # answers by name too, for a scheduler's sample
    assert [name in start.names for name in (p.name for p in pods)] == [True, False, True, True]


# -- the starvation guard -----------------------------------------------------------------------


def full_pool() -> tuple[Pool, list[EndpointState], dict[str, list[str]]]:
    """Two pods of two slots, all held: pod-0 by a (3 in flight) and b (1), pod-1 by c (2) and d (4)."""
    pool = Pool()
    pods = [endpoint_state(0, updated_at=NOW, max_lora=2), endpoint_state(1, updated_at=NOW, max_lora=2)]
    keys = {
        "a": [pool.route(pods[0], "a") for _ in range(3)],
        "b": [pool.route(pods[0], "b")],
        "c": [pool.route(pods[1], "c") for _ in range(2)],
        "d": [pool.route(pods[1], "d") for _ in range(4)],
    }
    return pool, pods, keys


def test_an_adapter_that_waited_long_enough_gets_the_slot_held_by_the_fewest_requests() -> None:
    pool, pods, keys = full_pool()
    assert pool.can_start("w", pods) == []

    pool.gate.blocked(request("w"), pods, since=NOW - DRAIN_AFTER_S, now=NOW)

    assert pool.gate.draining == {pods[0].name: ("b", "w")}
    assert pool.can_start("b", pods) == []  # b's new requests stay off the pod it is leaving
    assert pool.can_start("a", pods) == [pods[0].name]  # the other holder there carries on
    pool.finish(keys["b"][0], at=NOW + 0.1)
    assert pool.gate.draining == {}
    assert pool.can_start("w", pods, now=NOW + 0.1) == [pods[0].name]


def test_the_drain_ends_only_when_the_holders_last_request_there_finishes() -> None:
    pool, pods, keys = full_pool()
    keys["b"].append(pool.route(pods[0], "b"))  # b and c now hold two each: b is less popular
    pool.finish(pool.route(pods[1], "c"), at=NOW - 5.0)  # ...as c was asked for once more

    pool.gate.blocked(request("w"), pods, since=NOW - 5.0, now=NOW)
    assert pool.gate.draining == {pods[0].name: ("b", "w")}

    pool.finish(keys["b"][0], at=NOW + 0.1)
    pool.finish(pool.route(pods[0], BASE_MODEL, at=NOW), at=NOW + 0.1)  # the base model frees no slot
    assert pool.gate.draining == {pods[0].name: ("b", "w")}
    assert pool.can_start("w", pods, now=NOW + 0.1) == []
    pool.finish(keys["b"][1], at=NOW + 0.2)
    assert pool.gate.draining == {}
    assert pool.can_start("w", pods, now=NOW + 0.2) == [pods[0].name]


def test_on_a_tie_in_requests_the_least_popular_holder_is_let_go() -> None:
    pool = Pool()
    pod = endpoint_state(0, updated_at=NOW, max_lora=2)
    for _ in range(5):  # "hot" has been asked for often, "cold" once; one of each in flight now
        pool.finish(pool.route(pod, "hot", at=NOW - 20.0), at=NOW - 19.0)
    pool.route(pod, "hot", at=NOW - 10.0)
    pool.route(pod, "cold", at=NOW - 10.0)

    pool.gate.blocked(request("w"), [pod], since=NOW - 5.0, now=NOW)

    assert pool.gate.draining == {pod.name: ("cold", "w")}


@pytest.mark.parametrize(
    ("since", "model"),
    [(NOW - DRAIN_AFTER_S / 2, "w"), (NOW - 10.0, BASE)],
    ids=["not-waited-long-enough", "base-model"],
)
def test_no_slot_is_freed_for_a_request_that_does_not_need_one_yet(since: float, model: str) -> None:
    pool, pods, _ = full_pool()

    pool.gate.blocked(request(model), pods, since=since, now=NOW)

    assert pool.gate.draining == {}


def test_no_slot_is_freed_while_slots_are_turning_over() -> None:
    pool, pods, _ = full_pool()
    # A slot on pod-1 freed half a drain period ago, and another adapter took it.
    pool.finish(pool.route(pods[1], "e", at=NOW - 5.0), at=NOW - DRAIN_AFTER_S / 2)
    pool.route(pods[1], "f", at=NOW - DRAIN_AFTER_S / 2)

    pool.gate.blocked(request("w"), pods, since=NOW - 10.0, now=NOW)
    assert pool.gate.draining == {}

    later = NOW + DRAIN_AFTER_S
    pool.gate.blocked(request("w"), pods, since=NOW - 10.0, now=later)
    assert len(pool.gate.draining) == 1


def test_one_slot_is_freed_per_waiting_adapter_at_a_time() -> None:
    pool, pods, _ = full_pool()

    for _ in range(3):
        pool.gate.blocked(request("w"), pods, since=NOW - 10.0, now=NOW)
    assert pool.gate.draining == {pods[0].name: ("b", "w")}

    pool.gate.blocked(request("v"), pods, since=NOW - 10.0, now=NOW)
    assert pool.gate.draining == {pods[0].name: ("b", "w"), pods[1].name: ("c", "v")}


def test_a_waiting_adapters_own_slot_is_never_the_one_freed() -> None:
    pool = Pool()
    pod = endpoint_state(0, updated_at=NOW, max_lora=2)
    pool.route(pod, "w")  # w and the base model hold the fewest requests here, but only h holds a slot
    for _ in range(3):  # that freeing would give to w
        pool.route(pod, "h")
    pool.route(pod, BASE_MODEL)

    pool.gate.blocked(request("w"), [pod], since=NOW - 10.0, now=NOW)

    assert pool.gate.draining == {pod.name: ("h", "w")}


def test_a_pod_keeps_the_slots_it_last_reported_while_its_scrape_shows_none() -> None:
    pool = Pool()
    reported = endpoint_state(0, updated_at=NOW - 1.0, max_lora=1)
    pool.route(reported, "a")
    assert pool.can_start("b", [reported], now=NOW - 1.0) == []
    idle_again = endpoint_state(0, updated_at=NOW, lora_enabled=False)  # no lora_requests_info now
    assert pool.can_start("b", [idle_again]) == []


# -- upstream's gate ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pods", "open_"),
    [
        ([endpoint_state(0, updated_at=NOW, waiting=50), endpoint_state(1, updated_at=NOW, waiting=1)], True),
        ([endpoint_state(0, updated_at=NOW, waiting=50), endpoint_state(1, updated_at=NOW, kv=0.9)], False),
        ([endpoint_state(0, updated_at=NOW - 10.0)], False),
        ([], False),
    ],
    ids=["one-pod-has-room", "saturated", "only-stale", "no-pods"],
)
def test_saturation_gate_opens_for_every_candidate_or_none(pods: list[EndpointState], open_: bool) -> None:
    gate = SaturationGate(DETECTOR)

    placeable = gate.placeable(request("a"), pods, NOW)

    if open_:
        assert placeable is pods
    else:
        assert list(placeable) == []
    gate.blocked(request("a"), pods, since=NOW - 100.0, now=NOW)  # no guard: nothing to free
    assert list(gate.placeable(request("a"), pods, NOW)) == list(placeable)


# -- the batch, as the gate learns it from scrapes ------------------------------------------------


def scraped(at: float, *, waiting: int, running: int) -> EndpointState:
    return endpoint_state(0, updated_at=at, waiting=waiting, running=running, max_lora=8)


def test_a_queue_standing_at_the_most_a_pod_ran_teaches_its_batch_size() -> None:
    """vLLM does not export max_num_seqs: a queue that stands half a second while the pod runs the
    most it ever ran says the batch is full (here 64 slots, all taken)."""
    pool = Pool()
    pool.can_start("a", [scraped(NOW - 1.0, waiting=0, running=60)], NOW - 1.0)
    pool.can_start("a", [scraped(NOW - 0.6, waiting=1, running=64)], NOW - 0.6)
    assert pool.gate.batch_slots([scraped(NOW - 0.6, waiting=1, running=64)], NOW - 0.6) is None
    pod = scraped(NOW, waiting=1, running=64)
    pool.can_start("a", [pod], NOW)
    assert pool.gate.batch_slots([pod], NOW) == (0, 64)


def test_a_short_queue_behind_a_long_prefill_teaches_nothing() -> None:
    """One request prefilling 2,000 tokens on a slow pod keeps the next waiting across two scrapes:
    that is one step, not a batch of one."""
    pool = Pool()
    for at in (NOW - 0.2, NOW - 0.1, NOW):
        pod = scraped(at, waiting=1, running=1)
        pool.can_start("a", [pod], at)
    assert pool.gate.batch_slots([pod], NOW) is None


def test_a_queue_below_the_most_a_pod_ran_teaches_nothing() -> None:
    pool = Pool()
    pool.can_start("a", [scraped(NOW - 2.0, waiting=0, running=64)], NOW - 2.0)
    for at in (NOW - 1.0, NOW - 0.5, NOW):
        pod = scraped(at, waiting=2, running=30)
        pool.can_start("a", [pod], at)
    assert pool.gate.batch_slots([pod], NOW) is None


def overloaded_pool_with_a_full_pod() -> tuple[Pool, EndpointState]:
    """A pod seen full at 64 (its queue past the threshold), then scraped full with nothing
    waiting, and the pool overloaded (flow control refused a request)."""
    pool = Pool()
    pool.can_start("a", [scraped(NOW - 1.0, waiting=6, running=64)], NOW - 1.0)
    pod = scraped(NOW, waiting=0, running=64)
    pool.gate.overloaded(NOW)
    return pool, pod


def test_an_overloaded_pod_takes_one_request_for_each_that_finished() -> None:
    """One request finishes on a full pod: it can start one more, not two (the second would wait
    on the pod, in its order, not the EPP's)."""
    pool, pod = overloaded_pool_with_a_full_pod()
    running = pool.route(pod, "a", at=NOW - 10.0)
    pool.finish(running, NOW + 0.01)
    assert pool.can_start("a", [pod], NOW + 0.02) == [pod.name]
    pool.route(pod, "a", at=NOW + 0.02)
    assert pool.can_start("a", [pod], NOW + 0.03) == []
    assert pool.gate.batch_slots([pod], NOW + 0.03) == (0, 64)


def test_a_full_pod_takes_nothing_while_the_pool_is_overloaded() -> None:
    pool, pod = overloaded_pool_with_a_full_pod()
    assert pool.gate.is_overloaded(NOW)
    assert pool.can_start("a", [pod], NOW + 0.01) == []
    assert not pool.gate.is_overloaded(NOW + OVERLOADED_HOLD_S + 0.1)


def test_a_slow_pod_holds_no_queue_a_fast_one_holds_what_it_finishes_in_the_wait_target() -> None:
    """The detector lets a pod queue 5; a full pod that finishes 2 requests a second would make the
    fifth wait 2.5 s, so it may queue none, while one finishing 40 a second may queue the 5."""
    pool = Pool()
    window = DETECTOR.staleness_threshold_s
    seen_full = [
        endpoint_state(i, updated_at=NOW - window - 0.1, waiting=6, running=64, max_lora=8) for i in (0, 1)
    ]
    pool.can_start("a", seen_full, NOW - window - 0.1)  # both seen full at 64, a whole window ago
    slow = endpoint_state(0, updated_at=NOW, waiting=1, running=64, max_lora=8)
    fast = endpoint_state(1, updated_at=NOW, waiting=1, running=64, max_lora=8)
    for i in range(int(2 * window)):
        pool.finish(pool.route(slow, "a"), NOW - window + 0.01 + i / 2)
    for i in range(int(40 * window)):
        pool.finish(pool.route(fast, "a"), NOW - window + 0.01 + i / 40)
    assert pool.can_start("a", [slow, fast], NOW + 0.01) == [fast.name]


def test_a_pod_never_seen_full_may_queue_the_threshold_whatever_its_pace() -> None:
    """What waits on a pod never seen full is waiting between two engine steps (a long prefill, a
    step's token budget): it starts without anything finishing."""
    pool = Pool()
    window = DETECTOR.staleness_threshold_s
    pod = endpoint_state(0, updated_at=NOW, waiting=3, running=10, max_lora=8)
    pool.can_start("a", [endpoint_state(0, updated_at=NOW - window - 0.1, max_lora=8)], NOW - window - 0.1)
    assert pool.can_start("a", [pod], NOW + 0.01) == [pod.name]


def test_a_queue_beside_a_growing_batch_teaches_nothing() -> None:
    """A pod filling up (each step admits a few more) keeps a queue for a while: not a full batch."""
    pool = Pool()
    for i, at in enumerate((NOW - 0.6, NOW - 0.4, NOW - 0.2, NOW)):
        pod = scraped(at, waiting=3, running=10 + 4 * i)
        pool.can_start("a", [pod], at)
    assert pool.gate.batch_slots([pod], NOW) is None
