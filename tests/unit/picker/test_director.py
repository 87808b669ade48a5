"""Director: body parsing, model resolution, objectives, prompt text, subset hint, admission,
a request's finish, and flow control (queueing, dispatch as capacity frees, TTL, limits, priority)."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence

import pytest

from epp.clock import FakeClock
from epp.errors import EppError, ErrorCode
from epp.picker.admission import build_admission
from epp.picker.datastore.store import Datastore
from epp.picker.datastore.types import (
    Criticality,
    EndpointState,
    InferenceModel,
    InferenceObjective,
    Snapshot,
    TargetModel,
)
from epp.picker.director import Director, prompt_text, replace_top_level_string
from epp.picker.flowcontrol import FlowControl, FlowControlSettings, build_flow_control
from epp.picker.flowcontrol.capacity import OVERLOADED_HOLD_S, SlotGate
from epp.picker.flowcontrol.fairshare import FairShareSettings
from epp.picker.flowcontrol.overload import OverloadSettings
from epp.picker.flowcontrol.settings import BandSettings
from epp.picker.lifecycle import Ending, KeyMint, RequestLife, RoutingDecision, Stage, Usage
from epp.picker.observability.flow import flow_control_view
from epp.picker.scheduling.types import LLMRequest
from tests.support.fake_scheduler import FakeScheduler, pool_datastore, scrape_lora_slots

SQL_MODEL = InferenceModel(
    name="sql",
    namespace="default",
    model_name="tweet-summary",
    pool_name="pool",
    criticality=Criticality.SHEDDABLE,
    target_models=(TargetModel("tweet-summary-1", 100),),
)
UNWEIGHTED = InferenceModel(
    name="chat",
    namespace="default",
    model_name="chat",
    pool_name="pool",
    target_models=(TargetModel("chat-a"), TargetModel("chat-b")),
)
OBJECTIVE = InferenceObjective(name="batch", namespace="default", pool_name="pool", priority=-1)


def make_director(
    *,
    pod_ips: Sequence[str] = ("10.0.0.1", "10.0.0.2"),
    target_ports: tuple[int, ...] = (8000,),
    models: Sequence[InferenceModel] = (),
    objectives: Sequence[InferenceObjective] = (),
    max_endpoints: int = 1,
) -> tuple[Director, FakeScheduler]:
    scheduler = FakeScheduler(max_endpoints=max_endpoints)
    store = pool_datastore(pod_ips, target_ports=target_ports, models=models, objectives=objectives)
    director = Director(store, scheduler, clock=FakeClock(), rng=random.Random(7), keys=KeyMint("t"))
    return director, scheduler


def route(
    director: Director,
    *,
    headers: Mapping[str, str] | None = None,
    body: bytes | None,
    subset: Sequence[str] | None = None,
    request_id: str = "r",
) -> tuple[RequestLife, bytes]:
    """One request through `mint` and `arrive`: its life and the body it is sent on with."""
    life = director.mint(request_id)
    sent = director.arrive(life, headers=headers or {}, body=body, subset=subset)
    return life, sent


def decision_of(life: RequestLife) -> RoutingDecision:
    assert life.stage is Stage.DISPATCHED
    assert life.decision is not None
    return life.decision


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "Error unmarshaling request body"),
        (b"[1, 2]", "Error unmarshaling request body"),
        (b'"text"', "Error unmarshaling request body"),
        (b"\xff\xfe", "Error unmarshaling request body"),
        (b"{}", "model not found in request body"),
        (b'{"model": 3}', "model not found in request body"),
        (b'{"model": null}', "model not found in request body"),
    ],
    ids=["not-json", "array", "string", "bad-utf8", "no-model", "model-number", "model-null"],
)
def test_bad_body_is_400(body: bytes, message: str) -> None:
    director, scheduler = make_director()
    life = director.mint("r")
    with pytest.raises(EppError) as caught:
        director.arrive(life, headers={}, body=body)
    assert caught.value.code is ErrorCode.BAD_REQUEST
    assert caught.value.message == message
    assert scheduler.scheduled == []
    assert life.stage is Stage.ARRIVED and life.decision is None


def test_body_kept_byte_for_byte_without_registry() -> None:
    director, _ = make_director()
    body = b'{"model":"base",  "prompt": "hi <b>", "n": 12345678901234567890}'
    life, sent = route(director, body=body, request_id="r1")
    decision = decision_of(life)
    assert sent == body
    assert life.request_id == "r1"
    assert decision.request.incoming_model == "base"
    assert decision.request.target_model == "base"
    assert decision.request.prompt == "hi <b>"
    assert decision.destination == "10.0.0.1:8000"


def test_rewrite_header_wins_and_only_model_changes() -> None:
    director, _ = make_director(models=[SQL_MODEL])
    body = b'{"model": "tweet-summary", "prompt": "caf\xc3\xa9", "max_tokens": 5}'
    life, sent = route(director, headers={"x-gateway-model-name-rewrite": "other"}, body=body)
    assert sent == b'{"model": "other", "prompt": "caf\xc3\xa9", "max_tokens": 5}'
    decision = decision_of(life)
    assert decision.request.target_model == "other"
    assert decision.request.criticality is Criticality.SHEDDABLE
    assert decision.request.body_size == len(sent)
    assert life.outcome.request_body_bytes == len(body)  # what the client sent
    assert life.models == ("tweet-summary", "other")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"model":"a"}', b'{"model":"b"}'),
        (
            b' { "n" : 1e5 , "model" : "a" , "x": {"model": "keep"} } ',
            b' { "n" : 1e5 , "model" : "b" , "x": {"model": "keep"} } ',
        ),
        (b'{"model":"a","model":"a"}', b'{"model":"a","model":"b"}'),
        (b'{"s":"}\\"","model":"a","t":[1,{"u":2}]}', b'{"s":"}\\"","model":"b","t":[1,{"u":2}]}'),
        (rb'{"model":"\u00e9"}', b'{"model":"b"}'),
    ],
    ids=["compact", "spacing-and-numbers-kept", "duplicate-last-wins", "tricky-strings", "escaped-model"],
)
def test_rewrite_changes_only_the_model_field(body: bytes, expected: bytes) -> None:
    assert replace_top_level_string(body, "model", "b") == expected


def test_registry_rewrites_to_target_and_sets_criticality() -> None:
    director, _ = make_director(models=[SQL_MODEL])
    life, sent = route(director, body=b'{"model":"tweet-summary","prompt":"x"}')
    decision = decision_of(life)
    assert json.loads(sent)["model"] == "tweet-summary-1"
    assert decision.request.incoming_model == "tweet-summary"
    assert decision.request.criticality is Criticality.SHEDDABLE


def test_unknown_model_with_registry_is_404() -> None:
    director, scheduler = make_director(models=[SQL_MODEL])
    with pytest.raises(EppError) as caught:
        route(director, body=b'{"model":"nope"}')
    assert caught.value.code is ErrorCode.NOT_FOUND
    assert "nope" in caught.value.message
    assert scheduler.scheduled == []


def test_unweighted_targets_draw_uniformly() -> None:
    director, _ = make_director(models=[UNWEIGHTED])
    seen = {
        decision_of(route(director, body=b'{"model":"chat"}', request_id=str(i))[0]).request.target_model
        for i in range(200)
    }
    assert seen == {"chat-a", "chat-b"}


def test_weighted_draw_follows_weights() -> None:
    model = InferenceModel(
        name="m",
        namespace="default",
        model_name="m",
        pool_name="pool",
        target_models=(TargetModel("heavy", 90), TargetModel("light", 10)),
    )
    director, _ = make_director(models=[model])
    targets = [
        decision_of(route(director, body=b'{"model":"m"}', request_id=str(i))[0]).request.target_model
        for i in range(1000)
    ]
    assert 800 < targets.count("heavy") < 970


@pytest.mark.parametrize(
    ("headers", "priority", "objective"),
    [
        ({}, 0, None),
        ({"x-gateway-inference-objective": "batch"}, -1, "batch"),
        ({"x-gateway-inference-objective": "unknown"}, 0, "unknown"),
    ],
    ids=["absent", "known", "unknown"],
)
def test_objective_priority(headers: dict[str, str], priority: int, objective: str | None) -> None:
    director, _ = make_director(objectives=[OBJECTIVE])
    decision = decision_of(route(director, headers=headers, body=b'{"model":"m"}')[0])
    assert decision.request.priority == priority
    assert decision.request.objective == objective
    assert decision.request.sheddable is (priority < 0)


@pytest.mark.parametrize(
    ("payload", "text"),
    [
        ({"prompt": "abc"}, "abc"),
        ({"prompt": ["ab", "cd"]}, "abcd"),
        (
            {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]},
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    }
                ]
            },
            "<|im_start|>user\nab<|im_end|>\n",
        ),
        ({"prompt": 5}, ""),
        ({}, ""),
    ],
    ids=["prompt", "prompt-list", "chat", "chat-parts", "prompt-number", "none"],
)
def test_prompt_text(payload: dict[str, object], text: str) -> None:
    assert prompt_text(payload) == text


@pytest.mark.parametrize(
    ("subset", "expected"),
    [
        (None, ("pod-0-rank-0", "pod-0-rank-1", "pod-1-rank-0", "pod-1-rank-1")),
        (["10.0.0.2:8001"], ("pod-1-rank-1",)),
        (["10.0.0.2"], ("pod-1-rank-0", "pod-1-rank-1")),
        (["10.0.0.1:8000,10.0.0.2:8000"], ("pod-0-rank-0", "pod-1-rank-0")),
        (["10.0.0.9:8000", "10.0.0.1:8001"], ("pod-0-rank-1",)),
    ],
    ids=["absent", "exact-port", "ip-only", "comma-string", "unknown-ignored"],
)
def test_subset_hint_narrows_candidates(subset: list[str] | None, expected: tuple[str, ...]) -> None:
    director, scheduler = make_director(target_ports=(8000, 8001))
    life, _ = route(director, body=b'{"model":"m"}', subset=subset)
    assert scheduler.scheduled[0][1] == expected
    assert life.subset == (tuple(subset) if subset is not None else None)


@pytest.mark.parametrize(
    "subset", [[], ["10.0.0.9:8000"], ["10.0.0.1:9999"]], ids=["empty", "no-match", "wrong-port"]
)
def test_subset_hint_without_match_is_503(subset: list[str]) -> None:
    director, scheduler = make_director()
    with pytest.raises(EppError) as caught:
        route(director, body=b'{"model":"m"}', subset=subset)
    assert caught.value.code is ErrorCode.SERVICE_UNAVAILABLE
    assert scheduler.scheduled == []


def test_no_endpoints_is_503() -> None:
    director, _ = make_director(pod_ips=())
    with pytest.raises(EppError) as caught:
        route(director, body=b'{"model":"m"}')
    assert caught.value.http_status == 503


def test_headers_only_request_routes_with_empty_model() -> None:
    director, scheduler = make_director()
    life, sent = route(director, body=None)
    assert decision_of(life).request.target_model == ""
    assert sent == b""
    assert life.key == "t-1" and decision_of(life).request.request_id == life.key
    assert scheduler.routed == [(life.key, "pod-0-rank-0")]


def test_fallback_list_order_and_format() -> None:
    director, _ = make_director(pod_ips=("10.0.0.1", "fd00::5"), max_endpoints=2)
    decision = decision_of(route(director, body=b'{"model":"m"}')[0])
    assert decision.destination == "10.0.0.1:8000,[fd00::5]:8000"


def test_admission_shed_stops_scheduling() -> None:
    seen: list[str] = []

    def shed(
        request: LLMRequest, candidates: Sequence[EndpointState], snapshot: Snapshot, now: float
    ) -> None:
        seen.append(request.request_id)
        raise EppError(ErrorCode.RESOURCE_EXHAUSTED, "system saturated, sheddable request dropped")

    scheduler = FakeScheduler()
    director = Director(pool_datastore(), scheduler, admit=shed, clock=FakeClock())
    life = director.mint("r")
    with pytest.raises(EppError) as caught:
        director.arrive(life, headers={}, body=b'{"model":"m"}')
    assert caught.value.http_status == 429
    assert seen == [life.key]
    assert scheduler.scheduled == []
    assert life.decision is None and len(scheduler.state.ledger) == 0


@pytest.mark.parametrize(
    ("served", "status"),
    [(None, 200), ("10.0.0.2:8000", 200), ("10.0.0.2:8000", 503), ("10.9.9.9:8000", 200)],
    ids=["primary", "served-fallback", "server-error", "served-unknown"],
)
def test_finishing_releases_the_in_flight_entry_where_it_was_counted(served: str | None, status: int) -> None:
    director, scheduler = make_director()
    life, _ = route(director, body=b'{"model":"m"}')
    assert scheduler.state.inflight.count("pod-0-rank-0") == 1
    life.outcome.status = status
    life.outcome.served_address = served
    assert life.finish(Ending.RESPONSE, 1.0)
    # In flight on the endpoint it was counted on (its primary), whichever endpoint answered.
    assert scheduler.completed == [(life.key, "pod-0-rank-0")]
    assert scheduler.state.inflight.count("pod-0-rank-0") == 0
    assert len(scheduler.state.ledger) == 0
    assert life.stage is Stage.FINISHED and life.ending is Ending.RESPONSE and life.finished_at == 1.0
    assert (life.outcome.status, life.outcome.served_address) == (status, served)


def test_a_request_finishes_once() -> None:
    director, scheduler = make_director()
    life, _ = route(director, body=b'{"model":"m"}')
    assert life.finish(Ending.RESPONSE, 1.0)
    assert not life.finish(Ending.ACCESS_LOG, 2.0)
    assert scheduler.completed == [(life.key, "pod-0-rank-0")]
    assert (life.ending, life.finished_at) == (Ending.RESPONSE, 1.0)


def test_a_refused_request_holds_nothing_to_release() -> None:
    director, scheduler = make_director(pod_ips=())
    life = director.mint("r")
    with pytest.raises(EppError) as caught:
        director.arrive(life, headers={}, body=b'{"model":"m"}')
    life.refuse(caught.value)
    assert life.finish(Ending.REFUSED, 0.0)
    assert life.outcome.status == 503 and life.error is caught.value
    assert scheduler.completed == [] and len(scheduler.state.ledger) == 0


def test_keys_are_unique_while_client_request_ids_repeat() -> None:
    director, scheduler = make_director()
    first, _ = route(director, body=b'{"model":"m"}', request_id="same")
    second, _ = route(director, body=b'{"model":"m"}', request_id="same")
    assert first.key != second.key and first.key.startswith(director.key_prefix)
    assert scheduler.state.inflight.count("pod-0-rank-0") == 2  # both count: neither replaced the other
    first.finish(Ending.RESPONSE, 1.0)
    assert scheduler.state.inflight.count("pod-0-rank-0") == 1


# -- flow control ----------------------------------------------------------------------------


class Fc:
    """A director with flow control (LoRA-slot gate) over pods scraped with `max_lora` slots."""

    def __init__(
        self,
        settings: FlowControlSettings | None = None,
        *,
        pod_ips: Sequence[str] = ("10.0.0.1", "10.0.0.2"),
        objectives: Sequence[InferenceObjective] = (),
        max_lora: int = 1,
        waiting: int = 0,
    ) -> None:
        self.clock = FakeClock()
        self.store: Datastore = pool_datastore(pod_ips, objectives=objectives, clock=self.clock)
        self.scheduler = FakeScheduler()
        self.max_lora = max_lora
        self.scrape(waiting=waiting)
        flow = build_flow_control(
            settings or FlowControlSettings(enabled=True), self.scheduler.state, build_admission().detector
        )
        assert flow is not None
        self.flow: FlowControl = flow
        self.director = Director(self.store, self.scheduler, flow=flow, clock=self.clock, keys=KeyMint("t"))
        self.told: list[RequestLife] = []

    def scrape(self, *, waiting: int = 0) -> None:
        """Every pod scraped now: `waiting` above the detector's threshold (5) leaves no headroom."""
        scrape_lora_slots(self.store, self.clock.now(), max_lora=self.max_lora, waiting=waiting)

    def send(self, model: str, headers: Mapping[str, str] | None = None) -> RequestLife:
        life = self.director.mint(model)
        life.waiter = self.told.append
        self.director.arrive(life, headers=headers or {}, body=json.dumps({"model": model}).encode())
        if life.stage is Stage.DISPATCHED:
            life.waiter = None  # as the stream does: only a queued request waits to be told
        return life

    @property
    def queued(self) -> int:
        return len(self.flow.queues)


def test_with_room_a_request_is_dispatched_at_once() -> None:
    fc = Fc()
    life = fc.send("a1")
    assert life.stage is Stage.DISPATCHED and life.decision is not None
    assert life.queued_at is None and life.queue_wait_s is None
    assert fc.queued == 0 and fc.told == []


def test_a_request_no_endpoint_can_start_waits_until_a_slot_frees() -> None:
    fc = Fc()
    first, second = fc.send("a1"), fc.send("a2")  # one slot per pod: both pods now hold an adapter
    assert decision_of(first).primary.name == "pod-0-rank-0"
    assert decision_of(second).primary.name == "pod-1-rank-0"
    waiting = fc.send("a3")
    assert waiting.stage is Stage.QUEUED and waiting.decision is None
    assert waiting.queued_at == fc.clock.now() and fc.queued == 1
    assert len(fc.scheduler.scheduled) == 2  # it was not scheduled: nowhere could start it
    assert fc.told == []
    fc.clock.advance(0.5)
    first.finish(Ending.RESPONSE, fc.clock.now())  # a1's slot on pod-0 frees: the queue moves at once
    assert fc.told == [waiting]
    assert decision_of(waiting).primary.name == "pod-0-rank-0"
    assert waiting.queue_wait_s == pytest.approx(0.5) and waiting.dispatched_at == fc.clock.now()
    assert fc.queued == 0
    fc.director.pump()
    second.finish(Ending.RESPONSE, fc.clock.now())
    assert fc.told == [waiting]  # told once
    waiting.finish(Ending.RESPONSE, fc.clock.now())
    assert len(fc.scheduler.state.ledger) == 0


def test_pump_dispatches_a_waiting_request_once_a_scrape_shows_room() -> None:
    fc = Fc(waiting=10)  # every pod's queue is over the threshold
    life = fc.send("base")
    assert life.stage is Stage.QUEUED
    fc.director.pump()
    assert life.stage is Stage.QUEUED and fc.told == []
    fc.clock.advance(0.25)
    fc.scrape(waiting=0)
    fc.director.pump()
    assert fc.told == [life] and life.error is None
    assert decision_of(life).primary.name == "pod-0-rank-0"
    assert life.queue_wait_s == pytest.approx(0.25)
    fc.director.pump()
    assert fc.told == [life]


def test_a_request_waiting_past_its_ttl_is_answered_503() -> None:
    fc = Fc(FlowControlSettings(enabled=True, request_ttl_s=5.0), waiting=10)
    life = fc.send("base")
    fc.clock.advance(4.9)
    fc.scrape(waiting=10)  # still full (and fresh: stale metrics would not hold it back)
    fc.director.pump()
    assert life.stage is Stage.QUEUED and fc.told == []
    fc.clock.advance(0.1)
    fc.scrape(waiting=10)
    fc.director.pump()
    assert fc.told == [life]
    assert life.error is not None and life.error.http_status == 503
    assert life.error.message == "request timed out in queue: request TTL expired"
    assert life.outcome.status == 503 and life.decision is None and fc.queued == 0
    assert life.finish(Ending.REFUSED, fc.clock.now())  # the caller answers it, then finishes it
    assert fc.scheduler.scheduled == [] and len(fc.scheduler.state.ledger) == 0


@pytest.mark.parametrize(
    "settings",
    [
        FlowControlSettings(enabled=True, default_band=BandSettings(max_requests=1)),
        FlowControlSettings(enabled=True, max_requests=1),
        FlowControlSettings(enabled=True, default_band=BandSettings(max_bytes=20)),
    ],
    ids=["band-requests", "pool-requests", "band-bytes"],
)
def test_a_full_queue_refuses_a_newcomer_with_429(settings: FlowControlSettings) -> None:
    fc = Fc(settings, waiting=10)
    first = fc.send("base")  # 16 body bytes
    assert first.stage is Stage.QUEUED
    late = fc.director.mint("late")
    with pytest.raises(EppError) as caught:
        fc.director.arrive(late, headers={}, body=b'{"model":"base"}')
    assert caught.value.http_status == 429
    assert caught.value.message == "request rejected pre-queue: queue at capacity"
    assert late.stage is Stage.ARRIVED and fc.queued == 1
    assert first.stage is Stage.QUEUED  # the one already waiting keeps its place


def test_a_queued_request_whose_client_left_leaves_its_queue() -> None:
    fc = Fc(waiting=10)
    gone, stays = fc.send("base"), fc.send("base")
    assert fc.queued == 2
    assert gone.finish(Ending.CLIENT_GONE, fc.clock.now())
    assert gone.stage is Stage.FINISHED and fc.queued == 1
    fc.scrape(waiting=0)
    fc.director.pump()
    assert fc.told == [stays]  # only the one still waiting is dispatched
    assert [request.request_id for request, _ in fc.scheduler.scheduled] == [stays.key]
    assert gone.decision is None and len(fc.scheduler.state.ledger) == 1


def test_releasing_the_queues_dispatches_every_waiting_request_whatever_the_load() -> None:
    objectives = [InferenceObjective(name="high", namespace="default", pool_name="pool", priority=10)]
    fc = Fc(waiting=10, objectives=objectives)  # every pod saturated: nothing may start
    low = fc.send("base")
    high = fc.send("a1", {"x-gateway-inference-objective": "high"})
    assert (low.stage, high.stage) == (Stage.QUEUED, Stage.QUEUED)
    fc.director.release_queues()
    assert fc.told == [high, low]  # the higher band first
    assert all(life.stage is Stage.DISPATCHED and life.error is None for life in (low, high))
    assert {decision_of(life).primary.name for life in (low, high)} <= {"pod-0-rank-0", "pod-1-rank-0"}
    assert fc.queued == 0 and len(fc.scheduler.state.ledger) == 2


def test_releasing_the_queues_refuses_only_a_request_no_endpoint_can_serve() -> None:
    fc = Fc(waiting=10)
    lives = [fc.send("base"), fc.send("a1")]
    fc.store.replace_pods([])  # the pool emptied while they waited
    fc.director.release_queues()
    assert fc.told == lives
    assert all(life.error is not None and life.outcome.status == 503 for life in lives)
    assert fc.queued == 0 and fc.scheduler.scheduled == []


def test_bands_are_served_strictly_by_priority() -> None:
    objectives = [
        InferenceObjective(name="high", namespace="default", pool_name="pool", priority=10),
        InferenceObjective(name="low", namespace="default", pool_name="pool", priority=1),
    ]
    fc = Fc(pod_ips=("10.0.0.1",), objectives=objectives)
    holder = fc.send("a1")  # takes the pod's one slot
    low = fc.send("a2", {"x-gateway-inference-objective": "low"})  # waited longer ...
    fc.clock.advance(1.0)
    high = fc.send("a3", {"x-gateway-inference-objective": "high"})
    assert (low.stage, high.stage) == (Stage.QUEUED, Stage.QUEUED)
    assert (low.priority, high.priority) == (1, 10)
    holder.finish(Ending.RESPONSE, fc.clock.now())
    assert fc.told == [high]  # ... but the higher band goes first
    assert low.stage is Stage.QUEUED
    high.finish(Ending.RESPONSE, fc.clock.now())
    assert fc.told == [high, low]


@pytest.mark.parametrize(
    ("headers", "flow"),
    [
        ({"x-gateway-inference-fairness-id": "tenant-a"}, "tenant-a"),
        ({"x-llm-d-inference-fairness-id": "tenant-b"}, "tenant-b"),
        (
            {"x-gateway-inference-fairness-id": "tenant-a", "x-llm-d-inference-fairness-id": "tenant-b"},
            "tenant-a",
        ),
        ({}, "default-flow"),
    ],
    ids=["gateway-header", "llm-d-header", "both", "none"],
)
def test_the_fairness_id_header_names_the_requests_flow(headers: dict[str, str], flow: str) -> None:
    fc = Fc(waiting=10)
    life = fc.send("a1", headers)
    assert life.stage is Stage.QUEUED and life.fairness_id == flow
    [lane] = fc.flow.queues.lanes(fc.clock.now())
    assert (lane.fairness_id, lane.requests) == (flow, 1)


def test_flows_named_by_the_fairness_id_take_turns() -> None:
    """Round-robin fairness across flows: a tenant's backlog does not hold another tenant back."""
    fc = Fc(
        FlowControlSettings(enabled=True, default_band=BandSettings(fairness="round-robin")),
        pod_ips=("10.0.0.1",),
    )
    holder = fc.send("a0")  # the pod's one slot
    busy = {"x-gateway-inference-fairness-id": "busy"}
    first, second = fc.send("a1", busy), fc.send("a2", busy)
    fc.clock.advance(1.0)
    other = fc.send("a3", {"x-llm-d-inference-fairness-id": "quiet"})
    holder.finish(Ending.RESPONSE, fc.clock.now())
    assert fc.told == [first]
    first.finish(Ending.RESPONSE, fc.clock.now())
    assert fc.told == [first, other]  # the quiet tenant's turn, though "busy" waited longer
    other.finish(Ending.RESPONSE, fc.clock.now())
    assert fc.told == [first, other, second]


# -- overload: refuse early, keep order across the pool ---------------------------------------------


def overloaded(**settings: object) -> Fc:
    """A flow-controlled director whose judge refuses past 0.5 s as soon as the pool is saturated
    (no standing time), over pods with no headroom."""
    return Fc(
        FlowControlSettings(
            enabled=True,
            overload=OverloadSettings(wait_target_s=0.5, standing_s=0.0),
            **settings,  # type: ignore[arg-type]
        ),
        objectives=[
            InferenceObjective(name="critical", namespace="default", pool_name="pool", priority=10),
            InferenceObjective(name="sheddable", namespace="default", pool_name="pool", priority=-10),
        ],
        waiting=10,
    )


def test_a_sheddable_request_is_refused_at_once_with_429_and_retry_after_while_the_pool_is_saturated() -> (
    None
):
    fc = overloaded()
    life = fc.director.mint("s")
    with pytest.raises(EppError) as caught:
        fc.director.arrive(
            life, headers={"x-gateway-inference-objective": "sheddable"}, body=b'{"model":"base"}'
        )
    error = caught.value
    assert (error.http_status, error.reason) == (429, "sheddable")
    assert error.retry_after_s is not None and error.retry_after_s >= 1
    assert json.loads(error.body())["error"]["code"] == 429
    assert fc.queued == 0 and life.stage is Stage.ARRIVED


def test_a_sheddable_request_waits_for_a_lora_slot_while_the_pool_has_headroom() -> None:
    fc = overloaded()
    fc.scrape(waiting=0)
    holder = fc.send("a1")
    fc.send("a2")  # both pods' one slot taken
    life = fc.send("a3", {"x-gateway-inference-objective": "sheddable"})
    assert life.stage is Stage.QUEUED  # a slot, not the pool, is what it waits for
    holder.finish(Ending.RESPONSE, fc.clock.now())
    assert fc.told == [life] and life.error is None


def measured_rate(fc: Fc) -> None:
    """Two seconds of dispatches at 20 a second, the pool with room; then it is saturated."""
    fc.scrape(waiting=0)
    for _ in range(40):
        fc.send("base").finish(Ending.RESPONSE, fc.clock.now())
        fc.clock.advance(0.05)
    fc.clock.advance(0.01)  # a whole window since the first
    fc.scrape(waiting=10)


def test_a_newcomer_that_cannot_be_dispatched_in_time_is_refused_on_arrival() -> None:
    fc = overloaded()
    measured_rate(fc)
    # About 20 dispatches a second: the first ten or so can start within 0.5 s, the next cannot.
    refused: EppError | None = None
    sent = 0
    while refused is None and sent < 20:
        try:
            assert fc.send("base").stage is Stage.QUEUED
            sent += 1
        except EppError as err:
            refused = err
    assert refused is not None and 8 <= sent <= 10 and fc.queued == sent
    assert (refused.http_status, refused.reason) == (429, "predicted-wait")
    assert "cannot be dispatched in time" in refused.message and refused.retry_after_s == 1


def test_a_newly_started_epp_queues_rather_than_refuses_with_no_rate_measured() -> None:
    fc = overloaded()
    assert fc.send("base").stage is Stage.QUEUED


def test_a_waiting_request_past_the_target_is_refused_while_the_pool_stays_saturated() -> None:
    fc = overloaded()
    measured_rate(fc)
    waiting = fc.send("base")
    assert waiting.stage is Stage.QUEUED
    fc.clock.advance(0.4)
    fc.scrape(waiting=10)
    fc.director.pump()
    assert waiting.stage is Stage.QUEUED and fc.told == []
    fc.clock.advance(0.2)
    fc.scrape(waiting=10)
    fc.director.pump()
    assert fc.told == [waiting]
    assert waiting.error is not None and (waiting.error.http_status, waiting.error.reason) == (
        429,
        "waited-too-long",
    )


FLOOD = {"x-gateway-inference-fairness-id": "flood"}
QUIET = {"x-gateway-inference-fairness-id": "quiet"}


def overloaded_with_a_flood(reserve_share: float = 0.05) -> Fc:
    """One pod seen full at 20 requests, now running 19 (one slot free, the reserve of 5 % of 20),
    the pool overloaded, and the last five seconds' arrivals: 'flood' 30 a second, 'quiet' 1, with
    10 dispatched a second (so the flood is over its share, the quiet tenant within)."""
    fc = Fc(
        FlowControlSettings(
            enabled=True,
            overload=OverloadSettings(wait_target_s=0.5, standing_s=0.0),
            fair_share=FairShareSettings(reserve_share=reserve_share),
        ),
        pod_ips=("10.0.0.1",),
        max_lora=4,
    )
    shares = fc.flow.shares
    assert (shares is None) is (reserve_share == 0)
    start = fc.clock.now()
    if shares is not None:
        for i in range(150):
            shares.arrived(0, "flood", start + i / 30)
        for i in range(5):
            shares.arrived(0, "quiet", start + i)
        for i in range(100):
            shares.dispatched(start + i / 10)
    fc.clock.advance(5.0)
    scrape_lora_slots(fc.store, fc.clock.now(), max_lora=4, waiting=6, running=20)  # its batch: 20
    assert fc.flow.gate.saturated(fc.store.snapshot().endpoints, fc.clock.now())  # as a pass looks
    fc.clock.advance(0.1)
    scrape_lora_slots(fc.store, fc.clock.now(), max_lora=4, waiting=0, running=19)
    fc.flow.gate.overloaded(fc.clock.now())
    return fc


def test_an_overloaded_pool_keeps_its_last_free_slots_for_tenants_within_their_share() -> None:
    fc = overloaded_with_a_flood()
    flood = fc.send("base", FLOOD)
    assert flood.stage is Stage.QUEUED  # the one free slot is the reserve
    quiet = fc.send("base", QUIET)
    assert quiet.stage is Stage.DISPATCHED and decision_of(quiet).primary.name == "pod-0-rank-0"
    view = flow_control_view(fc.director, fc.store, fc.clock)
    assert view["fair_share"]["over_share"] == [  # type: ignore[index]
        {"priority": 0, "fairness_id": "flood", "arrivals_per_s": pytest.approx(30.0, abs=0.5)}
    ]


def test_the_reserve_holds_no_one_once_the_pool_is_no_longer_overloaded() -> None:
    fc = overloaded_with_a_flood()
    fc.clock.advance(OVERLOADED_HOLD_S + 0.1)
    scrape_lora_slots(fc.store, fc.clock.now(), max_lora=4, waiting=0, running=19)
    assert fc.send("base", FLOOD).stage is Stage.DISPATCHED


def test_with_the_reserve_off_a_flood_takes_the_last_slot() -> None:
    fc = overloaded_with_a_flood(reserve_share=0.0)
    assert fc.send("base", FLOOD).stage is Stage.DISPATCHED


def test_a_new_arrival_does_not_pass_requests_already_waiting_for_the_capacity_it_would_take() -> None:
    fc = Fc(pod_ips=("10.0.0.1",), waiting=10)  # no headroom: the first request waits
    waiting = fc.send("a1")
    assert waiting.stage is Stage.QUEUED
    fc.clock.advance(0.05)
    fc.scrape(waiting=0)  # room again, seen by a scrape before any pass ran
    newcomer = fc.send("a2")  # another adapter (another lane), for the same pod's one slot
    assert fc.told == [waiting] and decision_of(waiting).primary.name == "pod-0-rank-0"
    assert newcomer.stage is Stage.QUEUED  # it queues behind the one that waited
    assert [request.request_id for request, _ in fc.scheduler.scheduled] == [waiting.key]


def test_strict_priority_holds_across_lanes_a_lower_band_newcomer_waits_behind_a_higher_one() -> None:
    fc = Fc(
        pod_ips=("10.0.0.1",),
        objectives=[InferenceObjective(name="high", namespace="default", pool_name="pool", priority=10)],
        waiting=10,  # no headroom: everything queues
    )
    high = fc.send("a1", {"x-gateway-inference-objective": "high"})
    assert high.stage is Stage.QUEUED
    fc.scrape(waiting=0)  # headroom again, before any pass
    low = fc.send("a2")  # another adapter, another lane: it used to go straight past
    assert low.stage is Stage.QUEUED and fc.told == [high]  # the pod's one slot went to the higher band


def test_output_tokens_count_against_the_flow_that_was_served_them() -> None:
    fc = Fc(
        FlowControlSettings(enabled=True, default_band=BandSettings(fairness="vtc")),
        pod_ips=("10.0.0.1",),
    )
    holder = fc.send("a0")
    a = {"x-gateway-inference-fairness-id": "A"}
    b = {"x-gateway-inference-fairness-id": "B"}
    a_first, b_first = fc.send("a1", a), fc.send("a2", b)
    a_second, b_second = fc.send("a3", a), fc.send("a4", b)  # each needs the pod's one slot
    holder.finish(Ending.RESPONSE, fc.clock.now())
    assert fc.told == [a_first]  # the same counter: A's older lane goes first
    a_first.outcome.usage = Usage(prompt_tokens=10, completion_tokens=1000, total_tokens=1010)
    a_first.finish(Ending.RESPONSE, fc.clock.now())
    assert fc.told == [a_first, b_first]
    b_first.finish(Ending.RESPONSE, fc.clock.now())
    # A was charged 2,000 for its output: B goes again before A does.
    assert fc.told == [a_first, b_first, b_second]
    assert a_second.stage is Stage.QUEUED


def test_the_gate_forgets_endpoints_that_left_the_pool() -> None:
    fc = Fc(pod_ips=("10.0.0.1", "10.0.0.2"))
    life = fc.send("a1")
    primary = decision_of(life).primary
    life.finish(Ending.RESPONSE, fc.clock.now())
    gate = fc.flow.gate
    assert isinstance(gate, SlotGate)
    gone = primary.name
    assert gone in gate._last_finish
    pods = [pod for pod in fc.store.pods() if pod.ip != primary.endpoint.ip]
    fc.store.replace_pods(pods)
    assert gone not in gate._last_finish and gone not in gate._finishes
