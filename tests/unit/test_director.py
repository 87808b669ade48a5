"""Director: body parsing, model resolution, objectives, prompt text, subset hint, hooks."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

import pytest

from epp.clock import FakeClock
from epp.errors import EppError, ErrorCode
from epp.picker.datastore.types import (
    Criticality,
    EndpointState,
    InferenceModel,
    InferenceObjective,
    Snapshot,
    TargetModel,
)
from epp.picker.director import Director, prompt_text, replace_top_level_string
from epp.picker.scheduling.types import LLMRequest
from tests.unit.fake_scheduler import FakeScheduler, pool_datastore

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
    return Director(store, scheduler, clock=FakeClock(), rng=random.Random(7)), scheduler


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
    with pytest.raises(EppError) as caught:
        director.route(request_id="r", headers={}, body=body)
    assert caught.value.code is ErrorCode.BAD_REQUEST
    assert caught.value.message == message
    assert scheduler.scheduled == []


def test_body_kept_byte_for_byte_without_registry() -> None:
    director, _ = make_director()
    body = b'{"model":"base",  "prompt": "hi <b>", "n": 12345678901234567890}'
    decision = director.route(request_id="r1", headers={}, body=body)
    assert decision.body == body
    assert decision.request.incoming_model == "base"
    assert decision.request.target_model == "base"
    assert decision.request.prompt == "hi <b>"
    assert decision.destination == "10.0.0.1:8000"


def test_rewrite_header_wins_and_only_model_changes() -> None:
    director, _ = make_director(models=[SQL_MODEL])
    body = b'{"model": "tweet-summary", "prompt": "caf\xc3\xa9", "max_tokens": 5}'
    decision = director.route(request_id="r", headers={"x-gateway-model-name-rewrite": "other"}, body=body)
    assert decision.body == b'{"model": "other", "prompt": "caf\xc3\xa9", "max_tokens": 5}'

    assert decision.request.target_model == "other"
    assert decision.request.criticality is Criticality.SHEDDABLE
    assert decision.request.body_size == len(decision.body)


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
    decision = director.route(request_id="r", headers={}, body=b'{"model":"tweet-summary","prompt":"x"}')
    assert json.loads(decision.body)["model"] == "tweet-summary-1"
    assert decision.request.incoming_model == "tweet-summary"
    assert decision.request.criticality is Criticality.SHEDDABLE


def test_unknown_model_with_registry_is_404() -> None:
    director, scheduler = make_director(models=[SQL_MODEL])
    with pytest.raises(EppError) as caught:
        director.route(request_id="r", headers={}, body=b'{"model":"nope"}')
    assert caught.value.code is ErrorCode.NOT_FOUND
    assert "nope" in caught.value.message
    assert scheduler.scheduled == []


def test_unweighted_targets_draw_uniformly() -> None:
    director, _ = make_director(models=[UNWEIGHTED])
    seen = {
        director.route(request_id=str(i), headers={}, body=b'{"model":"chat"}').request.target_model
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
        director.route(request_id=str(i), headers={}, body=b'{"model":"m"}').request.target_model
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
    decision = director.route(request_id="r", headers=headers, body=b'{"model":"m"}')
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
    director.route(request_id="r", headers={}, body=b'{"model":"m"}', subset=subset)
    assert scheduler.scheduled[0][1] == expected


@pytest.mark.parametrize(
    "subset", [[], ["10.0.0.9:8000"], ["10.0.0.1:9999"]], ids=["empty", "no-match", "wrong-port"]
)
def test_subset_hint_without_match_is_503(subset: list[str]) -> None:
    director, scheduler = make_director()
    with pytest.raises(EppError) as caught:
        director.route(request_id="r", headers={}, body=b'{"model":"m"}', subset=subset)
    assert caught.value.code is ErrorCode.SERVICE_UNAVAILABLE
    assert scheduler.scheduled == []


def test_no_endpoints_is_503() -> None:
    director, _ = make_director(pod_ips=())
    with pytest.raises(EppError) as caught:
        director.route(request_id="r", headers={}, body=b'{"model":"m"}')
    assert caught.value.http_status == 503


def test_headers_only_request_routes_with_empty_model() -> None:
    director, scheduler = make_director()
    decision = director.route(request_id="r", headers={}, body=None)
    assert decision.request.target_model == ""
    assert decision.body == b""
    assert scheduler.routed == [("r", "pod-0-rank-0")]


def test_fallback_list_order_and_format() -> None:
    director, _ = make_director(pod_ips=("10.0.0.1", "fd00::5"), max_endpoints=2)
    decision = director.route(request_id="r", headers={}, body=b'{"model":"m"}')
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
    with pytest.raises(EppError) as caught:
        director.route(request_id="r", headers={}, body=b'{"model":"m"}')
    assert caught.value.http_status == 429
    assert seen == ["r"]
    assert scheduler.scheduled == []


@pytest.mark.parametrize(
    ("served", "status", "expected"),
    [
        (None, 200, ("r", "pod-0-rank-0")),
        ("10.0.0.2:8000", 200, ("r", "pod-1-rank-0")),
        ("10.0.0.2:8000", 503, ("r", "pod-1-rank-0")),
        ("10.9.9.9:8000", 200, ("r", "pod-0-rank-0")),
    ],
    ids=["primary", "served-fallback", "server-error", "served-unknown"],
)
def test_completion_reports_served_endpoint(
    served: str | None, status: int, expected: tuple[str, str]
) -> None:
    director, scheduler = make_director()
    decision = director.route(request_id="r", headers={}, body=b'{"model":"m"}')
    director.complete(decision, served_address=served, status=status)
    assert scheduler.completed == [expected]
