"""The routing policies the benchmark compares: the same pickers `epp serve` runs.

`policy_spec(name, seed=...)` says which picker a policy is (a built-in policy by name, or a
user's EndpointPickerConfig by its text), and `epp.picker.assembly.assemble` builds its
scheduler, admission (by the config's saturation detector) and flow control exactly as it
builds `epp serve`'s, so a result here speaks for the code that serves traffic. `add_config`
makes a user's EndpointPickerConfig a policy of the run (`epp bench --config-file`).
"""

from __future__ import annotations

from epp.errors import ConfigError
from epp.picker.assembly import PickerSpec
from epp.picker.scheduling.picker_config import load_config
from epp.picker.scheduling.policies import POLICY_NAMES, policy_config_text

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


def policy_spec(name: str, *, seed: int) -> PickerSpec:
    """The picker `name` runs, as `epp serve` would be told it: a config given to this run by
    its text (as `--config-file`), a built-in policy by its name (as `--policy`)."""
    if name in _configs:
        return PickerSpec(config_text=_configs[name], seed=seed)
    return PickerSpec(policy=name, seed=seed)


def replicates_routing(name: str) -> bool:
    """Whether replicas running `name` can exchange what they route (`epp serve --peers`): only
    policies built from a config keep the routing state the exchange replicates."""
    return config_text(name) is not None


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
