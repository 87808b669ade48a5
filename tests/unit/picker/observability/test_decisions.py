"""`GET /debug/decisions`: newest first, bounded, `limit` validated."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from epp.picker.observability.decisions import Decision, DecisionLog, decisions_route
from epp.picker.observability.http import build_app


def decision(index: int, *, request_id: str | None = None) -> Decision:
    return Decision(
        request_id=request_id if request_id is not None else f"r{index}",
        key=f"k{index}",
        at_s=float(index),
        model="m",
        target_model="a1",
        criticality="Standard",
        outcome="routed",
        candidates=("pod-0", "pod-1"),
        chosen=("10.0.0.1:8000",),
        reason="adapter-active",
        scores={"pod-0": {"lora-affinity-scorer": 1.0}},
        total_scores={"pod-0": 1.0},
    )


async def client_for(log: DecisionLog) -> TestClient:  # type: ignore[type-arg]
    app = build_app(CollectorRegistry(), extra_routes=[decisions_route(log)])
    client: TestClient = TestClient(TestServer(app, host="127.0.0.1"))  # type: ignore[type-arg]
    await client.start_server()
    return client


async def test_decisions_are_served_newest_first_with_scores() -> None:
    log = DecisionLog(capacity=3)
    for index in range(5):
        log.add(decision(index))
    client = await client_for(log)
    try:
        response = await client.get("/debug/decisions")
        assert response.status == 200
        body = await response.json()
        assert body["capacity"] == 3
        assert [d["request_id"] for d in body["decisions"]] == ["r4", "r3", "r2"]
        assert body["decisions"][0]["scores"] == {"pod-0": {"lora-affinity-scorer": 1.0}}
        assert (body["decisions"][0]["key"], body["decisions"][0]["queue_wait_s"]) == ("k4", None)
        limited = await (await client.get("/debug/decisions?limit=1")).json()
        assert [d["request_id"] for d in limited["decisions"]] == ["r4"]
    finally:
        await client.close()


@pytest.mark.parametrize("limit", ["abc", "-1"], ids=["not-a-number", "negative"])
async def test_a_bad_limit_is_a_400(limit: str) -> None:
    client = await client_for(DecisionLog())
    try:
        response = await client.get(f"/debug/decisions?limit={limit}")
        assert response.status == 400
        assert "limit" in (await response.json())["error"]
    finally:
        await client.close()


def test_status_lands_on_the_newest_entry_for_the_request() -> None:
    log = DecisionLog()
    log.add(decision(1))
    log.set_status("k1", 503)
    log.set_status("gone", 200)
    log.set_status("r1", 200)  # the client's request id is not the request's key
    assert [d.response_status for d in log.recent()] == [503]


def test_status_lands_on_the_request_with_that_key_when_clients_repeat_an_id() -> None:
    log = DecisionLog()
    log.add(decision(1, request_id="same"))
    log.add(decision(2, request_id="same"))
    log.set_status("k1", 200)
    log.set_status("k2", 503)
    assert [(d.key, d.response_status) for d in log.recent()] == [("k2", 503), ("k1", 200)]


def test_status_shows_on_entries_read_before_and_after_it_is_set() -> None:
    log = DecisionLog()
    log.add(decision(1))
    before = log.recent()
    log.set_status("k1", 200)
    assert before[0].response_status is None  # entries handed out are frozen values
    assert log.recent()[0].response_status == 200
    assert log.recent()[0].to_json()["response_status"] == 200
