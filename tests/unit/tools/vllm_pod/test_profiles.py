"""The calibrated profiles' adapter-load cost: by tier, and by the adapters' LoRA rank."""

from __future__ import annotations

import dataclasses

import pytest

from epp.tools.bench import scenario
from epp.tools.vllm_pod.lora import AdapterTier
from epp.tools.vllm_pod.profiles import PROFILES


@pytest.mark.parametrize("name", sorted(PROFILES))
@pytest.mark.parametrize("source", [AdapterTier.CPU, AdapterTier.DISK])
def test_a_rank_64_adapter_costs_more_to_load_than_rank_16(name: str, source: AdapterTier) -> None:
    profile = PROFILES[name]
    assert profile.at_rank(64).load_s(source) > profile.at_rank(16).load_s(source)


@pytest.mark.parametrize("name", sorted(PROFILES))
@pytest.mark.parametrize("rank", [8, 16, 64])
def test_a_host_copy_loads_much_faster_than_a_storage_read(name: str, rank: int) -> None:
    profile = PROFILES[name].at_rank(rank)
    assert profile.load_s(AdapterTier.GPU) == 0.0
    assert profile.load_s(AdapterTier.DISK) > 5 * profile.load_s(AdapterTier.CPU)


def test_adapter_size_scales_linearly_with_rank() -> None:
    profile = PROFILES["llama-3.1-70b-h100-tp2"]  # stated at rank 16
    assert profile.at_rank(16) == profile
    assert profile.at_rank(64).adapter_bytes == 4 * profile.adapter_bytes
    assert profile.at_rank(64).at_rank(16) == profile


def test_a_fixed_load_time_ignores_rank() -> None:
    fixed = dataclasses.replace(PROFILES["llama-3.1-8b-h100"], adapter_load_s=0.05)
    assert fixed.at_rank(64).load_s(AdapterTier.DISK) == fixed.load_s(AdapterTier.DISK) == 0.05


def test_rank_must_be_positive() -> None:
    with pytest.raises(ValueError, match="rank"):
        PROFILES["llama-3.1-8b-h100"].at_rank(0)


def test_a_scenario_names_its_adapters_rank() -> None:
    default = scenario.parse({"model": "llama-3.1-70b-h100-tp2"}).profile
    ranked = scenario.parse({"model": "llama-3.1-70b-h100-tp2", "adapters": {"rank": 64}}).profile
    assert default == PROFILES["llama-3.1-70b-h100-tp2"]
    assert ranked.adapter_bytes == 4 * default.adapter_bytes
    assert ranked.load_s(AdapterTier.DISK) > default.load_s(AdapterTier.DISK)
