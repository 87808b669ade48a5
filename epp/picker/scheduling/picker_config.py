"""Strict EndpointPickerConfig loading: upstream GIE YAML works as-is.

Defaulting (as upstream): no profiles → one profile `default` holding every filter,
scorer and picker; one profile and no handler → `single-profile-handler` added; a
profile without a picker gets `max-score-picker` (`maxNumOfEndpoints` 1). Unknown
fields, unknown plugin types, unknown refs and duplicate names are `ConfigError`s that
say what and where. Weights are floats (v1.4+); integers are accepted too.

The `flowControl` section is read here in full, whether or not the `flowControl` feature gate
turns it on: a typo fails at start-up either way, not on the day someone flips the gate. What
it means for the queues (defaults, the capacity gate) is `epp.picker.flowcontrol.config_section`'s job;
see there for which upstream keys are applied and which are refused.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import yaml

from epp.durations import parse_duration
from epp.errors import ConfigError
from epp.picker.scheduling.params import Params
from epp.picker.scheduling.plugins import (
    DEFAULT_FAIRNESS_POLICY,
    DEFAULT_ORDERING_POLICY,
    KINDS,
    UNSUPPORTED_TYPES,
    PluginKind,
    PolicyPlugin,
    policy_plugin,
)

API_VERSIONS = frozenset({"inference.networking.x-k8s.io/v1alpha1", "inference.networking.k8s.io/v1alpha1"})
KIND = "EndpointPickerConfig"
FLOW_CONTROL_GATE = "flowControl"
# Accepted so upstream files load unchanged, but not applied: the EPP's data layer and request
# parsers are its own. `featureGates` counts when it lists a gate other than `flowControl`;
# `flowControl` when its gate is off and the section sets more than which saturation detector
# to use (upstream, too, reads only the detector then).
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

# `flowControl` keys. Those in _FLOW_CONTROL_REFUSED are upstream's and name something this EPP
# does not have; they fail with the reason instead of "unknown field".
_FLOW_CONTROL_KEYS = frozenset(
    {
        "maxBytes",
        "maxRequests",
        "defaultRequestTTL",
        "defaultPriorityBand",
        "defaultNegativePriorityBand",
        "priorityBands",
        "saturationDetector",
        "enableEviction",
        "noEndpointRequestTTL",
    }
)
_FLOW_CONTROL_REFUSED: Mapping[str, str] = {
    "usageLimitPolicyPluginRef": (
        "usage-limit policies are not supported; every band dispatches until the capacity gate"
        " closes, as upstream's default static policy does"
    ),
    "bandSelectionPolicyPluginRef": "band-selection policies are not supported; bands go by priority",
}
_BAND_KEYS = frozenset({"priority", "maxBytes", "maxRequests", "fairnessPolicyRef", "orderingPolicyRef"})
_BAND_REFUSED: Mapping[str, str] = {
    "defaultRequestTTL": "a per-band TTL is not supported; set flowControl.defaultRequestTTL",
}

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
class PriorityBandSpec:
    """A `flowControl` band or band template as written; a limit of 0 means upstream's default."""

    max_bytes: int = 0
    max_requests: int = 0
    fairness: PolicyPlugin = DEFAULT_FAIRNESS_POLICY
    ordering: PolicyPlugin = DEFAULT_ORDERING_POLICY


@dataclass(frozen=True, slots=True)
class FlowControlSpec:
    """The validated `flowControl` section (its detector ref lives in `PickerConfig`); 0: unlimited."""

    max_bytes: int = 0
    max_requests: int = 0
    request_ttl_s: float | None = None  # None: unset (upstream: 60 s); 0: no TTL
    default_band: PriorityBandSpec = PriorityBandSpec()
    default_negative_band: PriorityBandSpec | None = None  # None: `default_band` serves priorities < 0
    bands: tuple[tuple[int, PriorityBandSpec], ...] = ()  # (priority, band), as listed


@dataclass(frozen=True, slots=True)
class PickerConfig:
    """A validated, defaulted EndpointPickerConfig."""

    plugins: tuple[PluginSpec, ...]
    profiles: tuple[ProfileSpec, ...]
    feature_gates: tuple[str, ...] = ()
    saturation_detector_ref: str | None = None
    flow_control: FlowControlSpec = FlowControlSpec()
    # Top-level sections upstream defines that this EPP accepts and does not apply (logged once).
    ignored: tuple[str, ...] = ()

    @property
    def flow_control_enabled(self) -> bool:
        """Whether the `flowControl` feature gate is on: requests queue in the EPP."""
        return _gate(self.feature_gates, FLOW_CONTROL_GATE)

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
        flow_control = _flow_control_yaml(self.flow_control)
        if flow_control:
            doc["flowControl"] = flow_control
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
    flow_control_on = _gate(gates, FLOW_CONTROL_GATE)
    detector_ref = _detector_ref(doc.get("saturationDetector"), "saturationDetector", by_name)
    flow_control = FlowControlSpec()
    flow_control_doc = doc.get("flowControl")
    if flow_control_doc is not None:
        flow_control_doc = _mapping(flow_control_doc, "flowControl")
        flow_control = _parse_flow_control(flow_control_doc, by_name)
        # Newer upstream moved the detector ref into this section; it applies with the gate off too.
        nested_ref = _detector_ref(
            flow_control_doc.get("saturationDetector"), "flowControl.saturationDetector", by_name
        )
        if nested_ref is not None:
            if detector_ref is not None and detector_ref != nested_ref:
                raise ConfigError(
                    f"flowControl.saturationDetector.pluginRef {nested_ref!r} and"
                    f" saturationDetector.pluginRef {detector_ref!r} name different detectors; keep one"
                )
            detector_ref = nested_ref
    ignored = {
        "featureGates": any(_gate_name(g) != FLOW_CONTROL_GATE for g in gates),
        "dataLayer": bool(doc.get("dataLayer")),
        "flowControl": not flow_control_on and flow_control != FlowControlSpec(),
        "parser": bool(doc.get("parser")),
    }

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
        flow_control=flow_control,
        ignored=tuple(name for name in IGNORED_SECTIONS if ignored[name]),
    )


def _gate_name(gate: str) -> str:
    return gate.partition("=")[0].strip()


def _gate(gates: tuple[str, ...], name: str) -> bool:
    """Whether `name` is on: listed as `name` or `name=true`; `name=false` (or absent) is off.

    Other gates are accepted and not checked: upstream's gates are its own features, and a file
    written for it should still load here. Only `name` is held to the `name[=true|false]` form.
    """
    state: bool | None = None
    for i, gate in enumerate(gates):
        gate_name, has_value, value = gate.partition("=")
        gate_name = gate_name.strip()
        if gate_name != name:
            if gate_name.lower() == name.lower():
                raise ConfigError(f"featureGates[{i}]: unknown gate {gate_name!r}; did you mean {name!r}?")
            continue
        value = value.strip().lower()
        if has_value and value not in ("true", "false"):
            raise ConfigError(
                f"featureGates[{i}]: expected {name!r}, {name}=true or {name}=false, got {gate!r}"
            )
        on = not has_value or value == "true"
        if state is not None and state != on:
            raise ConfigError(f"featureGates: {name!r} is listed both on and off")
        state = on
    return bool(state)


def _detector_ref(raw: Any, where: str, by_name: Mapping[str, PluginSpec]) -> str | None:
    if raw is None:
        return None
    detector = _mapping(raw, where)
    _only(detector, frozenset({"pluginRef"}), where)
    ref = _string(detector.get("pluginRef"), f"{where}.pluginRef")
    if ref not in by_name:
        raise ConfigError(f"{where}.pluginRef: no plugin named {ref!r}")
    return ref


# -- flowControl ------------------------------------------------------------------------------

# A Kubernetes resource.Quantity: a decimal number, then a binary or decimal SI suffix or a
# decimal exponent ("10Gi", "500M", "1.5k", "1e3"). "m" (milli) is valid but not as a byte count.
_QUANTITY = re.compile(r"([+-]?)(\d+(?:\.\d*)?|\.\d+)(?:[eE]([+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E))?")
_SUFFIXES: Mapping[str, Fraction] = {
    **{s: Fraction(1024**i) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), start=1)},
    **{s: Fraction(1000**i) for i, s in enumerate(("k", "M", "G", "T", "P", "E"), start=1)},
    "m": Fraction(1, 1000),
}
_INT64_MAX = 2**63 - 1


def parse_quantity(value: Any, where: str) -> int:
    """A Kubernetes quantity (`10Gi`, `500M`, `1e3`, or a plain number) → a count ≥ 0.

    A fraction rounds up, as upstream's `Quantity.Value()` does; upstream keeps values in an
    int64, so larger ones are refused rather than wrapped.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(f"{where}: expected a quantity such as 512Mi, 10Gi or 1000, got {value!r}")
    if isinstance(value, int):
        amount = Fraction(value)
    else:
        match = _QUANTITY.fullmatch(str(value).strip())
        if match is None:
            raise ConfigError(f"{where}: expected a quantity such as 512Mi, 10Gi or 1000, got {value!r}")
        sign, number, exponent, suffix = match.groups()
        amount = Fraction(number)
        if exponent is not None:
            if abs(int(exponent)) > 30:
                raise ConfigError(f"{where}: quantity {value!r} is out of range")
            amount *= Fraction(10) ** int(exponent)
        elif suffix is not None:
            amount *= _SUFFIXES[suffix]
        if sign == "-":
            amount = -amount
    if amount < 0:
        raise ConfigError(f"{where}: must not be negative, got {value!r}")
    count = math.ceil(amount)
    if count > _INT64_MAX:
        raise ConfigError(f"{where}: quantity {value!r} is out of range")
    return count


def parse_config_duration(value: Any, where: str) -> float:
    """A Go duration (`60s`, `1m0s`, `500ms`) or a number of seconds → seconds ≥ 0."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(f"{where}: expected a duration such as 60s or 500ms, got {value!r}")
    if isinstance(value, str) and value.strip().startswith("-"):
        raise ConfigError(f"{where}: must not be negative, got {value!r}")
    try:
        seconds = float(value) if not isinstance(value, str) else parse_duration(value)
    except ValueError as err:  # a DurationError says what is wrong
        raise ConfigError(f"{where}: {err}") from err
    if not math.isfinite(seconds):
        raise ConfigError(f"{where}: expected a finite duration, got {value!r}")
    if seconds < 0:
        raise ConfigError(f"{where}: must not be negative, got {value!r}")
    return seconds


def _format_duration(seconds: float) -> str | float:
    """A Go duration that parses back to exactly `seconds`, else the number itself."""
    text = f"{seconds:g}s"
    try:
        if parse_duration(text) == seconds:
            return text
    except ValueError:
        pass
    return seconds


def _refuse(section: Mapping[str, Any], refused: Mapping[str, str], where: str) -> None:
    for key, why in refused.items():
        if key in section:
            raise ConfigError(f"{where}.{key}: not supported: {why}")


def _parse_flow_control(section: Mapping[str, Any], by_name: Mapping[str, PluginSpec]) -> FlowControlSpec:
    where = "flowControl"
    _refuse(section, _FLOW_CONTROL_REFUSED, where)
    _only(section, _FLOW_CONTROL_KEYS, where)
    eviction = section.get("enableEviction")
    if eviction is not None and not isinstance(eviction, bool):
        raise ConfigError(f"{where}.enableEviction: expected true or false, got {eviction!r}")
    if eviction:
        raise ConfigError(
            f"{where}.enableEviction: not supported: a request that has started is never cut off here"
        )
    no_endpoint_ttl = section.get("noEndpointRequestTTL")
    no_endpoint_where = f"{where}.noEndpointRequestTTL"
    if no_endpoint_ttl is not None and parse_config_duration(no_endpoint_ttl, no_endpoint_where):
        raise ConfigError(
            f"{no_endpoint_where}: not supported: with no endpoints a request is answered 503 at once (0s)"
        )
    ttl = section.get("defaultRequestTTL")
    default_band = PriorityBandSpec()
    if section.get("defaultPriorityBand") is not None:
        default_band = _parse_band(section["defaultPriorityBand"], f"{where}.defaultPriorityBand", by_name)
    negative_band: PriorityBandSpec | None = None
    if section.get("defaultNegativePriorityBand") is not None:
        negative_band = _parse_band(
            section["defaultNegativePriorityBand"], f"{where}.defaultNegativePriorityBand", by_name
        )
    bands: dict[int, PriorityBandSpec] = {}
    for i, item in enumerate(_list(section.get("priorityBands"), f"{where}.priorityBands")):
        band_where = f"{where}.priorityBands[{i}]"
        entry = _mapping(item, band_where)
        priority = entry.get("priority")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ConfigError(f"{band_where}.priority: required, an integer; got {priority!r}")
        band = _parse_band(entry, band_where, by_name)
        if priority in bands:
            raise ConfigError(f"{band_where}: duplicate priority level {priority}")
        bands[priority] = band
    return FlowControlSpec(
        max_bytes=_optional_quantity(section, "maxBytes", where),
        max_requests=_optional_quantity(section, "maxRequests", where),
        request_ttl_s=None if ttl is None else parse_config_duration(ttl, f"{where}.defaultRequestTTL"),
        default_band=default_band,
        default_negative_band=negative_band,
        bands=tuple(bands.items()),
    )


def _optional_quantity(section: Mapping[str, Any], key: str, where: str) -> int:
    value = section.get(key)
    return 0 if value is None else parse_quantity(value, f"{where}.{key}")


def _parse_band(raw: Any, where: str, by_name: Mapping[str, PluginSpec]) -> PriorityBandSpec:
    """One band or template; a template's `priority` is read past (upstream's type has one, unused)."""
    entry = _mapping(raw, where)
    _refuse(entry, _BAND_REFUSED, where)
    _only(entry, _BAND_KEYS, where)
    fairness, ordering = entry.get("fairnessPolicyRef"), entry.get("orderingPolicyRef")
    return PriorityBandSpec(
        max_bytes=_optional_quantity(entry, "maxBytes", where),
        max_requests=_optional_quantity(entry, "maxRequests", where),
        fairness=DEFAULT_FAIRNESS_POLICY
        if fairness is None
        else _policy(fairness, PluginKind.FAIRNESS_POLICY, f"{where}.fairnessPolicyRef", by_name),
        ordering=DEFAULT_ORDERING_POLICY
        if ordering is None
        else _policy(ordering, PluginKind.ORDERING_POLICY, f"{where}.orderingPolicyRef", by_name),
    )


_POLICY_KINDS = {
    PluginKind.FAIRNESS_POLICY: "a fairness policy",
    PluginKind.ORDERING_POLICY: "an ordering policy",
}


def _policy(ref: Any, kind: PluginKind, where: str, by_name: Mapping[str, PluginSpec]) -> PolicyPlugin:
    """The policy instance `ref` names: a plugin of `plugins:`, else one of the two defaults."""
    name = _string(ref, where)
    spec = by_name.get(name)
    if spec is None:
        default = {p.name: p for p in (DEFAULT_FAIRNESS_POLICY, DEFAULT_ORDERING_POLICY)}.get(name)
        if default is None:
            raise ConfigError(
                f"{where}: no plugin named {name!r} in plugins[] (only {DEFAULT_FAIRNESS_POLICY.name} and"
                f" {DEFAULT_ORDERING_POLICY.name} resolve without being listed)"
            )
        if default.kind is not kind:
            raise ConfigError(f"{where}: plugin {name!r} is not {_POLICY_KINDS[kind]}")
        return default
    if spec.kind is not kind:
        raise ConfigError(f"{where}: plugin {name!r} ({spec.type}) is not {_POLICY_KINDS[kind]}")
    params = Params(spec.name, spec.parameters)
    policy = policy_plugin(spec.name, spec.type, params)
    params.done()
    return policy


def _band_yaml(band: PriorityBandSpec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if band.max_bytes:
        out["maxBytes"] = band.max_bytes
    if band.max_requests:
        out["maxRequests"] = band.max_requests
    if band.fairness.name != DEFAULT_FAIRNESS_POLICY.name:
        out["fairnessPolicyRef"] = band.fairness.name
    if band.ordering.name != DEFAULT_ORDERING_POLICY.name:
        out["orderingPolicyRef"] = band.ordering.name
    return out


def _flow_control_yaml(spec: FlowControlSpec) -> dict[str, Any]:
    """The `flowControl` section that loads back to `spec`; empty when every key is unset."""
    out: dict[str, Any] = {}
    if spec.max_bytes:
        out["maxBytes"] = spec.max_bytes
    if spec.max_requests:
        out["maxRequests"] = spec.max_requests
    if spec.request_ttl_s is not None:
        out["defaultRequestTTL"] = _format_duration(spec.request_ttl_s)
    if spec.default_band != PriorityBandSpec():
        out["defaultPriorityBand"] = _band_yaml(spec.default_band)
    if spec.default_negative_band is not None:
        out["defaultNegativePriorityBand"] = _band_yaml(spec.default_negative_band)
    if spec.bands:
        out["priorityBands"] = [{"priority": priority, **_band_yaml(band)} for priority, band in spec.bands]
    return out


def _parse_plugins(raw: list[Any]) -> tuple[PluginSpec, ...]:
    specs: list[PluginSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        where = f"plugins[{i}]"
        entry = _mapping(item, where)
        _only(entry, frozenset({"name", "type", "parameters"}), where)
        type_name = _string(entry.get("type"), f"{where}.type")
        if type_name in UNSUPPORTED_TYPES:
            why = UNSUPPORTED_TYPES[type_name]
            raise ConfigError(f"{where}: plugin type {type_name!r} is not supported: {why}")
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
    doc = yaml.safe_load(
        PickerConfig(plugins=tuple(plugins), profiles=(ProfileSpec("default", tuple(entries)),)).to_yaml()
    )
    # Flow control as the `default` policy runs it (epp.picker.scheduling.policies.DEFAULT_CONFIG).
    doc["featureGates"] = [FLOW_CONTROL_GATE]
    doc["plugins"] += [{"type": t} for t in DEFAULT_FLOW_CONTROL_PLUGINS]
    doc["saturationDetector"] = {"pluginRef": "lora-capacity-detector"}
    doc["flowControl"] = dict(DEFAULT_FLOW_CONTROL_SECTION)
    return load_config(yaml.safe_dump(doc, sort_keys=False))


# What the `default` policy adds for flow control (its DEFAULT_CONFIG spells the same): our
# per-endpoint slot gate, tenants served by virtual token counter, and a freed slot to the
# adapter whose waiting requests have waited longest all together.
DEFAULT_FLOW_CONTROL_PLUGINS = ("lora-capacity-detector", "total-wait-ordering-policy", "vtc-fairness-policy")
DEFAULT_FLOW_CONTROL_SECTION: Mapping[str, Any] = {
    "defaultPriorityBand": {
        "fairnessPolicyRef": "vtc-fairness-policy",
        "orderingPolicyRef": "total-wait-ordering-policy",
    }
}
