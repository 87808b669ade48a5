"""The routing policies the benchmark compares: the same scheduler classes `epp serve` runs.

`make_scheduler(name, seed)` is `epp.picker.scheduling.build.build_scheduler(policy=name, seed=seed)`
and `make_admission()` is `epp.picker.admission.build_admission()` with their defaults, so a result
here speaks for the code that serves traffic.
"""

from __future__ import annotations

from epp.errors import ConfigError
from epp.picker.admission import Admission, build_admission
from epp.picker.scheduling.build import build_scheduler
from epp.picker.scheduling.policies import POLICY_NAMES
from epp.picker.scheduling.types import Scheduler

ALL_POLICIES: tuple[str, ...] = POLICY_NAMES


def make_scheduler(name: str, seed: int) -> Scheduler:
    """A fresh scheduler for one simulated run (schedulers keep state between requests)."""
    return build_scheduler(policy=name, seed=seed)


def make_admission() -> Admission:
    return build_admission()


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
