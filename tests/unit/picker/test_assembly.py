"""The picker assembly: one spec in, a scheduler, admission, flow control, peers and a director out."""

from __future__ import annotations

import json

import pytest

from epp.clock import FakeClock
from epp.errors import ConfigError, EppError, ErrorCode
from epp.picker.assembly import Assembly, PeerSpec, PickerSpec, assemble, peer_timeout_s
from epp.picker.datastore.types import Metrics
from epp.picker.flowcontrol.capacity import SaturationGate, SlotGate
from epp.picker.lifecycle import RequestLife, Stage
from epp.picker.scheduling.framework import ProfileScheduler
from tests.support.fake_scheduler import FakeScheduler, pool_datastore

# No flowControl gate; a detector that calls a pod with one request waiting overloaded.
SHEDDING = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: saturation-detector
  parameters: {queueDepthThreshold: 0, overloadQueueDepthThreshold: 0, kvCacheUtilThreshold: 0.1}
"""
BAD_SECTION = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
flowControl:
  enableEviction: true
"""
BODY = json.dumps({"model": "base", "prompt": "hi"}).encode()


def build(
    spec: PickerSpec, *, scheduler: FakeScheduler | None = None, waiting: int | None = None
) -> Assembly:
    """`spec`'s picker over two pods; with `waiting`, each pod has just reported that many waiting."""
    clock = FakeClock()
    store = pool_datastore(clock=clock)
    if waiting is not None:
        for endpoint in store.endpoints():
            store.update_metrics(endpoint.name, Metrics(updated_at=clock.now(), waiting_requests=waiting))
    return assemble(spec, store, clock=clock, scheduler=scheduler)


def arrive(picker: Assembly) -> RequestLife:
    life = picker.director.mint()
    picker.director.arrive(life, headers={}, body=BODY)
    return life


def test_a_spec_names_a_config_or_a_policy_not_both() -> None:
    with pytest.raises(ValueError, match="not both"):
        PickerSpec(config_text=SHEDDING, policy="default")
    assert PickerSpec().policy_name == "default"
    assert PickerSpec(config_text=SHEDDING).policy_name is None


def test_the_default_policy_queues_behind_its_slot_gate() -> None:
    picker = build(PickerSpec(seed=1))
    assert isinstance(picker.scheduler, ProfileScheduler) and picker.scheduler.name == "default"
    assert picker.flow is not None and isinstance(picker.flow.gate, SlotGate)
    assert picker.config is not None and picker.detector.plugin_type == "lora-capacity-detector"
    assert picker.peers is None


def test_without_flow_control_requests_are_shed_by_the_configured_detector() -> None:
    spec = PickerSpec(config_text=SHEDDING, seed=1)
    picker = build(spec, waiting=1)
    assert picker.flow is None
    assert picker.admission.detector is picker.detector.detector
    with pytest.raises(EppError) as refused:
        arrive(picker)  # one waiting request is over this detector's overload threshold (0)
    assert (refused.value.code, refused.value.http_status) == (ErrorCode.RESOURCE_EXHAUSTED, 429)
    assert arrive(build(spec, waiting=0)).stage is Stage.DISPATCHED
    upstream = SHEDDING.replace(
        "parameters: {queueDepthThreshold: 0, overloadQueueDepthThreshold: 0, kvCacheUtilThreshold: 0.1}",
        "parameters: {}",
    )
    assert arrive(build(PickerSpec(config_text=upstream), waiting=1)).stage is Stage.DISPATCHED


def test_turning_queueing_off_keeps_the_detector_and_still_checks_the_section() -> None:
    picker = build(PickerSpec(policy="default", flow_control=False))
    assert picker.flow is None
    assert picker.detector.plugin_type == "lora-capacity-detector"
    with pytest.raises(ConfigError, match="enableEviction"):
        build(PickerSpec(config_text=BAD_SECTION, flow_control=False))


def test_upstreams_detector_gates_the_whole_pool() -> None:
    config = SHEDDING.replace("plugins:", "featureGates: [flowControl]\nplugins:")
    picker = build(PickerSpec(config_text=config))
    assert picker.flow is not None and isinstance(picker.flow.gate, SaturationGate)
    assert picker.admission.detector is picker.detector.detector


def test_peers_replicate_the_ledger_and_forget_a_silent_peer_after_fifty_batches() -> None:
    spec = PickerSpec(peers=PeerSpec(own_id="me", interval_s=0.1, addresses=("a", "b")))
    picker = build(spec)
    assert picker.peers is not None
    assert picker.peers.own_id == "me" and sorted(picker.peers.peers()) == ["a", "b"]
    assert picker.peers.ledger is picker.scheduler.state.ledger
    assert [peer_timeout_s(s) for s in (0.1, 0.05, 0.01)] == [5.0, 2.5, 1.0]
    assert spec.peers is not None and spec.peers.timeout_s == 5.0


def test_a_hand_written_policy_has_no_ledger_to_replicate() -> None:
    with pytest.raises(ConfigError, match="--peers needs a policy with scheduler state"):
        build(PickerSpec(policy="round-robin", peers=PeerSpec(own_id="me", interval_s=0.1)))


def test_request_keys_carry_the_given_prefix() -> None:
    picker = build(PickerSpec(key_prefix="epp-3"))
    assert picker.director.key_prefix == "epp-3-"
    assert picker.director.mint().key.startswith("epp-3-")
    assert build(PickerSpec()).director.key_prefix != build(PickerSpec()).director.key_prefix


def test_a_given_scheduler_runs_with_the_specs_flow_control() -> None:
    scheduler = FakeScheduler()
    picker = build(PickerSpec(policy="default"), scheduler=scheduler)
    assert picker.scheduler is scheduler and picker.director.scheduler is scheduler
    assert picker.flow is not None
    life = arrive(picker)  # a free slot and no queue: dispatched at once, by the given scheduler
    assert life.stage is Stage.DISPATCHED and len(scheduler.scheduled) == 1


def test_a_bad_config_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        build(PickerSpec(config_text="kind: EndpointPickerConfig\nplugins: [{type: no-such-plugin}]\n"))
    with pytest.raises(ConfigError, match="unknown scheduling policy"):
        build(PickerSpec(policy="no-such-policy"))
