"""Strict EndpointPickerConfig loading: upstream GIE YAML works as-is.

Defaulting (as upstream): no profiles → one profile `default` holding every filter,
scorer and picker; one profile and no handler → `single-profile-handler` added; a
profile without a picker gets `max-score-picker` (`maxNumOfEndpoints` 1). Unknown
fields, unknown plugin types, unknown refs and duplicate names are `ConfigError`s that
say what and where. Weights are floats (v1.4+); integers are accepted too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from epp.errors import ConfigError
from epp.picker.scheduling.plugins import KINDS, PluginKind

API_VERSIONS = frozenset({"inference.networking.x-k8s.io/v1alpha1", "inference.networking.k8s.io/v1alpha1"})
KIND = "EndpointPickerConfig"
# Accepted so upstream files load unchanged, but not applied: the EPP's flow control, data layer,
# request parsers and feature gates are its own.
IGNORED_SECTIONS = ("featureGates", "dataLayer", "flowControl", "parser")
_TOP_LEVEL = frozenset(
    {
        "apiVersion",
        "kind",
        "plugins",
        "schedulingProfiles",
        "featureGates",
        "saturationDetector",
        "dataLayer",
        "flowControl",
        "parser",
    }
)

# LLMInferenceService `scoringWeights` key → our plugin type.
SCORING_WEIGHT_PLUGINS: Mapping[str, str] = {
    "adapterAffinity": "adapter-affinity-scorer",
    "kvCacheMatch": "kv-cache-match-scorer",
    "load": "load-scorer",
    "gpuHeadroom": "gpu-headroom-scorer",
}


@dataclass(frozen=True, slots=True)
class PluginSpec:
    name: str
    type: str
    parameters: Mapping[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> PluginKind:
        return KINDS[self.type]


@dataclass(frozen=True, slots=True)
class ProfileEntry:
    plugin_ref: str
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    name: str
    plugins: tuple[ProfileEntry, ...]


@dataclass(frozen=True, slots=True)
class PickerConfig:
    """A validated, defaulted EndpointPickerConfig."""

    plugins: tuple[PluginSpec, ...]
    profiles: tuple[ProfileSpec, ...]
    feature_gates: tuple[str, ...] = ()
    saturation_detector_ref: str | None = None
    # Top-level sections upstream defines that this EPP accepts and does not apply (logged once).
    ignored: tuple[str, ...] = ()

    def plugin(self, name: str) -> PluginSpec:
        for spec in self.plugins:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def to_yaml(self) -> str:
        """EndpointPickerConfig YAML that loads back to this config."""
        doc: dict[str, Any] = {
            "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
            "kind": KIND,
            "plugins": [
                {
                    "name": p.name,
                    "type": p.type,
                    **({"parameters": dict(p.parameters)} if p.parameters else {}),
                }
                for p in self.plugins
            ],
            "schedulingProfiles": [
                {
                    "name": prof.name,
                    "plugins": [{"pluginRef": e.plugin_ref, "weight": e.weight} for e in prof.plugins],
                }
                for prof in self.profiles
            ],
        }
        if self.feature_gates:
            doc["featureGates"] = list(self.feature_gates)
        if self.saturation_detector_ref:
            doc["saturationDetector"] = {"pluginRef": self.saturation_detector_ref}
        return yaml.safe_dump(doc, sort_keys=False)


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _only(fields: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise ConfigError(
            f"{where}: unknown field(s) {', '.join(map(str, unknown))}"
            f" (allowed: {', '.join(sorted(allowed))})"
        )


def load_config(text: str) -> PickerConfig:
    """Parse and validate EndpointPickerConfig YAML; raises ConfigError with a clear message."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"EndpointPickerConfig is not valid YAML: {err}") from err
    if doc is None:
        raise ConfigError("EndpointPickerConfig is empty")
    doc = _mapping(doc, "EndpointPickerConfig")
    _only(doc, _TOP_LEVEL, "EndpointPickerConfig")
    api_version = doc.get("apiVersion")
    if api_version is not None and api_version not in API_VERSIONS:
        raise ConfigError(
            f"EndpointPickerConfig: unsupported apiVersion {api_version!r}"
            f" (want one of {', '.join(sorted(API_VERSIONS))})"
        )
    kind = doc.get("kind")
    if kind is not None and kind != KIND:
        raise ConfigError(f"EndpointPickerConfig: kind must be {KIND!r}, got {kind!r}")

    plugins = _parse_plugins(_list(doc.get("plugins"), "plugins"))
    by_name = {p.name: p for p in plugins}
    profiles = _parse_profiles(_list(doc.get("schedulingProfiles"), "schedulingProfiles"), by_name)

    gates = tuple(
        _string(g, f"featureGates[{i}]") for i, g in enumerate(_list(doc.get("featureGates"), "featureGates"))
    )
    detector_ref: str | None = None
    if doc.get("saturationDetector") is not None:
        detector = _mapping(doc["saturationDetector"], "saturationDetector")
        _only(detector, frozenset({"pluginRef"}), "saturationDetector")
        detector_ref = _string(detector.get("pluginRef"), "saturationDetector.pluginRef")
        if detector_ref not in by_name:
            raise ConfigError(f"saturationDetector.pluginRef: no plugin named {detector_ref!r}")

    # Defaulting rules.
    if not profiles:
        entries = tuple(
            ProfileEntry(p.name)
            for p in plugins
            if p.kind in (PluginKind.FILTER, PluginKind.SCORER, PluginKind.PICKER)
        )
        profiles = (ProfileSpec("default", entries),)
    handlers = [p for p in plugins if p.kind is PluginKind.PROFILE_HANDLER]
    if len(handlers) > 1:
        raise ConfigError(
            f"exactly one profile handler allowed, got {len(handlers)}: {', '.join(h.name for h in handlers)}"
        )
    if not handlers:
        if len(profiles) > 1:
            raise ConfigError(f"{len(profiles)} scheduling profiles need a profile handler; none configured")
        plugins = (*plugins, PluginSpec("single-profile-handler", "single-profile-handler"))
    elif len(profiles) > 1:
        raise ConfigError(
            f"profile handler {handlers[0].type!r} runs exactly one profile; got {len(profiles)}"
        )
    defaulted: list[ProfileSpec] = []
    for profile in profiles:
        kinds = [by_name[e.plugin_ref].kind for e in profile.plugins if e.plugin_ref in by_name]
        if PluginKind.PICKER not in kinds:
            picker_name = "max-score-picker"
            if picker_name not in by_name:
                plugins = (*plugins, PluginSpec(picker_name, "max-score-picker"))
                by_name[picker_name] = plugins[-1]
            elif by_name[picker_name].type != "max-score-picker":
                raise ConfigError(
                    f"profile {profile.name!r} has no picker and the name {picker_name!r} is taken"
                )
            profile = ProfileSpec(profile.name, (*profile.plugins, ProfileEntry(picker_name)))
        defaulted.append(profile)
    return PickerConfig(
        plugins=plugins,
        profiles=tuple(defaulted),
        feature_gates=gates,
        saturation_detector_ref=detector_ref,
        ignored=tuple(name for name in IGNORED_SECTIONS if doc.get(name)),
    )


def _parse_plugins(raw: list[Any]) -> tuple[PluginSpec, ...]:
    specs: list[PluginSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        where = f"plugins[{i}]"
        entry = _mapping(item, where)
        _only(entry, frozenset({"name", "type", "parameters"}), where)
        type_name = _string(entry.get("type"), f"{where}.type")
        if type_name not in KINDS:
            raise ConfigError(
                f"{where}: unknown plugin type {type_name!r} (known: {', '.join(sorted(KINDS))})"
            )
        name = entry.get("name")
        name = type_name if name is None else _string(name, f"{where}.name")
        if name in seen:
            raise ConfigError(f"{where}: duplicate plugin name {name!r}")
        seen.add(name)
        parameters = entry.get("parameters")
        params = {} if parameters is None else dict(_mapping(parameters, f"{where}.parameters"))
        specs.append(PluginSpec(name=name, type=type_name, parameters=params))
    return tuple(specs)


def _parse_profiles(raw: list[Any], by_name: Mapping[str, PluginSpec]) -> tuple[ProfileSpec, ...]:
    profiles: list[ProfileSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        where = f"schedulingProfiles[{i}]"
        entry = _mapping(item, where)
        _only(entry, frozenset({"name", "plugins"}), where)
        name = _string(entry.get("name"), f"{where}.name")
        if name in seen:
            raise ConfigError(f"{where}: duplicate profile name {name!r}")
        seen.add(name)
        refs: list[ProfileEntry] = []
        pickers = 0
        used: set[str] = set()
        for j, ref_item in enumerate(_list(entry.get("plugins"), f"{where}.plugins")):
            ref_where = f"{where}.plugins[{j}]"
            ref = _mapping(ref_item, ref_where)
            _only(ref, frozenset({"pluginRef", "weight"}), ref_where)
            plugin_ref = _string(ref.get("pluginRef"), f"{ref_where}.pluginRef")
            spec = by_name.get(plugin_ref)
            if spec is None:
                raise ConfigError(f"{ref_where}: pluginRef {plugin_ref!r} names no plugin in plugins[]")
            if spec.kind not in (PluginKind.FILTER, PluginKind.SCORER, PluginKind.PICKER):
                raise ConfigError(f"{ref_where}: {plugin_ref!r} ({spec.type}) cannot be part of a profile")
            if plugin_ref in used:
                raise ConfigError(f"{ref_where}: {plugin_ref!r} appears twice in profile {name!r}")
            used.add(plugin_ref)
            weight_raw = ref.get("weight", 1)
            if isinstance(weight_raw, bool) or not isinstance(weight_raw, int | float):
                raise ConfigError(f"{ref_where}.weight: expected a number, got {weight_raw!r}")
            weight = float(weight_raw)
            if weight < 0 or weight != weight or weight == float("inf"):
                raise ConfigError(f"{ref_where}.weight: must be a finite number ≥ 0, got {weight_raw!r}")
            if spec.kind is PluginKind.PICKER:
                pickers += 1
                if pickers > 1:
                    raise ConfigError(f"{where}: more than one picker in profile {name!r}")
            refs.append(ProfileEntry(plugin_ref, weight))
        profiles.append(ProfileSpec(name, tuple(refs)))
    return tuple(profiles)


def weights_from_scoring_weights(mapping: Mapping[str, Any], *, max_endpoints: int = 1) -> PickerConfig:
    """An LLMInferenceService-style `scoringWeights` mapping → our four-scorer config.

    Keys: adapterAffinity, kvCacheMatch, load, gpuHeadroom (any subset; missing → 0, the
    scorer is left out). Weights need not sum to 1: only ratios matter for the pick.
    """
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"scoringWeights: expected a mapping, got {type(mapping).__name__}")
    unknown = sorted(set(mapping) - set(SCORING_WEIGHT_PLUGINS))
    if unknown:
        raise ConfigError(
            f"scoringWeights: unknown key(s) {', '.join(map(str, unknown))}"
            f" (allowed: {', '.join(SCORING_WEIGHT_PLUGINS)})"
        )
    plugins: list[PluginSpec] = []
    entries: list[ProfileEntry] = []
    for key, plugin_type in SCORING_WEIGHT_PLUGINS.items():
        value = mapping.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or value != value:
            raise ConfigError(f"scoringWeights.{key}: expected a number ≥ 0, got {value!r}")
        if value == 0:
            continue
        plugins.append(PluginSpec(plugin_type, plugin_type))
        entries.append(ProfileEntry(plugin_type, float(value)))
    if not entries:
        raise ConfigError("scoringWeights: every weight is 0; at least one must be positive")
    plugins.append(PluginSpec("max-score-picker", "max-score-picker", {"maxNumOfEndpoints": max_endpoints}))
    entries.append(ProfileEntry("max-score-picker"))
    return load_config(
        PickerConfig(plugins=tuple(plugins), profiles=(ProfileSpec("default", tuple(entries)),)).to_yaml()
    )
