"""EndpointPickerConfig loading: the GIE sample loads as-is, defaults apply, bad configs say why."""

from __future__ import annotations

import pytest

from epp.errors import ConfigError
from epp.picker.scheduling.build import POLICY_NAMES, build_scheduler, build_scheduler_from_config
from epp.picker.scheduling.framework import ProfileScheduler
from epp.picker.scheduling.picker_config import load_config, weights_from_scoring_weights
from epp.picker.scheduling.plugins import PluginKind

# A LoRA-first EndpointPickerConfig as a user writes one.
GIE_SAMPLE = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: lora-affinity-scorer
- type: prefix-cache-scorer
  parameters: {hashBlockSize: 64, maxPrefixBlocksToMatch: 256, lruCapacityPerServer: 31250}
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: max-score-picker
  parameters: {maxNumOfEndpoints: 3}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: lora-affinity-scorer, weight: 0.50}
  - {pluginRef: prefix-cache-scorer, weight: 0.20}
  - {pluginRef: queue-scorer, weight: 0.15}
  - {pluginRef: kv-cache-utilization-scorer, weight: 0.15}
  - {pluginRef: max-score-picker}
"""

# Upstream Helm default-plugins style: no profiles, integer weights implied.
NO_PROFILES = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
"""


def test_gie_sample_loads_and_builds() -> None:
    config = load_config(GIE_SAMPLE)
    (profile,) = config.profiles
    assert [(e.plugin_ref, e.weight) for e in profile.plugins] == [
        ("lora-affinity-scorer", 0.5),
        ("prefix-cache-scorer", 0.2),
        ("queue-scorer", 0.15),
        ("kv-cache-utilization-scorer", 0.15),
        ("max-score-picker", 1.0),
    ]
    assert any(p.kind is PluginKind.PROFILE_HANDLER for p in config.plugins)
    scheduler = build_scheduler(GIE_SAMPLE, seed=1)
    assert isinstance(scheduler, ProfileScheduler)
    assert len(scheduler.profile.scorers) == 4


def test_defaulting_rules() -> None:
    config = load_config(NO_PROFILES)
    (profile,) = config.profiles
    assert profile.name == "default"
    assert [e.plugin_ref for e in profile.plugins] == [
        "queue-scorer",
        "kv-cache-utilization-scorer",
        "prefix-cache-scorer",
        "max-score-picker",
    ]
    assert {p.type for p in config.plugins} >= {"single-profile-handler", "max-score-picker"}


def test_round_trip_yaml() -> None:
    config = load_config(GIE_SAMPLE)
    assert load_config(config.to_yaml()) == config


def test_scoring_weights_mapping() -> None:
    config = weights_from_scoring_weights(
        {"adapterAffinity": 5, "kvCacheMatch": 2, "load": 1.5, "gpuHeadroom": 1.5}
    )
    weights = {e.plugin_ref: e.weight for e in config.profiles[0].plugins}
    assert weights == {
        "adapter-affinity-scorer": 5.0,
        "kv-cache-match-scorer": 2.0,
        "load-scorer": 1.5,
        "gpu-headroom-scorer": 1.5,
        "max-score-picker": 1.0,
    }
    assert isinstance(build_scheduler_from_config(config), ProfileScheduler)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "kind: EndpointPickerConfig\nplugins:\n- type: no-such-scorer\n",
            "unknown plugin type 'no-such-scorer'",
        ),
        ("plugins:\n- type: queue-scorer\n- type: queue-scorer\n", "duplicate plugin name 'queue-scorer'"),
        (
            "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n"
            "  - pluginRef: nope\n",
            "pluginRef 'nope' names no plugin",
        ),
        ("plugins: []\nunknownField: 1\n", "unknown field(s) unknownField"),
        ("kind: Other\n", "kind must be 'EndpointPickerConfig'"),
        ("apiVersion: v9\n", "unsupported apiVersion 'v9'"),
        (
            "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n"
            "  - {pluginRef: queue-scorer, weight: heavy}\n",
            "weight: expected a number",
        ),
        (
            "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n"
            "  - {pluginRef: queue-scorer, weight: -1}\n",
            "must be a finite number ≥ 0",
        ),
        (
            "plugins:\n- type: max-score-picker\n  parameters: {maxNumOfEndpoints: 0}\n",
            "'maxNumOfEndpoints' must be ≥ 1",
        ),
        ("plugins:\n- type: load-scorer\n  parameters: {bogus: 1}\n", "unknown parameter(s) bogus"),
        (
            "plugins:\n- type: single-profile-handler\n- {type: single-profile-handler, name: h2}\n",
            "exactly one profile handler",
        ),
        (
            "plugins:\n- type: queue-scorer\nschedulingProfiles:\n"
            "- {name: a, plugins: [{pluginRef: queue-scorer}]}\n"
            "- {name: b, plugins: [{pluginRef: queue-scorer}]}\n",
            "need a profile handler",
        ),
        ("plugins: [\n", "not valid YAML"),
        ("", "is empty"),
        ("- just a list\n", "expected a mapping"),
    ],
    ids=[
        "unknown-type",
        "duplicate-name",
        "unknown-ref",
        "unknown-field",
        "wrong-kind",
        "wrong-api-version",
        "weight-not-number",
        "negative-weight",
        "bad-parameter-value",
        "unknown-parameter",
        "two-handlers",
        "two-profiles-no-handler",
        "bad-yaml",
        "empty",
        "not-a-mapping",
    ],
)
def test_bad_config_fails_clearly(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_scheduler(text)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "mapping",
    [{"adapterAffinity": 0}, {"affinity": 1}, {"load": -1}, {"load": "x"}],
    ids=["all-zero", "unknown-key", "negative", "not-number"],
)
def test_bad_scoring_weights(mapping: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="scoringWeights"):
        weights_from_scoring_weights(mapping)


def test_policies_by_name() -> None:
    for name in POLICY_NAMES:
        assert build_scheduler(policy=name, seed=0).name == name
    with pytest.raises(ConfigError, match="unknown scheduling policy 'nope'"):
        build_scheduler(policy="nope")


def test_upstream_sections_this_epp_does_not_apply_are_named() -> None:
    text = (
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
        "featureGates: [dataLayer]\nflowControl: {maxBytes: 1000}\nparser: {}\n"
        "plugins:\n- type: queue-scorer\n"
    )
    assert load_config(text).ignored == ("featureGates", "flowControl")  # an empty section is nothing
    assert load_config("plugins:\n- type: queue-scorer\n").ignored == ()
    # The flowControl gate is applied, and with it on, so is the section.
    gated = text.replace("[dataLayer]", "[flowControl]")
    assert load_config(gated).ignored == ()
