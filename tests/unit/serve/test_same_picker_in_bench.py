"""`epp serve` and `epp bench` build the same picker from the same configuration.

Both build it with `epp.picker.assembly.assemble`, each from its own entry point: serve from its
settings tree (`build_picker`), the bench per simulated EPP replica (`events.build_replica`). These
tests compare what the two entry points built, part by part (the scheduler's plugins and their
settings, the admission detector's thresholds, flow control's settings and gate, the peer
exchange's timing), so a change that makes one entry point build something else fails here.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools

import pytest

from epp.clock import FakeClock
from epp.errors import ConfigError
from epp.picker.assembly import Assembly, PickerSpec
from epp.picker.datastore.store import Datastore
from epp.picker.director import NO_OBSERVER
from epp.picker.scheduling.framework import ProfileScheduler
from epp.serve.app import build_picker
from epp.serve.settings import PeerSettings, PoolSettings, SchedulingSettings, ServeSettings
from epp.tools.bench import events, policies, scenario
from epp.tools.bench.model import PodConfig

SEED = 7
PEER_INTERVAL_S = 0.2

# Every knob a user is likely to turn: weights and plugin parameters, the detector's thresholds,
# the flowControl section with its own bands and policies.
TUNED_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: adapter-affinity-scorer
- type: load-scorer
  parameters: {queueScale: 4}
- type: prefix-cache-scorer
- type: max-score-picker
  parameters: {maxNumOfEndpoints: 2}
- type: lora-capacity-detector
  parameters: {queueDepthThreshold: 9, kvCacheUtilThreshold: 0.7, drainAfter: 3s}
- type: round-robin-fairness-policy
saturationDetector: {pluginRef: lora-capacity-detector}
flowControl:
  defaultRequestTTL: 20s
  maxRequests: 300
  defaultPriorityBand: {maxRequests: 40, fairnessPolicyRef: round-robin-fairness-policy}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: adapter-affinity-scorer, weight: 0.6}
  - {pluginRef: load-scorer, weight: 0.3}
  - {pluginRef: prefix-cache-scorer, weight: 0.1}
  - {pluginRef: max-score-picker}
"""

# Upstream's legacy admission: no flow control, shedding by a detector with its own thresholds.
SHEDDING_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: saturation-detector
  parameters:
    queueDepthThreshold: 2
    kvCacheUtilThreshold: 0.5
    overloadQueueDepthThreshold: 3
    shedStandard: false
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 1}
"""

_names = (f"assembly-config-{n}" for n in itertools.count())


@dataclasses.dataclass(frozen=True)
class Case:
    """One picker, as `epp serve` is told it and as `epp bench` is."""

    id: str
    policy: str | None = None  # a built-in policy, by name
    config: str | None = None  # or an EndpointPickerConfig
    peers: bool = True  # active-active: serve `--peers`, the bench several EPP replicas


CASES = (
    Case("default", policy="default"),
    Case("learned-costs", policy="learned-costs"),
    Case("gie-v1", policy="gie-v1"),
    Case("round-robin", policy="round-robin", peers=False),
    Case("gie-v0.3", policy="gie-v0.3", peers=False),
    Case("tuned-config", config=TUNED_CONFIG),
    Case("shedding-config", config=SHEDDING_CONFIG),
)


def serve_picker(case: Case) -> Assembly:
    settings = ServeSettings(
        pool=PoolSettings(name="pool", namespace="default"),
        scheduling=SchedulingSettings(picker_config_text=case.config, policy=case.policy, seed=SEED),
        peers=PeerSettings(
            addresses="epp-peers.default.svc:9004" if case.peers else "",
            interval_s=PEER_INTERVAL_S,
            insecure=True,
        ),
    )
    clock = FakeClock()
    return build_picker(settings, Datastore(clock), clock, NO_OBSERVER)


def bench_picker(case: Case, policy: str) -> Assembly:
    fleet = events.Fleet(
        scenario.load("brief").profile,
        PodConfig(),
        replicas=2,
        epp_replicas=2 if case.peers else 1,
        peer_interval_s=PEER_INTERVAL_S,
    )
    return events.build_replica(policy, fleet, FakeClock(start=0.0), seed=SEED, replica=0).picker


@pytest.fixture(params=CASES, ids=[c.id for c in CASES])
def both(request: pytest.FixtureRequest) -> tuple[Assembly, Assembly]:
    case: Case = request.param
    policy = policies.add_config(case.config, next(_names)) if case.config is not None else case.policy
    assert policy is not None
    return serve_picker(case), bench_picker(case, policy)


def plain(value: object) -> bool:
    """A setting, not a collaborator: numbers, text, flags, enums, and tuples of those."""
    if isinstance(value, tuple | frozenset):
        return all(plain(v) for v in value)
    return value is None or isinstance(value, bool | int | float | str | enum.Enum)


def settings_of(part: object) -> dict[str, object]:
    """A plugin's (or gate's) type and the plain values it was built with."""
    if dataclasses.is_dataclass(part):
        values = {f.name: getattr(part, f.name) for f in dataclasses.fields(part)}
    else:
        values = dict(vars(part)) if hasattr(part, "__dict__") else {}
    return {"type": type(part).__name__} | {k: v for k, v in values.items() if plain(v)}


def graph(picker: Assembly) -> dict[str, object]:
    """What a user configures, as the picker was built with it."""
    scheduler = picker.scheduler
    described: dict[str, object] = {
        "scheduler": type(scheduler).__name__,
        "name": scheduler.name,
        "staleness_s": scheduler.state.staleness_threshold_s,
    }
    if isinstance(scheduler, ProfileScheduler):
        profile = scheduler.profile
        described |= {
            "filters": [settings_of(f) for f in profile.filters],
            "scorers": [(settings_of(w.scorer), w.weight) for w in profile.scorers],
            "picker": settings_of(profile.picker),
        }
    flow = picker.flow
    peers = picker.spec.peers
    return described | {
        "detector": picker.detector,
        "admission": picker.admission,
        "flow": None if flow is None else (flow.queues.settings, type(flow.gate).__name__),
        "peers": None if peers is None else (type(picker.peers).__name__, peers.interval_s, peers.timeout_s),
        "seed": picker.spec.seed,
    }


def identity_free(spec: PickerSpec) -> PickerSpec:
    """`spec` without what names one replica (its id, its peers, its request keys)."""
    peers = None if spec.peers is None else dataclasses.replace(spec.peers, own_id="", addresses=())
    return dataclasses.replace(spec, peers=peers, key_prefix=None)


def test_serve_and_bench_build_the_same_picker(both: tuple[Assembly, Assembly]) -> None:
    served, benched = both
    assert identity_free(served.spec) == identity_free(benched.spec)
    assert graph(served) == graph(benched)


@pytest.mark.parametrize(
    "changes",
    [
        [("queueScale: 4", "queueScale: 5")],  # a scorer's parameter
        [("weight: 0.3", "weight: 0.2")],  # a scorer's weight
        [("maxNumOfEndpoints: 2", "maxNumOfEndpoints: 3")],  # the picker's
        [("queueDepthThreshold: 9", "queueDepthThreshold: 8")],  # the detector's
        [("defaultRequestTTL: 20s", "defaultRequestTTL: 21s")],  # flow control's
        [(", drainAfter: 3s", ""), ("lora-capacity-detector", "saturation-detector")],  # the gate's type
    ],
    ids=["scorer", "weight", "picker", "detector", "flow-control", "gate"],
)
def test_the_comparison_sees_a_change_in_any_part(changes: list[tuple[str, str]]) -> None:
    """Not vacuous: one value changed anywhere in the config changes what is compared."""
    changed = TUNED_CONFIG
    for old, new in changes:
        assert old in changed
        changed = changed.replace(old, new)
    case = Case("tuned", config=TUNED_CONFIG)
    assert graph(serve_picker(case)) != graph(serve_picker(dataclasses.replace(case, config=changed)))


def test_a_tuned_config_reaches_every_part_in_both() -> None:
    """The tuned config's values are the ones built (not defaults that happen to agree)."""
    case = next(c for c in CASES if c.id == "tuned-config")
    benched = bench_picker(case, policies.add_config(TUNED_CONFIG, next(_names)))
    served = serve_picker(case)
    for picker in (served, benched):
        detector = picker.detector.detector
        assert (detector.queue_depth_threshold, detector.kv_cache_util_threshold) == (9, 0.7)
        assert picker.admission.detector == detector
        assert picker.flow is not None
        settings = picker.flow.queues.settings
        assert (settings.request_ttl_s, settings.max_requests, settings.drain_after_s) == (20.0, 300, 3.0)
        assert settings.default_band.max_requests == 40
        assert picker.peers is not None and picker.spec.peers is not None
        assert picker.spec.peers.timeout_s == 50 * PEER_INTERVAL_S


def test_shedding_by_the_configured_detector_in_both() -> None:
    case = next(c for c in CASES if c.id == "shedding-config")
    served, benched = (
        serve_picker(case),
        bench_picker(case, policies.add_config(SHEDDING_CONFIG, next(_names))),
    )
    for picker in (served, benched):
        assert picker.flow is None, "no flowControl gate: requests are shed, not queued"
        assert picker.admission.detector.queue_depth_threshold == 2
        assert picker.admission.detector.overload_queue_depth_threshold == 3
        assert picker.admission.shed_standard is False


def test_a_hand_written_policy_exchanges_no_routing() -> None:
    """`epp serve --peers` refuses a policy that keeps no routing state to share; the bench's
    replicas of such a policy run without the exchange."""
    case = Case("round-robin", policy="round-robin", peers=True)
    with pytest.raises(ConfigError, match="--peers needs a policy with scheduler state"):
        serve_picker(case)
    assert bench_picker(case, "round-robin").peers is None
