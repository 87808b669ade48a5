"""Scenario files: the packaged ones load; bad files fail with a clear message."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from epp.errors import ConfigError
from epp.tools.bench import scenario, workload

PACKAGED = [
    "azure-conv",
    "brief",
    "cheap-swaps",
    "cheap-swaps-moderate",
    "dedicated",
    "diurnal",
    "gie-multi-lora",
    "mixed-tiers",
    "popularity-shift",
    "priority-mix",
    "seed-conditions",
    "tenant-flood",
    "zipf-100",
    "zipf-1000",
    "zipf-500",
]


def test_every_packaged_scenario_is_listed() -> None:
    assert scenario.packaged_names() == PACKAGED


@pytest.mark.parametrize("name", PACKAGED, ids=PACKAGED)
def test_packaged_scenarios_load(name: str) -> None:
    sc = scenario.load(name)
    assert sc.name == name
    assert sc.workload.popularity.sum() == pytest.approx(1.0)
    assert len(sc.workload.popularity) == len(sc.workload.adapters)


def test_brief_matches_the_product_brief() -> None:
    sc = scenario.load("brief")
    assert (len(sc.workload.adapters), sc.pod_config.max_loras, sc.replicas) == (5, 4, 6)
    assert sc.profile.name.startswith("llama-3.1-70b")


def test_gie_multi_lora_tiers() -> None:
    sc = scenario.load("gie-multi-lora")
    assert len(sc.workload.adapters) == 15 and sc.pod_config.max_loras == 3 and sc.replicas == 10
    assert sc.workload.popularity[:5].sum() == pytest.approx(0.6)


def test_a_copied_file_loads_by_path(tmp_path: Path) -> None:
    source = resources.files("epp.tools.bench") / "scenarios" / "brief.yaml"
    copy = tmp_path / "mine.yaml"
    copy.write_text(
        source.read_text(encoding="utf-8")
        .replace("rate_rps: 14", "rate_rps: 3")
        .replace("name: brief", "name: mine")
    )
    sc = scenario.load(str(copy))
    assert (sc.name, sc.workload.rate_rps) == ("mine", 3.0)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("name: x\nreplicas: 3\n", "unknown keys: replicas"),
        ("pods: {replicas: 0}\n", "replicas must be at least 1"),
        ("model: gpt-9\n", "unknown model profile"),
        ("adapters: {popularity: pareto}\n", "popularity must be"),
        ("lengths: {prompt_tokens: [10, 5]}\n", "prompt_tokens"),
        ("arrivals: {trace: /no/such.csv}\n", "neither a packaged trace nor a file"),
        ("- a\n- b\n", "mapping at the top level"),
        ("pods: [\n", "invalid YAML"),
    ],
    ids=[
        "unknown-key",
        "zero-replicas",
        "unknown-model",
        "bad-popularity",
        "bad-range",
        "bad-trace",
        "list",
        "yaml",
    ],
)
def test_bad_scenarios_raise_config_error(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=error):
        scenario.load(str(path))


def test_unknown_name_lists_the_packaged_ones() -> None:
    with pytest.raises(ConfigError, match="packaged: azure-conv, brief"):
        scenario.load("nope")


def test_overrides() -> None:
    sc = scenario.load("brief").with_overrides(
        adapters=50, zipf_alpha=1.0, replicas=3, max_loras=2, duration_s=30.0, seed=9
    )
    assert len(sc.workload.adapters) == 50
    assert sc.workload.popularity[0] / sc.workload.popularity[1] == pytest.approx(2.0)
    assert (sc.replicas, sc.pod_config.max_loras, sc.workload.duration_s, sc.seed) == (3, 2, 30.0, 9)
    assert sc.warmup_s <= 3.0


def test_more_uniform_adapters_stay_uniform() -> None:
    sc = scenario.load("brief").with_overrides(adapters=8)
    assert sc.workload.popularity == pytest.approx([0.125] * 8)


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"replicas": 0}, "--replicas"),
        ({"max_loras": 0}, "--max-loras"),
        ({"duration_s": -1.0}, "--duration"),
    ],
    ids=["replicas", "max-loras", "duration"],
)
def test_bad_overrides(overrides: dict[str, float], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        scenario.load("brief").with_overrides(**overrides)  # type: ignore[arg-type]


def test_shift_and_diurnal_are_read_and_checked() -> None:
    base = {"adapters": {"count": 10}}
    parsed = scenario.parse(
        {
            "adapters": {"count": 10, "shift": {"at_s": 30, "rotate": 5}},
            "arrivals": {"diurnal": {"period_s": 60, "amplitude": 0.5}},
        }
    )
    assert parsed.workload.shift == workload.PopularityShift(at_s=30.0, rotate=5)
    assert parsed.workload.diurnal == workload.DiurnalSwing(period_s=60.0, amplitude=0.5)
    assert scenario.parse(base).workload.shift is None
    with pytest.raises(ValueError, match=r"rotate < adapters\.count"):
        scenario.parse({"adapters": {"count": 10, "shift": {"at_s": 30, "rotate": 10}}})
    with pytest.raises(ValueError, match="amplitude < 1"):
        scenario.parse({"arrivals": {"diurnal": {"period_s": 60, "amplitude": 1.5}}})


def test_epp_replicas_and_peers_are_read_and_checked() -> None:
    parsed = scenario.parse({"epp_replicas": 4, "epp_peers": False})
    assert (parsed.epp_replicas, parsed.epp_peers) == (4, False)
    assert scenario.parse({}).epp_peers is True
    with pytest.raises(ValueError, match="epp_peers must be true or false"):
        scenario.parse({"epp_peers": "yes"})
    with pytest.raises(ValueError, match="epp_replicas must be at least 1"):
        scenario.parse({"epp_replicas": 0})
