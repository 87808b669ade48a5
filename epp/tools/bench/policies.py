"""The routing policies the benchmark compares: the same scheduler classes `epp serve` runs.

`make_scheduler(name, seed)` is `epp.picker.scheduling.build.build_scheduler(policy=name, seed=seed)`
and `make_admission()` is `epp.picker.admission.build_admission()` with their defaults, so a result
here speaks for the code that serves traffic.
"""

from __future__ import annotations

from epp.errors import ConfigError
from epp.picker.admission import Admission, build_admission, detector_config
from epp.picker.flowcontrol import FlowControl, build_flow_control
from epp.picker.flowcontrol.config import flow_control_settings
from epp.picker.scheduling.build import build_scheduler
from epp.picker.scheduling.config import load_config
from epp.picker.scheduling.policies import POLICY_NAMES, policy_config_text
from epp.picker.scheduling.state import SchedulerState
from epp.picker.scheduling.types import Scheduler

ALL_POLICIES: tuple[str, ...] = POLICY_NAMES


def make_scheduler(name: str, seed: int) -> Scheduler:
    """A fresh scheduler for one simulated run (schedulers keep state between requests)."""
    return build_scheduler(policy=name, seed=seed)


def make_admission() -> Admission:
    return build_admission()


def make_flow_control(policy: str, state: SchedulerState) -> FlowControl | None:
    """Flow control as `epp serve` runs it for `policy` (from the policy's EndpointPickerConfig:
    on for `default`, off for the upstream-compatible policies, as upstream ships them)."""
    text = policy_config_text(policy)
    config = load_config(text) if text is not None else None
    detector = detector_config(config)
    return build_flow_control(flow_control_settings(config, detector=detector), state, detector.detector)


def parse_policies(text: str) -> list[str]:
    """`a,b,c` → names, each a known policy, none twice; ConfigError otherwise."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ConfigError("--policies names no policy")
    if len(set(names)) != len(names):
        raise ConfigError("--policies names a policy twice")
    unknown = [n for n in names if n not in ALL_POLICIES]
    if unknown:
        raise ConfigError(f"unknown policies {', '.join(unknown)} (known: {', '.join(ALL_POLICIES)})")
    return names
