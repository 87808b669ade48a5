"""Two `epp serve` replicas behind one Envoy, active-active (`--peers` between them), against one.

Through real Envoy, whose EPP cluster has both replicas (each health-checked), and `epp sim`
pods with more adapters than LoRA slots:

- both replicas route, every request is answered whole, and the pods load adapters about as
  often as behind one replica (same seeded request sequence); the replicas hear each other over
  the peer exchange's mutual TLS (the local stack's default, as the chart's);
- SIGKILL of one replica under 30 requests/s in FailOpen: the other keeps routing. With the
  BUFFERED request body no request fails; with FULL_DUPLEX_STREAMED the requests whose routing
  was under way on the killed replica at that instant may (Envoy had passed it their body).
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp.picker.datastore.types import FailureMode
from epp.picker.extproc.stream import BodyMode
from epp.tools.loadgen import Answer
from epp.tools.localstack import EppSlot, LocalStack, StackOptions
from testkit import faults
from testkit.waiting import wait_until
from tests.integration.conftest import NO_EARLY_REFUSAL, SIM, _started, models_yaml
from tests.integration.traffic import open_load

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ADAPTERS = tuple(f"adapter-{i}" for i in range(8))  # over 3 pods × 2 slots: adapters must swap
ONE = StackOptions(
    pods=3,
    sim=dataclasses.replace(SIM, adapters=ADAPTERS),
    extra_pool_yaml=models_yaml(("base", *ADAPTERS)),
    failure_mode=FailureMode.FAIL_OPEN,
    extra_serve_args=NO_EARLY_REFUSAL,
)
TWO = dataclasses.replace(ONE, epp_replicas=2)
# A skewed, seeded request sequence: the same for both stacks.
SEQUENCE = tuple(random.Random(7).choices(ADAPTERS, weights=[1 / (i + 1) for i in range(8)], k=150))


def routed_by(slot: EppSlot) -> int:
    """Requests this replica has scheduled, from its picks counter (the decision log is capped)."""
    url = f"http://127.0.0.1:{slot.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return int(
        sum(
            sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "inference_extension_scheduler_picks"
            for sample in family.samples
            if sample.name.endswith("_total")
        )
    )


def peers_page(slot: EppSlot) -> dict[str, object]:
    url = f"http://127.0.0.1:{slot.metrics_port}/debug/peers"
    with urllib.request.urlopen(url, timeout=10) as response:
        page: dict[str, object] = json.load(response)
    return page


def failures(results: list[Answer]) -> list[tuple[int, bool, str]]:
    return [(r.status, r.whole, r.error) for r in results if r.status != 200 or not r.whole]


def serve_sequence(stack: LocalStack) -> tuple[list[Answer], float]:
    """The whole sequence at 20 requests/s; returns the results and the pods' adapter loads."""
    with open_load(stack, SEQUENCE, rate=20.0, max_requests=len(SEQUENCE)) as load:
        load.wait_sent(len(SEQUENCE))
        results = load.stop()
    return results, sum(stack.adapter_loads().values())


def test_two_replicas_both_route_and_load_adapters_about_as_often_as_one() -> None:
    loads: dict[int, float] = {}
    for options in (ONE, TWO):
        for stack in _started(options):
            results, loads[options.epp_replicas] = serve_sequence(stack)
            assert failures(results) == []
            assert len(results) == len(SEQUENCE)
            serving = stack.epp_slots[: options.epp_replicas]
            assert all(routed_by(slot) > 0 for slot in serving), "every replica routes its share"
            if options.epp_replicas > 1:
                pages = [peers_page(slot) for slot in serving]
                ids = {page["id"] for page in pages}
                for page in pages:
                    assert page["tls"] is True
                    heard = page["peers"]
                    assert isinstance(heard, list)
                    assert {p["id"] for p in heard} == ids - {page["id"]}, "each hears the other"
                    refused = page["refused"]
                    assert isinstance(refused, dict) and not any(refused.values()), refused
                    assert page["batches_received"]
    print(f"adapter loads: one EPP {loads[1]:.0f}, two active-active {loads[2]:.0f}")
    assert loads[1] > 0, "the sequence needs swaps: 8 adapters, 6 slots"
    assert loads[2] <= 1.2 * loads[1] + 2


@pytest.mark.parametrize(
    "own_stack",
    [TWO, dataclasses.replace(TWO, body_mode=BodyMode.BUFFERED)],
    indirect=True,
    ids=["FAIL_OPEN-full-duplex", "FAIL_OPEN-buffered"],
)
def test_killing_one_of_two_replicas_under_load_leaves_the_other_routing(own_stack: LocalStack) -> None:
    survivor, victim = own_stack.epp_slots[0], own_stack.epp_slot
    assert victim is not None and victim is not survivor
    with open_load(own_stack, ADAPTERS, rate=30.0) as load:
        load.wait_sent(30)
        killed_at = time.monotonic()
        faults.stop_epp(own_stack)  # SIGKILL the replica started last
        faults.wait_envoy_sees_epp_down(own_stack)
        detected_at = time.monotonic()
        before = routed_by(survivor)
        load.wait_sent(load.sent() + 30)
        results = load.stop()
    failed = [r for r in results if r.status != 200 or not r.whole]
    print(
        f"one of two replicas killed at 30 req/s: {len(failed)} failed of {len(results)}; "
        f"Envoy saw it down after {detected_at - killed_at:.2f} s"
    )
    # At most the requests routing on the killed replica at that instant.
    assert all(r.started_at < detected_at for r in failed), failures(failed)
    if own_stack.options.body_mode is BodyMode.BUFFERED:
        # Envoy holds the body: a stream the dead replica was routing goes on without it.
        assert failed == [], failures(failed)
    else:
        # Full duplex: Envoy handed the body to the replica that died; at most the requests it
        # was routing at that instant fail (503, the EPP unavailable), whatever the failure mode.
        assert all(r.started_at < detected_at for r in failed), failures(failed)
        assert len(failed) <= 2, failures(failed)
    wait_until(lambda: routed_by(survivor) >= before + 25, "the survivor routes what follows", within_s=30)
