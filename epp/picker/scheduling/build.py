"""Build a `Scheduler` from an EndpointPickerConfig or a named policy."""

from __future__ import annotations

from epp.errors import ConfigError
from epp.picker.scheduling.framework import (
    Filter,
    Picker,
    PluginTiming,
    Profile,
    ProfileScheduler,
    RoutingObserver,
    Scorer,
    WeightedScorer,
)
from epp.picker.scheduling.params import Params
from epp.picker.scheduling.picker_config import PickerConfig, load_config
from epp.picker.scheduling.plugins import PLUGINS, OtherPlugin, Plugin, PluginKind
from epp.picker.scheduling.policies import POLICY_NAMES, policy_config_text, policy_scheduler
from epp.picker.scheduling.state import SchedulerState
from epp.picker.scheduling.types import Scheduler

# Our policy scores at most this many endpoints per decision (homes + a random sample);
# configs loaded from YAML score every candidate, as upstream does.
MAX_SCORED_ENDPOINTS = {"default": 64, "learned-costs": 64}

__all__ = ["POLICY_NAMES", "build_scheduler", "build_scheduler_from_config", "policy_config"]


def build_scheduler(
    config: str | PickerConfig | None = None,
    *,
    policy: str | None = None,
    staleness_threshold_s: float = 2.0,
    seed: int | None = None,
    timing: PluginTiming | None = None,
) -> Scheduler:
    """`config` (EndpointPickerConfig YAML, or a config already loaded) runs under the name
    `config`; without it, the built-in `policy` (None: `default`).

    Both given: `config` is that policy's own, as `policy_config(policy)` loads it, from a caller
    that reads more from it (`epp serve` takes admission and flow control from the same config),
    so it is loaded once. Raises ConfigError for a bad config or an unknown policy name.
    """
    if staleness_threshold_s <= 0:
        raise ConfigError(f"staleness threshold must be positive, got {staleness_threshold_s}")
    loaded = load_config(config) if isinstance(config, str) else config
    if loaded is not None and policy is None:
        return build_scheduler_from_config(
            loaded, staleness_threshold_s=staleness_threshold_s, seed=seed, timing=timing
        )
    name = policy or "default"
    if name not in POLICY_NAMES:
        raise ConfigError(f"unknown scheduling policy {name!r} (known: {', '.join(POLICY_NAMES)})")
    state = SchedulerState.create(seed=seed, staleness_threshold_s=staleness_threshold_s)
    custom = policy_scheduler(name, state)
    if custom is not None:
        if loaded is not None:
            raise ConfigError(f"policy {name!r} is hand-written: it runs no EndpointPickerConfig")
        return custom
    if loaded is None:
        loaded = policy_config(name)
    assert loaded is not None  # every policy without a hand-written scheduler is a config
    return build_scheduler_from_config(
        loaded,
        staleness_threshold_s=staleness_threshold_s,
        seed=seed,
        timing=timing,
        name=name,
        max_scored_endpoints=MAX_SCORED_ENDPOINTS.get(name, 0),
    )


def policy_config(name: str) -> PickerConfig | None:
    """The loaded EndpointPickerConfig of a config-defined policy (`default`, `gie-v1`, ...);
    None for the hand-written baselines and for names that are no policy."""
    text = policy_config_text(name)
    return load_config(text) if text is not None else None


def build_scheduler_from_config(
    config: PickerConfig,
    *,
    staleness_threshold_s: float = 2.0,
    seed: int | None = None,
    timing: PluginTiming | None = None,
    name: str = "config",
    max_scored_endpoints: int = 0,
) -> ProfileScheduler:
    """Instantiate every plugin of a validated config and wire its (single) profile."""
    state = SchedulerState.create(seed=seed, staleness_threshold_s=staleness_threshold_s)
    built: dict[str, Plugin] = {}
    for spec in config.plugins:
        params = Params(spec.name, spec.parameters)
        built[spec.name] = PLUGINS[spec.type](spec.name, params, state)
        params.done()
    profile_spec = config.profiles[0]
    filters: list[Filter] = []
    scorers: list[WeightedScorer] = []
    picker: Picker | None = None
    for entry in profile_spec.plugins:
        spec = config.plugin(entry.plugin_ref)
        plugin = built[entry.plugin_ref]
        if isinstance(plugin, OtherPlugin):
            raise ConfigError(f"plugin {spec.name!r} ({spec.type}) cannot be part of a profile")
        if spec.kind is PluginKind.FILTER:
            filters.append(_as_filter(plugin))
        elif spec.kind is PluginKind.SCORER:
            if entry.weight > 0:
                scorers.append(WeightedScorer(_as_scorer(plugin), entry.weight))
        else:
            picker = _as_picker(plugin)
    if picker is None:  # load_config always adds one; guard against hand-built configs
        raise ConfigError(f"profile {profile_spec.name!r} has no picker")
    observers = [p for p in built.values() if isinstance(p, RoutingObserver)]
    profile = Profile(name=profile_spec.name, filters=tuple(filters), scorers=tuple(scorers), picker=picker)
    return ProfileScheduler(
        name, profile, state, observers=observers, timing=timing, max_scored_endpoints=max_scored_endpoints
    )


def _as_filter(plugin: Plugin) -> Filter:
    if not hasattr(plugin, "filter"):
        raise ConfigError(f"plugin {plugin.name!r} is not a filter")
    return plugin  # type: ignore[return-value]  # checked structurally above


def _as_scorer(plugin: Plugin) -> Scorer:
    if not hasattr(plugin, "score"):
        raise ConfigError(f"plugin {plugin.name!r} is not a scorer")
    return plugin  # type: ignore[return-value]  # checked structurally above


def _as_picker(plugin: Plugin) -> Picker:
    if not hasattr(plugin, "pick"):
        raise ConfigError(f"plugin {plugin.name!r} is not a picker")
    return plugin  # type: ignore[return-value]  # checked structurally above
