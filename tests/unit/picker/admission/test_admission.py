"""Admission: saturation levels and shedding order Sheddable < Standard < Critical."""

from __future__ import annotations

import pytest

from epp.errors import ConfigError, EppError, ErrorCode
from epp.picker.admission import SHED_MESSAGE, SaturationLevel, build_admission
from epp.picker.datastore.types import Criticality, EndpointState
from epp.picker.scheduling.picker_config import load_config
from epp.picker.scheduling.types import LLMRequest
from tests.unit.picker.scheduling.helpers import endpoint_state, snapshot_of

NOW = 50.0


def _pool(level: str) -> list[EndpointState]:
    pods = {
        "ok": [
            endpoint_state(0, updated_at=NOW, waiting=2, kv=0.5),
            endpoint_state(1, updated_at=NOW, waiting=30),
        ],
        "saturated": [
            endpoint_state(0, updated_at=NOW, waiting=10, kv=0.5),
            endpoint_state(1, updated_at=NOW, kv=0.9),
        ],
        "overloaded": [
            endpoint_state(0, updated_at=NOW, waiting=40),
            endpoint_state(1, updated_at=NOW, kv=0.99),
        ],
        "stale-only": [endpoint_state(0, updated_at=NOW - 10.0)],
        "never-scraped": [endpoint_state(0, updated_at=None), endpoint_state(1, updated_at=None)],
        "overloaded-and-stale": [
            endpoint_state(0, updated_at=NOW, waiting=40),
            endpoint_state(1, updated_at=NOW - 10.0, waiting=40),
        ],
        "empty": [],
    }
    return pods[level]


def _request(criticality: Criticality, priority: int = 0) -> LLMRequest:
    return LLMRequest(
        request_id="r", incoming_model="m", target_model="m", criticality=criticality, priority=priority
    )


CASES = [
    # (pool, criticality, priority, shed?)
    ("ok", Criticality.SHEDDABLE, 0, False),
    ("saturated", Criticality.SHEDDABLE, 0, True),
    ("saturated", Criticality.STANDARD, -1, True),
    ("saturated", Criticality.STANDARD, 0, False),
    ("saturated", Criticality.CRITICAL, 0, False),
    ("overloaded", Criticality.STANDARD, 0, True),
    ("overloaded", Criticality.CRITICAL, 0, False),
    ("overloaded", Criticality.SHEDDABLE, 0, True),
    ("stale-only", Criticality.SHEDDABLE, 0, True),
    # Missing or stale metrics are no evidence of overload: only Sheddable is shed.
    ("stale-only", Criticality.STANDARD, 0, False),
    ("never-scraped", Criticality.STANDARD, 0, False),
    ("never-scraped", Criticality.SHEDDABLE, 0, True),
    ("overloaded-and-stale", Criticality.STANDARD, 0, False),
    ("overloaded-and-stale", Criticality.SHEDDABLE, 0, True),
    ("empty", Criticality.STANDARD, 0, False),
    ("empty", Criticality.SHEDDABLE, 0, True),
    ("empty", Criticality.CRITICAL, 5, False),
]


@pytest.mark.parametrize(
    ("pool", "criticality", "priority", "shed"),
    CASES,
    ids=[f"{p}-{c.value}-prio{prio}" for p, c, prio, _ in CASES],
)
def test_shedding_order(pool: str, criticality: Criticality, priority: int, shed: bool) -> None:
    admission = build_admission()
    candidates = _pool(pool)
    request = _request(criticality, priority)
    if shed:
        with pytest.raises(EppError) as err:
            admission.admit(request, candidates, snapshot_of(candidates, NOW), NOW)
        assert err.value.code is ErrorCode.RESOURCE_EXHAUSTED
        assert err.value.http_status == 429
        assert err.value.message == SHED_MESSAGE
        assert err.value.reason in ("saturated", "overloaded")
    else:
        admission.admit(request, candidates, snapshot_of(candidates, NOW), NOW)


@pytest.mark.parametrize("pool", ["ok", "saturated", "overloaded", "stale-only"], ids=str)
def test_critical_never_shed_before_sheddable(pool: str) -> None:
    admission = build_admission()
    candidates = _pool(pool)

    def shed(c: Criticality) -> bool:
        try:
            admission.admit(_request(c), candidates, snapshot_of(candidates, NOW), NOW)
        except EppError:
            return True
        return False

    assert shed(Criticality.CRITICAL) <= shed(Criticality.STANDARD) <= shed(Criticality.SHEDDABLE)


@pytest.mark.parametrize(("priority", "shed"), [(10, False), (0, True)], ids=["priority-10", "priority-0"])
def test_an_objective_above_the_default_priority_is_never_shed(priority: int, shed: bool) -> None:
    """Upstream's legacy admission sheds only priority < 0; a positive objective is kept like Critical."""
    candidates = _pool("overloaded")
    request = LLMRequest(
        request_id="r", incoming_model="m", target_model="m", priority=priority, objective="chat"
    )
    admit = build_admission().admit
    if shed:
        with pytest.raises(EppError):
            admit(request, candidates, snapshot_of(candidates, NOW), NOW)
    else:
        admit(request, candidates, snapshot_of(candidates, NOW), NOW)


def test_thresholds_and_staleness_from_config() -> None:
    config = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: utilization-detector
  parameters: {queueDepthThreshold: 20, kvCacheUtilThreshold: 0.95, metricsStalenessThreshold: 200ms,
               shedStandard: false}
- type: queue-scorer
saturationDetector: {pluginRef: utilization-detector}
"""
    admission = build_admission(load_config(config))
    assert admission.detector.queue_depth_threshold == 20
    assert admission.detector.staleness_threshold_s == pytest.approx(0.2)
    assert admission.detector.level(_pool("saturated"), NOW) is SaturationLevel.OK
    stale = [endpoint_state(0, updated_at=NOW - 0.5)]
    assert admission.detector.level(stale, NOW) is SaturationLevel.SATURATED
    admission.admit(_request(Criticality.STANDARD), _pool("overloaded"), snapshot_of([], NOW), NOW)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ("{queueDepthThreshold: -1}", "must be ≥ 0"),
        ("{kvCacheUtilThreshold: 2}", "must be ≤ 1"),
        ("{metricsStalenessThreshold: soon}", "metricsStalenessThreshold"),
        ("{queueDepthThreshold: 30, overloadQueueDepthThreshold: 10}", "saturation detector"),
        ("{nope: 1}", "unknown parameter(s) nope"),
    ],
    ids=["negative-queue", "kv-over-one", "bad-duration", "overload-below-saturation", "unknown-param"],
)
def test_bad_detector_config(params: str, message: str) -> None:
    config = f"plugins:\n- type: utilization-detector\n  parameters: {params}\n"
    with pytest.raises(ConfigError) as err:
        build_admission(load_config(config))
    assert message in str(err.value)
