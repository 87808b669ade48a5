"""The routing policies the benchmark compares: the same scheduler classes `epp serve` runs.

`make_scheduler(name, seed)` is `epp.picker.scheduling.build.build_scheduler(policy=name, seed=seed)`,
`make_flow_control` builds flow control from the policy's EndpointPickerConfig as `epp serve` does,
and `make_admission()` is `epp.picker.admission.build_admission()` with its defaults, so a result
here speaks for the code that serves traffic. `add_config` makes a user's EndpointPickerConfig a
policy of the run (`epp bench --config-file`).
"""

from __future__ import annotations

from epp.errors import ConfigError
from epp.picker.admission import Admission, build_admission, detector_config
from epp.picker.flowcontrol import FlowControl, build_flow_control
from epp.picker.flowcontrol.config_section import flow_control_settings
from epp.picker.scheduling.build import build_scheduler
from epp.picker.scheduling.picker_config import load_config
from epp.picker.scheduling.policies import POLICY_NAMES, policy_config_text
from epp.picker.scheduling.state import SchedulerState
from epp.picker.scheduling.types import Scheduler

ALL_POLICIES: tuple[str, ...] = POLICY_NAMES
CONFIG_POLICY = "config"  # `epp bench --config-file`: the user's EndpointPickerConfig, as `epp serve` runs it

# EndpointPickerConfig text of the policies a run was given as files, by name.
_configs: dict[str, str] = {}


def add_config(text: str, name: str = CONFIG_POLICY) -> str:
    """Make an EndpointPickerConfig a policy of this run, named `name`; ConfigError when it is bad."""
    load_config(text)
    _configs[name] = text
    return name


def config_text(name: str) -> str | None:
    """The EndpointPickerConfig `name` runs: a file given to this run, or a built-in policy's."""
    return _configs.get(name) or policy_config_text(name)


def make_scheduler(name: str, seed: int) -> Scheduler:
    """A fresh scheduler for one simulated run (schedulers keep state between requests)."""
    if name in _configs:
        return build_scheduler(_configs[name], seed=seed)
    return build_scheduler(policy=name, seed=seed)


def make_admission() -> Admission:
    return build_admission()


def make_flow_control(policy: str, state: SchedulerState) -> FlowControl | None:
    """Flow control as `epp serve` runs it for `policy` (from the policy's EndpointPickerConfig:
    on for `default`, off for the upstream-compatible policies, as upstream ships them)."""
    text = config_text(policy)
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
    known = (*ALL_POLICIES, *_configs)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"unknown policies {', '.join(unknown)} (known: {', '.join(known)})")
    return names
