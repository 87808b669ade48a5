"""Push state in the datastore: a sidecar's adapter view over the scrape, and the scrape alone
again the moment the stream is gone."""

from __future__ import annotations

from epp.clock import FakeClock
from epp.picker.datastore.types import AdapterState, Metrics
from tests.support.fake_scheduler import pool_datastore

NAME = "pod-0-rank-0"


def scraped(clock: FakeClock) -> Metrics:
    return Metrics(
        updated_at=clock.now(),
        waiting_requests=3,
        kv_cache_usage=0.5,
        lora_enabled=True,
        max_lora=2,
        running_adapters=frozenset({"scraped"}),
    )


def pushed(clock: FakeClock, **fields: object) -> AdapterState:
    values: dict[str, object] = {
        "received_at": clock.now(),
        "registered": frozenset({"a", "b"}),
        "running_adapters": frozenset({"a"}),
        "waiting_adapters": frozenset({"b"}),
        "max_lora": 4,
        **fields,
    }
    return AdapterState(**values)  # type: ignore[arg-type]


def test_a_push_newer_than_the_scrape_gives_the_adapter_view_and_keeps_the_queues() -> None:
    clock = FakeClock()
    store = pool_datastore(("10.0.0.1",), clock=clock)
    store.update_metrics(NAME, scraped(clock))
    before = store.snapshot()
    clock.advance(0.05)
    store.set_adapter_state(NAME, pushed(clock))
    after = store.snapshot()
    assert after is not before
    state = after.endpoints[0]
    assert state.adapter_state is not None and state.adapter_state.registered == {"a", "b"}
    m = state.metrics
    assert m is not None
    assert (m.running_adapters, m.waiting_adapters, m.max_lora) == (frozenset({"a"}), frozenset({"b"}), 4)
    assert m.updated_at == clock.now()  # the residency model folds the push in at once
    assert (m.waiting_requests, m.kv_cache_usage) == (3, 0.5)


def test_a_scrape_newer_than_the_push_wins_and_losing_the_stream_restores_the_scrape() -> None:
    clock = FakeClock()
    store = pool_datastore(("10.0.0.1",), clock=clock)
    store.update_metrics(NAME, scraped(clock))
    store.set_adapter_state(NAME, pushed(clock))
    clock.advance(0.1)
    store.update_metrics(NAME, scraped(clock))
    m = store.snapshot().endpoints[0].metrics
    assert m is not None and m.running_adapters == {"scraped"} and m.max_lora == 2
    clock.advance(0.01)
    store.set_adapter_state(NAME, pushed(clock))
    store.set_adapter_state(NAME, None)
    state = store.snapshot().endpoints[0]
    assert state.adapter_state is None
    assert state.metrics == scraped(FakeClock(clock.now() - 0.01))


def test_push_state_never_makes_an_unscraped_or_failing_pod_fresh() -> None:
    clock = FakeClock()
    store = pool_datastore(("10.0.0.1",), clock=clock)
    store.set_adapter_state(NAME, pushed(clock))
    assert store.snapshot().endpoints[0].metrics is None
    store.update_metrics(NAME, scraped(clock))
    store.record_scrape_failure(NAME, "timeout")
    clock.advance(0.5)
    store.set_adapter_state(NAME, pushed(clock))
    assert not store.snapshot().endpoints[0].is_fresh(clock.now(), 2.0)


def test_push_state_of_a_pod_that_left_is_dropped_with_it() -> None:
    clock = FakeClock()
    store = pool_datastore(("10.0.0.1",), clock=clock)
    store.update_metrics(NAME, scraped(clock))
    store.set_adapter_state(NAME, pushed(clock))
    pods = store.pods()
    store.replace_pods(())
    store.set_adapter_state(NAME, pushed(clock))  # a late State for a gone endpoint: ignored
    assert store.snapshot().endpoints == ()
    store.replace_pods(pods)  # the same pod again: nothing carried over
    state = store.snapshot().endpoints[0]
    assert state.adapter_state is None and state.metrics is None
