"""One EPP's picker, built in one place: scheduler, admission, flow control, peer replicator, director.

`epp serve` builds one, `epp bench` one per simulated EPP replica, the decision-time benchmark
one to time. Each used to wire these parts by hand, and the copies drifted (the bench shed with
the default saturation thresholds whatever the config said, and forgot a silent peer on its own
timeout), so a benchmark figure no longer spoke for what `epp serve` runs. Now every caller
says what it wants in a `PickerSpec`, plain values only, and `assemble` builds the graph.

The EndpointPickerConfig (a built-in policy's own when none is given) is loaded once: the
scheduler, admission and flow control read the same one, and admission and flow control's gate
share one saturation detector, so they never disagree about when the pool is full.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from epp.clock import Clock
from epp.errors import ConfigError
from epp.picker.admission import Admission, DetectorConfig, detector_config
from epp.picker.datastore.store import Datastore
from epp.picker.director import NO_OBSERVER, DecisionObserver, Director, admit_all
from epp.picker.flowcontrol import FlowControl, build_flow_control
from epp.picker.flowcontrol.config_section import flow_control_settings
from epp.picker.lifecycle import KeyMint
from epp.picker.scheduling.build import build_scheduler, policy_config
from epp.picker.scheduling.framework import ProfileScheduler
from epp.picker.scheduling.picker_config import PickerConfig, load_config
from epp.picker.scheduling.shared import PeerReplicator
from epp.picker.scheduling.types import Scheduler

DEFAULT_POLICY = "default"
PEER_TIMEOUT_BATCHES = 50  # a peer silent this many of its batches is gone
MIN_PEER_TIMEOUT_S = 1.0  # but never sooner: a stalled loop or a slow link is not a dead replica


def peer_timeout_s(interval_s: float) -> float:
    """How long a silent peer's requests still count, for peers that send every `interval_s`."""
    return max(MIN_PEER_TIMEOUT_S, PEER_TIMEOUT_BATCHES * interval_s)


@dataclass(frozen=True, slots=True)
class PeerSpec:
    """Active-active: this replica's id and how often the replicas exchange what they route."""

    own_id: str
    interval_s: float
    # The peers known up front (the bench's replicas); empty: the transport sets them as it resolves.
    addresses: tuple[str, ...] = ()

    @property
    def timeout_s(self) -> float:
        return peer_timeout_s(self.interval_s)


@dataclass(frozen=True, slots=True)
class PickerSpec:
    """What one EPP's picker is built from: plain values, so two callers' specs compare equal."""

    config_text: str | None = None  # an EndpointPickerConfig; None: `policy`'s own
    policy: str | None = None  # a named policy, without a config (None: `default`)
    seed: int | None = None  # the scheduler's and the director's random choices
    staleness_threshold_s: float = 2.0
    # False: never queue, whatever the config asks (`epp bench` runs without flow control).
    flow_control: bool = True
    peers: PeerSpec | None = None  # None: a lone replica
    key_prefix: str | None = None  # the request keys' prefix; None: a fresh one per process

    def __post_init__(self) -> None:
        if self.config_text is not None and self.policy is not None:
            raise ValueError("a picker runs an EndpointPickerConfig or a named policy, not both")

    @property
    def policy_name(self) -> str | None:
        """The named policy this spec runs; None when it runs a config of its own."""
        return None if self.config_text is not None else (self.policy or DEFAULT_POLICY)


@dataclass(frozen=True, slots=True)
class Assembly:
    """The parts of one EPP's picker, each built once and wired to the others."""

    spec: PickerSpec
    config: PickerConfig | None  # the config every part read; None for a hand-written policy
    scheduler: Scheduler
    detector: DetectorConfig  # admission's, and flow control's gate's
    admission: Admission
    flow: FlowControl | None  # None: flow control off, requests are admitted or shed at once
    peers: PeerReplicator | None  # with `spec.peers`: the routing ledger, replicated
    director: Director


def load_picker_config(spec: PickerSpec) -> PickerConfig | None:
    """The spec's EndpointPickerConfig, loaded; a named policy's own; None for a hand-written one."""
    if spec.config_text is not None:
        return load_config(spec.config_text)
    name = spec.policy_name
    assert name is not None
    return policy_config(name)


def assemble(
    spec: PickerSpec,
    datastore: Datastore,
    *,
    clock: Clock,
    observer: DecisionObserver = NO_OBSERVER,
    scheduler: Scheduler | None = None,
    admission: Admission | None = None,
) -> Assembly:
    """Build the picker `spec` asks for over `datastore`; raises ConfigError for a bad config.

    `scheduler` and `admission` replace the ones the spec would build (unit tests that watch
    what the scheduler is asked, or tune it first); flow control still comes from the spec.
    """
    config = load_picker_config(spec)
    chosen = (
        scheduler
        if scheduler is not None
        else build_scheduler(
            config,
            policy=spec.policy_name,
            staleness_threshold_s=spec.staleness_threshold_s,
            seed=spec.seed,
        )
    )
    detector = detector_config(config, staleness_threshold_s=spec.staleness_threshold_s)
    admits = (
        admission
        if admission is not None
        else Admission(detector=detector.detector, shed_standard=detector.shed_standard)
    )
    # Read even when the spec turns queueing off: a config whose section is wrong fails here too.
    flow_settings = flow_control_settings(config, detector=detector)
    flow = build_flow_control(flow_settings, chosen.state, detector.detector) if spec.flow_control else None
    peers = _replicator(spec.peers, chosen)
    director = Director(
        datastore,
        chosen,
        # With flow control, requests queue instead of being shed up front (as upstream's newer EPP).
        admit=admit_all if flow is not None else admits.admit,
        flow=flow,
        clock=clock,
        rng=random.Random(spec.seed),
        observer=observer,
        keys=KeyMint(spec.key_prefix),
    )
    return Assembly(spec, config, chosen, detector, admits, flow, peers, director)


def _replicator(spec: PeerSpec | None, scheduler: Scheduler) -> PeerReplicator | None:
    if spec is None:
        return None
    if not isinstance(scheduler, ProfileScheduler):
        raise ConfigError(f"--peers needs a policy with scheduler state; {scheduler.name!r} keeps none")
    replicator = PeerReplicator(scheduler.state.ledger, own_id=spec.own_id, peer_timeout_s=spec.timeout_s)
    if spec.addresses:
        replicator.set_peers(spec.addresses)
    return replicator


__all__ = [
    "DEFAULT_POLICY",
    "Assembly",
    "PeerSpec",
    "PickerSpec",
    "assemble",
    "load_picker_config",
    "peer_timeout_s",
]
