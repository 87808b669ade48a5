"""Flow control from an EndpointPickerConfig: upstream's `flowControl` section, gate and defaults."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epp.errors import ConfigError
from epp.picker.admission import build_admission
from epp.picker.flowcontrol.config_section import flow_control_detector, flow_control_settings
from epp.picker.flowcontrol.fairshare import DEFAULT_RESERVE_SHARE
from epp.picker.flowcontrol.overload import DEFAULT_WAIT_TARGET_S, OverloadSettings
from epp.picker.flowcontrol.settings import (
    DEFAULT_DRAIN_AFTER_S,
    BandSettings,
    Capacity,
    FlowControlSettings,
)
from epp.picker.scheduling.build import build_scheduler
from epp.picker.scheduling.picker_config import load_config, parse_quantity

GI = 1024**3

# The example from upstream's docs, as-is.
UPSTREAM_EXAMPLE = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: ["flowControl"]
plugins:
- type: queue-scorer
flowControl:
  maxBytes: 10Gi
  defaultRequestTTL: 60s
  defaultPriorityBand: {maxBytes: 10Gi}
  priorityBands:
  - {priority: 100, maxBytes: 5Gi, orderingPolicyRef: fcfs-ordering-policy,
     fairnessPolicyRef: global-strict-fairness-policy}
"""

# Every policy kind, our detector, and the newer upstream keys this EPP applies.
FULL = """\
featureGates: ["flowControl=true", "dataLayer"]
plugins:
- type: queue-scorer
- {name: tenants, type: vtc-fairness-policy, parameters: {weights: {gold: 3, bronze: 0.5}, defaultWeight: 2}}
- type: round-robin-fairness-policy
- type: edf-ordering-policy
- type: total-wait-ordering-policy
- {name: slots, type: lora-capacity-detector, parameters: {queueDepthThreshold: 8, drainAfter: 250ms}}
flowControl:
  maxBytes: 1G
  maxRequests: 2k
  defaultRequestTTL: 1m30s
  enableEviction: false
  noEndpointRequestTTL: 0s
  saturationDetector: {pluginRef: slots}
  defaultPriorityBand: {priority: 0, fairnessPolicyRef: round-robin-fairness-policy}
  defaultNegativePriorityBand: {fairnessPolicyRef: round-robin-fairness-policy, maxBytes: 1G}
  priorityBands:
  - {priority: 10, fairnessPolicyRef: tenants, orderingPolicyRef: total-wait-ordering-policy, maxRequests: 50}
  - {priority: -1, orderingPolicyRef: edf-ordering-policy, maxBytes: 10Mi}
"""


def _settings(text: str) -> FlowControlSettings:
    return flow_control_settings(load_config(text))


def _gated(section: str, plugins: str = "") -> str:
    return f"featureGates: [flowControl]\nplugins:\n- type: queue-scorer\n{plugins}flowControl:\n{section}"


def test_upstream_example_loads_to_its_settings() -> None:
    assert _settings(UPSTREAM_EXAMPLE) == FlowControlSettings(
        enabled=True,
        capacity=Capacity.SATURATION,  # no detector of ours: upstream's whole-pool gate
        request_ttl_s=60.0,
        max_bytes=10 * GI,
        default_band=BandSettings(max_bytes=10 * GI),
        bands={100: BandSettings(max_bytes=5 * GI)},
    )


def test_every_policy_and_our_detector() -> None:
    config = load_config(FULL)
    settings = flow_control_settings(config)
    assert settings == FlowControlSettings(
        enabled=True,
        capacity=Capacity.LORA_SLOTS,
        request_ttl_s=90.0,
        max_requests=2000,
        max_bytes=1_000_000_000,
        default_band=BandSettings(fairness="round-robin"),
        default_negative_band=BandSettings(fairness="round-robin"),
        bands={
            10: BandSettings(
                fairness="vtc",
                ordering="total-wait",
                max_requests=50,
                weights=(("gold", 3.0), ("bronze", 0.5)),
                default_weight=2.0,
            ),
            -1: BandSettings(ordering="edf", max_bytes=10 * 1024**2),
        },
        drain_after_s=0.25,
        overload=OverloadSettings(wait_target_s=DEFAULT_WAIT_TARGET_S),
    )
    assert config.ignored == ("featureGates",)  # dataLayer is not a gate this EPP has
    # Admission sheds by the same detector flow control gates by.
    assert build_admission(config).detector.queue_depth_threshold == 8
    assert flow_control_detector(config) == build_admission(config).detector


def test_gate_on_without_a_section_runs_upstream_defaults() -> None:
    settings = _settings("featureGates: [flowControl]\nplugins:\n- type: queue-scorer\n")
    assert settings == FlowControlSettings(enabled=True, capacity=Capacity.SATURATION)
    assert settings.request_ttl_s == 60.0
    assert settings.max_bytes == settings.max_requests == 0  # unlimited across bands
    band = settings.band(7)
    assert (band.fairness, band.ordering) == ("global-strict", "fcfs")
    assert (band.max_bytes, band.max_requests) == (1_000_000_000, 5000)
    assert settings.drain_after_s == DEFAULT_DRAIN_AFTER_S


@pytest.mark.parametrize(
    ("gates", "enabled"),
    [
        ("[flowControl]", True),
        ("['flowControl=true']", True),
        ("['flowControl=True']", True),
        ("['flowControl=false']", False),
        ("[dataLayer]", False),
        ("[]", False),
    ],
)
def test_feature_gate_forms(gates: str, enabled: bool) -> None:
    text = f"featureGates: {gates}\nplugins:\n- type: queue-scorer\nflowControl: {{maxRequests: 10}}\n"
    config = load_config(text)
    assert config.flow_control_enabled is enabled
    assert flow_control_settings(config).enabled is enabled
    assert ("flowControl" in config.ignored) is not enabled


def test_gate_off_section_is_checked_named_and_not_applied() -> None:
    text = UPSTREAM_EXAMPLE.replace('featureGates: ["flowControl"]\n', "")
    config = load_config(text)
    assert flow_control_settings(config) == FlowControlSettings()
    assert config.ignored == ("flowControl",)  # start-up warns about it
    with pytest.raises(ConfigError, match="unknown field"):
        load_config(text.replace("maxBytes: 10Gi\n", "maxByte: 10Gi\n"))


def test_gate_off_still_applies_the_detector_ref() -> None:
    text = (
        "plugins:\n- type: utilization-detector\n"
        "- {type: lora-capacity-detector, parameters: {queueDepthThreshold: 3}}\n"
        "flowControl: {saturationDetector: {pluginRef: lora-capacity-detector}}\n"
    )
    config = load_config(text)
    assert config.ignored == ()  # only the detector ref, and that is applied
    assert build_admission(config).detector.queue_depth_threshold == 3


def test_no_config_means_off() -> None:
    assert flow_control_settings(None) == FlowControlSettings()
    assert not flow_control_settings(None).enabled


@pytest.mark.parametrize(
    ("ttl", "seconds"),
    [("60s", 60.0), ("1m0s", 60.0), ("500ms", 0.5), ("0s", 0.0), (30, 30.0), ("2.5", 2.5)],
)
def test_request_ttl(ttl: object, seconds: float) -> None:
    assert _settings(_gated(f"  defaultRequestTTL: {ttl}\n")).request_ttl_s == seconds


def test_negative_band_template_equal_to_the_default_is_applied() -> None:
    settings = _settings(
        _gated("  defaultPriorityBand: {maxRequests: 9}\n  defaultNegativePriorityBand: {maxRequests: 9}\n")
    )
    assert settings.band(-3) == settings.band(3) == BandSettings(max_requests=9)


@pytest.mark.parametrize(
    ("detector", "target_s"),
    [
        ("- type: lora-capacity-detector\n", DEFAULT_WAIT_TARGET_S),
        ("- {type: lora-capacity-detector, parameters: {queueWaitTarget: 2s}}\n", 2.0),
        ("- {type: lora-capacity-detector, parameters: {queueWaitTarget: 0s}}\n", 0.0),
        ("- type: utilization-detector\n", 0.0),  # upstream's gate: requests wait their TTL, as upstream
    ],
    ids=["ours-default", "ours-set", "ours-off", "upstream"],
)
def test_the_queue_wait_target_is_ours_and_on_by_default(detector: str, target_s: float) -> None:
    settings = _settings(_gated("  maxRequests: 5\n", detector))
    assert settings.overload.wait_target_s == target_s
    assert settings.overload.enabled is (target_s > 0)


@pytest.mark.parametrize(
    ("detector", "share"),
    [
        ("- type: lora-capacity-detector\n", DEFAULT_RESERVE_SHARE),
        ("- {type: lora-capacity-detector, parameters: {fairShareReserve: 0.1}}\n", 0.1),
        ("- {type: lora-capacity-detector, parameters: {fairShareReserve: 0}}\n", 0.0),
    ],
    ids=["default", "set", "off"],
)
def test_the_fair_share_reserve_is_ours_and_on_by_default(detector: str, share: float) -> None:
    settings = _settings(_gated("  maxRequests: 5\n", detector))
    assert settings.fair_share.reserve_share == share
    assert settings.fair_share.enabled is (share > 0)


def test_detector_ref_defaults_to_the_only_detector() -> None:
    text = _gated("  maxRequests: 5\n", "- {type: lora-capacity-detector, parameters: {drainAfter: 3s}}\n")
    settings = _settings(text)
    assert (settings.capacity, settings.drain_after_s) == (Capacity.LORA_SLOTS, 3.0)
    assert (
        _settings(_gated("  maxRequests: 5\n", "- type: utilization-detector\n")).capacity
        is Capacity.SATURATION
    )


def test_policy_plugins_build_but_stay_out_of_profiles() -> None:
    build_scheduler(FULL)  # every policy and detector instance builds alongside the profile
    text = (
        "plugins:\n- type: vtc-fairness-policy\n"
        "schedulingProfiles:\n- {name: p, plugins: [{pluginRef: vtc-fairness-policy}]}\n"
    )
    with pytest.raises(ConfigError, match="cannot be part of a profile"):
        load_config(text)
    profile = load_config("plugins:\n- type: queue-scorer\n- type: edf-ordering-policy\n").profiles[0]
    assert [e.plugin_ref for e in profile.plugins] == ["queue-scorer", "max-score-picker"]


def test_round_trips_through_yaml() -> None:
    for text in (UPSTREAM_EXAMPLE, FULL):
        config = load_config(text)
        again = load_config(config.to_yaml())
        assert again == config
        assert flow_control_settings(again) == flow_control_settings(config)


def _band_error(band: str, plugin: str = "") -> str:
    return _gated(f"  priorityBands:\n  - {band}\n", f"- {plugin}\n" if plugin else "")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (_gated("  maxBytez: 1\n"), "flowControl: unknown field(s) maxBytez (allowed: "),
        (
            _band_error("{priority: 1, fairness: x}"),
            "flowControl.priorityBands[0]: unknown field(s) fairness",
        ),
        (
            _gated("  defaultPriorityBand: {ttl: 1s}\n"),
            "flowControl.defaultPriorityBand: unknown field(s) ttl",
        ),
        (_band_error("{maxBytes: 1}"), "flowControl.priorityBands[0].priority: required"),
        (_band_error("{priority: high}"), "flowControl.priorityBands[0].priority: required"),
        (
            _gated("  priorityBands:\n  - {priority: 5}\n  - {priority: 5}\n"),
            "flowControl.priorityBands[1]: duplicate priority level 5",
        ),
        (_gated("  maxBytes: -1\n"), "flowControl.maxBytes: must not be negative"),
        (_gated("  maxRequests: -2k\n"), "flowControl.maxRequests: must not be negative"),
        (_gated("  maxBytes: 10GB\n"), "flowControl.maxBytes: expected a quantity"),
        (
            _band_error("{priority: 1, maxBytes: lots}"),
            "flowControl.priorityBands[0].maxBytes: expected a quantity",
        ),
        (_gated("  defaultRequestTTL: -5s\n"), "flowControl.defaultRequestTTL: must not be negative"),
        (_gated("  defaultRequestTTL: soon\n"), "flowControl.defaultRequestTTL: invalid duration"),
        (_gated("  defaultRequestTTL: true\n"), "flowControl.defaultRequestTTL: expected a duration"),
        (_band_error("{priority: 1, fairnessPolicyRef: nope}"), "no plugin named 'nope' in plugins[]"),
        (
            _band_error("{priority: 1, fairnessPolicyRef: vtc-fairness-policy}"),
            "only global-strict-fairness-policy and fcfs-ordering-policy resolve without being listed",
        ),
        (
            _band_error("{priority: 1, fairnessPolicyRef: queue-scorer}"),
            "fairnessPolicyRef: plugin 'queue-scorer' (queue-scorer) is not a fairness policy",
        ),
        (
            _band_error("{priority: 1, orderingPolicyRef: global-strict-fairness-policy}"),
            "plugin 'global-strict-fairness-policy' is not an ordering policy",
        ),
        (
            _band_error("{priority: 1, fairnessPolicyRef: edf-ordering-policy}", "type: edf-ordering-policy"),
            "plugin 'edf-ordering-policy' (edf-ordering-policy) is not a fairness policy",
        ),
        (_gated("  maxRequests: 1\n", "- type: slo-deadline-ordering-policy\n"), "is not supported"),
        (
            _gated("  maxRequests: 1\n", "- type: fifo-ordering-policy\n"),
            "unknown plugin type 'fifo-ordering-policy'",
        ),
        (
            _gated("  usageLimitPolicyPluginRef: static\n"),
            "flowControl.usageLimitPolicyPluginRef: not supported",
        ),
        (
            _gated("  bandSelectionPolicyPluginRef: b\n"),
            "flowControl.bandSelectionPolicyPluginRef: not supported",
        ),
        (_gated("  enableEviction: true\n"), "flowControl.enableEviction: not supported"),
        (_gated("  enableEviction: 'yes'\n"), "flowControl.enableEviction: expected true or false"),
        (_gated("  noEndpointRequestTTL: 30s\n"), "flowControl.noEndpointRequestTTL: not supported"),
        (
            _band_error("{priority: 1, defaultRequestTTL: 5s}"),
            "flowControl.priorityBands[0].defaultRequestTTL: not supported",
        ),
        (
            _band_error(
                "{priority: 1, fairnessPolicyRef: v}",
                "{name: v, type: vtc-fairness-policy, parameters: {weights: {a: 0}}}",
            ),
            "the weight of 'a' must be a positive number",
        ),
        (
            _band_error(
                "{priority: 1, fairnessPolicyRef: v}",
                "{name: v, type: vtc-fairness-policy, parameters: {weights: [a]}}",
            ),
            "parameter 'weights' must map fairness IDs to positive numbers",
        ),
        (
            _band_error(
                "{priority: 1, fairnessPolicyRef: v}",
                "{name: v, type: vtc-fairness-policy, parameters: {defaultWeight: 0}}",
            ),
            "parameter 'defaultWeight' must be a positive number",
        ),
        (
            _band_error(
                "{priority: 1, orderingPolicyRef: e}",
                "{name: e, type: edf-ordering-policy, parameters: {x: 1}}",
            ),
            "plugin 'e': unknown parameter(s) x",
        ),
        (
            _gated(
                "  saturationDetector: {pluginRef: b}\n",
                "- {name: a, type: utilization-detector}\n- {name: b, type: utilization-detector}\n",
            )
            + "saturationDetector: {pluginRef: a}\n",
            "name different detectors",
        ),
        (
            _gated("  saturationDetector: {pluginRef: nope}\n"),
            "flowControl.saturationDetector.pluginRef: no plugin named 'nope'",
        ),
        (
            _gated("  maxRequests: 1\n").replace("[flowControl]", "[flowcontrol]"),
            "did you mean 'flowControl'?",
        ),
        (
            _gated("  maxRequests: 1\n").replace("[flowControl]", "['flowControl=yes']"),
            "flowControl=true or flowControl=false",
        ),
        (
            _gated("  maxRequests: 1\n").replace("[flowControl]", "[flowControl, 'flowControl=false']"),
            "both on and off",
        ),
        (_gated("- 1\n"), "flowControl: expected a mapping"),
    ],
)
def test_bad_section_fails_naming_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _settings(text)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ("{drainAfter: -1s}", "parameter 'drainAfter': must not be negative"),
        ("{drainAfter: later}", "parameter 'drainAfter': invalid duration"),
        ("{queueWaitTarget: soon}", "parameter 'queueWaitTarget': invalid duration"),
        ("{queueWaitTarget: -1s}", "parameter 'queueWaitTarget': must not be negative"),
        ("{queueDepthThreshold: -1}", "must be ≥ 0"),
        ("{fairShareReserve: 0.9}", "parameter 'fairShareReserve' must be ≤ 0.5"),
        ("{fairShareReserve: some}", "parameter 'fairShareReserve' must be a number"),
    ],
)
def test_bad_lora_capacity_detector(parameters: str, message: str) -> None:
    text = _gated("  maxRequests: 1\n", f"- type: lora-capacity-detector\n  parameters: {parameters}\n")
    with pytest.raises(ConfigError) as err:
        _settings(text)
    assert message in str(err.value)


def test_drain_after_is_ours_alone() -> None:
    with pytest.raises(ConfigError, match=r"unknown parameter\(s\) drainAfter"):
        text = "plugins:\n- type: utilization-detector\n  parameters: {drainAfter: 1s}\n"
        build_admission(load_config(text))


def test_negative_band_template_serves_only_priorities_below_zero() -> None:
    settings = _settings(_gated("  defaultNegativePriorityBand: {maxRequests: 9}\n"))
    assert settings.band(-1) == BandSettings(max_requests=9)
    assert settings.band(0) == settings.band(5) == BandSettings()


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("0", 0),
        ("1000", 1000),
        ("10Ki", 10 * 1024),
        ("512Mi", 512 * 1024**2),
        ("1.5Gi", 3 * 1024**3 // 2),
        ("500M", 500_000_000),
        ("2k", 2000),
        ("1e3", 1000),
        ("1E", 10**18),
        ("1Ei", 1024**6),
        ("+7", 7),
        (".5k", 500),
        ("1500m", 2),  # milli rounds up, as upstream's Value()
        (12, 12),
        (2.5, 3),
    ],
)
def test_quantities(text: object, count: int) -> None:
    assert parse_quantity(text, "q") == count


@given(
    st.integers(0, 10**6),
    st.sampled_from(
        [
            ("", 1),
            ("k", 10**3),
            ("M", 10**6),
            ("G", 10**9),
            ("T", 10**12),
            ("Ki", 2**10),
            ("Mi", 2**20),
            ("Gi", 2**30),
        ]
    ),
)
def test_quantity_suffixes_multiply(number: int, suffix: tuple[str, int]) -> None:
    name, factor = suffix
    assert parse_quantity(f"{number}{name}", "q") == number * factor
    assert parse_quantity(f"{number}e3", "q") == number * 1000


@given(st.floats(min_value=0, max_value=1e7, allow_nan=False), st.integers(0, 2**40))
def test_section_round_trips_for_any_ttl_and_limit(ttl: float, limit: int) -> None:
    config = load_config(_gated(f"  defaultRequestTTL: {ttl!r}\n  maxBytes: {limit}\n"))
    assert config.flow_control.request_ttl_s == ttl
    assert load_config(config.to_yaml()) == config


_POLICY_PLUGINS = (
    "- {name: tenants, type: vtc-fairness-policy, parameters: {weights: {a: 2}}}\n"
    "- type: round-robin-fairness-policy\n- type: edf-ordering-policy\n- type: total-wait-ordering-policy\n"
)
_quantities = st.one_of(st.integers(0, 2**40), st.sampled_from(["10Gi", "512Mi", "2k", "1e3", "1.5G"]))
_bands = st.fixed_dictionaries(
    {},
    optional={
        "maxBytes": _quantities,
        "maxRequests": _quantities,
        "fairnessPolicyRef": st.sampled_from(
            ["global-strict-fairness-policy", "round-robin-fairness-policy", "tenants"]
        ),
        "orderingPolicyRef": st.sampled_from(
            ["fcfs-ordering-policy", "edf-ordering-policy", "total-wait-ordering-policy"]
        ),
    },
)
_sections = st.fixed_dictionaries(
    {},
    optional={
        "maxBytes": _quantities,
        "maxRequests": _quantities,
        "defaultRequestTTL": st.sampled_from(["0s", "60s", "1m30s", "250ms", 7, 0.125]),
        "defaultPriorityBand": _bands,
        "priorityBands": st.dictionaries(st.integers(-5, 5), _bands, max_size=4).map(
            lambda bands: [{"priority": priority, **band} for priority, band in bands.items()]
        ),
    },
)


@given(_sections, st.booleans())
def test_any_section_round_trips_to_the_same_settings(section: dict[str, object], gate: bool) -> None:
    text = (
        f"featureGates: [{'flowControl' if gate else 'dataLayer'}]\nplugins:\n- type: queue-scorer\n"
        f"{_POLICY_PLUGINS}flowControl: {json.dumps(section)}\n"
    )
    config = load_config(text)
    again = load_config(config.to_yaml())
    assert again == config
    assert flow_control_settings(again) == flow_control_settings(config)
    assert flow_control_settings(config).enabled is gate


def test_the_default_policy_and_an_llminferenceservice_config_run_the_same_flow_control() -> None:
    """`epp serve`'s default and the controller's scoringWeights config both queue in the EPP, gated
    on LoRA slots, with the same policies."""
    from epp.picker.scheduling.picker_config import weights_from_scoring_weights
    from epp.picker.scheduling.policies import policy_config_text

    default_text = policy_config_text("default")
    assert default_text is not None
    default = flow_control_settings(load_config(default_text))
    weights = flow_control_settings(weights_from_scoring_weights({"adapterAffinity": 1, "load": 1}))
    assert default == weights
    assert default.enabled and default.capacity is Capacity.LORA_SLOTS
    assert (default.default_band.fairness, default.default_band.ordering) == ("vtc", "total-wait")
