"""Scenario files: a YAML document that fixes the fleet, the workload and the SLO of one benchmark.

Packaged scenarios live in `epp/tools/bench/scenarios/<name>.yaml`; `--scenario` takes a name or a
path, so users copy one, edit it and pass the copy. Unknown keys are an error (a typo would
otherwise silently benchmark the wrong thing).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from epp.errors import ConfigError
from epp.tools.bench import workload
from epp.tools.bench.model import PROFILES, PodConfig, PodProfile
from epp.tools.bench.sim_cost import parse_sim_cost

_TOP_KEYS = {
    "name",
    "description",
    "model",
    "duration_s",
    "warmup_s",
    "seed",
    "scrape_interval_s",
    "deployment",
    "pods",
    "adapters",
    "arrivals",
    "lengths",
    "slo",
    "splits",
    "epp_replicas",
    "epp_peers",
    "epp_latency_s",
    "tenants",
    "flood",
    "priorities",
    "sim_cost",
}

# client model name → ((target model, weight), ...): an InferenceModel's weighted targets
Splits = tuple[tuple[str, tuple[tuple[str, int], ...]], ...]


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float = 2.0  # a request meets the SLO when its TTFT is at most this
    target_goodput: float = 0.95  # a replica count meets the SLO when this share of requests does
    max_replicas: int = 32  # upper end of the replica search


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    profile: PodProfile
    pod_config: PodConfig
    replicas: int
    workload: workload.WorkloadSpec
    slo: Slo
    seed: int = 1
    warmup_s: float = 60.0  # requests arriving earlier are not measured
    scrape_interval_s: float = 0.1  # how often the EPP scrapes each pod's /metrics
    deployment: str = "shared"  # "shared": one pool; "dedicated": one deployment per adapter
    splits: Splits = ()  # InferenceModels with weighted targets (canaries, A/B), resolved by the Director
    epp_replicas: int = 1  # active-active EPPs behind the gateway, each with its own state
    epp_peers: bool = True  # with several: they exchange what they route (`epp serve --peers`)
    # What the EPP's path adds before a request reaches its pod (the gateway's ext_proc round trip
    # and the decision), charged to the policies an EPP runs; round robin and random are the
    # gateway's own load balancing and pay nothing.
    epp_latency_s: float = 0.0

    def with_overrides(
        self,
        *,
        adapters: int | None = None,
        zipf_alpha: float | None = None,
        replicas: int | None = None,
        max_loras: int | None = None,
        duration_s: float | None = None,
        trace: str | None = None,
        seed: int | None = None,
        scrape_interval_s: float | None = None,
        epp_replicas: int | None = None,
        epp_peers: bool | None = None,
        epp_latency_s: float | None = None,
    ) -> Scenario:
        """A copy with command-line overrides applied."""
        spec = self.workload
        if adapters is not None or zipf_alpha is not None:
            count = adapters if adapters is not None else len(spec.adapters)
            if count < 1:
                raise ConfigError("--adapters must be at least 1")
            alpha = zipf_alpha if zipf_alpha is not None else 1.0
            if zipf_alpha is None and adapters is not None and count == len(spec.adapters):
                weights = spec.popularity
            elif zipf_alpha is None and self._is_uniform():
                weights = np.full(count, 1.0 / count)
            else:
                weights = workload.zipf_weights(count, alpha)
            spec = dataclasses.replace(spec, adapters=workload.adapter_names(count), popularity=weights)
        if duration_s is not None:
            if duration_s <= 0:
                raise ConfigError("--duration must be positive")
            spec = dataclasses.replace(spec, duration_s=duration_s)
        if trace is not None:
            try:
                rows = tuple(workload.read_trace(workload.resolve_trace(trace)))
            except (ValueError, OSError) as exc:
                raise ConfigError(str(exc)) from exc
            spec = dataclasses.replace(spec, trace=rows)
        if spec.flood is not None:
            try:
                check_flood(spec.flood, spec)
            except ValueError as exc:
                raise ConfigError(f"with these overrides, {exc}") from exc
        config = self.pod_config
        if config.lora_modules and spec.adapters != self.workload.adapters:
            config = dataclasses.replace(config, lora_modules=spec.adapters)  # `lora_modules: all` follows
        if max_loras is not None:
            if max_loras < 1:
                raise ConfigError("--max-loras must be at least 1")
            config = dataclasses.replace(
                config, max_loras=max_loras, max_cpu_loras=max(max_loras, config.max_cpu_loras)
            )
        if replicas is not None and replicas < 1:
            raise ConfigError("--replicas must be at least 1")
        if epp_replicas is not None and epp_replicas < 1:
            raise ConfigError("--epp-replicas must be at least 1")
        if epp_latency_s is not None and epp_latency_s < 0:
            raise ConfigError("--epp-latency must not be negative")
        warmup = self.warmup_s if duration_s is None else min(self.warmup_s, spec.duration_s / 10)
        return dataclasses.replace(
            self,
            workload=spec,
            pod_config=config,
            replicas=replicas if replicas is not None else self.replicas,
            seed=seed if seed is not None else self.seed,
            warmup_s=warmup,
            scrape_interval_s=scrape_interval_s if scrape_interval_s is not None else self.scrape_interval_s,
            epp_replicas=epp_replicas if epp_replicas is not None else self.epp_replicas,
            epp_peers=epp_peers if epp_peers is not None else self.epp_peers,
            epp_latency_s=epp_latency_s if epp_latency_s is not None else self.epp_latency_s,
        )

    def _is_uniform(self) -> bool:
        p = self.workload.popularity
        return bool(p.size and np.allclose(p, p[0]))


def packaged_names() -> list[str]:
    folder = resources.files("epp.tools.bench") / "scenarios"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load(name_or_path: str) -> Scenario:
    """A packaged scenario by name, or a scenario file by path; ConfigError on anything wrong."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"scenario file {name_or_path} not found")
        text = path.read_text(encoding="utf-8")
    else:
        ref = resources.files("epp.tools.bench") / "scenarios" / f"{name_or_path}.yaml"
        if not ref.is_file():
            known = ", ".join(packaged_names())
            raise ConfigError(f"unknown scenario {name_or_path!r} (packaged: {known})")
        text = ref.read_text(encoding="utf-8")
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"scenario {name_or_path}: invalid YAML: {exc}") from exc
    if not isinstance(document, Mapping):
        raise ConfigError(f"scenario {name_or_path}: expected a mapping at the top level")
    try:
        return parse(document)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"scenario {name_or_path}: {exc}") from exc


def _section(document: Mapping[str, Any], key: str, allowed: set[str]) -> Mapping[str, Any]:
    value = document.get(key) or {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{key} must be a mapping")
    unknown = set(value) - allowed
    if unknown:
        raise ValueError(f"unknown keys in {key}: {', '.join(sorted(unknown))}")
    return value


def _range(value: Any, name: str) -> tuple[int, int]:
    low, high = (int(v) for v in value)
    if not 1 <= low <= high:
        raise ValueError(f"{name} must be [low, high] with 1 ≤ low ≤ high")
    return low, high


def _lora_modules(value: Any, adapters: tuple[str, ...]) -> tuple[str, ...]:
    """`pods.lora_modules`: `all` registers every adapter at start, as `--lora-modules` does for the
    sims of a live run; absent, pods start with none and read each adapter from storage on first use."""
    if value is None:
        return ()
    if value != "all":
        raise ValueError("pods.lora_modules must be `all` (every adapter registered at start) or absent")
    return adapters


def parse(document: Mapping[str, Any]) -> Scenario:
    """Build a Scenario from a parsed YAML mapping (see the packaged files for every key)."""
    unknown = set(document) - _TOP_KEYS
    if unknown:
        raise ValueError(f"unknown keys: {', '.join(sorted(unknown))}")
    model = str(document.get("model", "llama-3.1-70b-h100-tp2"))
    if model not in PROFILES:
        raise ValueError(f"unknown model profile {model!r} (known: {', '.join(PROFILES)})")
    pods = _section(
        document,
        "pods",
        {"replicas", "max_loras", "max_cpu_loras", "max_num_seqs", "max_num_batched_tokens", "lora_modules"},
    )
    adapters = _section(
        document,
        "adapters",
        {
            "count",
            "popularity",
            "zipf_alpha",
            "tiers",
            "base_fraction",
            "system_prompt_tokens",
            "shift",
            "rank",
        },
    )
    arrivals = _section(document, "arrivals", {"rate_rps", "cv", "trace", "time_scale", "diurnal"})
    lengths = _section(document, "lengths", {"prompt_tokens", "output_tokens"})
    slo_doc = _section(document, "slo", {"ttft_s", "target_goodput", "max_replicas"})

    max_loras = int(pods.get("max_loras", 4))
    config = PodConfig(
        max_loras=max_loras,
        max_cpu_loras=int(pods.get("max_cpu_loras", max_loras)),
        max_num_seqs=int(pods.get("max_num_seqs", 256)),
        max_num_batched_tokens=int(pods.get("max_num_batched_tokens", 8192)),
    )
    popularity = str(adapters.get("popularity", "uniform"))
    if popularity == "tiers":
        tiers = [(int(t["count"]), float(t["share"])) for t in adapters["tiers"]]
        weights = workload.tier_weights(tiers)
        count = int(weights.size)
    else:
        count = int(adapters.get("count", 5))
        if count < 1:
            raise ValueError("adapters.count must be at least 1")
        if popularity == "uniform":
            weights = np.full(count, 1.0 / count)
        elif popularity == "zipf":
            weights = workload.zipf_weights(count, float(adapters.get("zipf_alpha", 1.0)))
        else:
            raise ValueError("adapters.popularity must be uniform, zipf or tiers")
    trace_rows = None
    if arrivals.get("trace"):
        trace_rows = tuple(workload.read_trace(workload.resolve_trace(str(arrivals["trace"]))))
    duration_s = float(document.get("duration_s", 600))
    spec = workload.WorkloadSpec(
        duration_s=duration_s,
        adapters=workload.adapter_names(count),
        popularity=weights,
        base_fraction=float(adapters.get("base_fraction", 0.0)),
        rate_rps=float(arrivals.get("rate_rps", 10.0)),
        arrival_cv=float(arrivals.get("cv", 1.0)),
        prompt_tokens=_range(lengths.get("prompt_tokens", (8, 512)), "lengths.prompt_tokens"),
        output_tokens=_range(lengths.get("output_tokens", (8, 512)), "lengths.output_tokens"),
        system_prompt_tokens=int(adapters.get("system_prompt_tokens", 0)),
        trace=trace_rows,
        trace_time_scale=float(arrivals.get("time_scale", 1.0)),
        shift=_shift(adapters.get("shift"), count),
        diurnal=_diurnal(arrivals.get("diurnal")),
        tenants=_tenants(document.get("tenants")),
        priorities=_priorities(document.get("priorities")),
    )
    spec = dataclasses.replace(spec, flood=_flood(document.get("flood"), spec))
    config = dataclasses.replace(config, lora_modules=_lora_modules(pods.get("lora_modules"), spec.adapters))
    if spec.diurnal is not None and spec.trace is not None:
        raise ValueError("arrivals.diurnal shapes generated arrivals; a trace brings its own")
    if spec.rate_rps <= 0 or spec.arrival_cv <= 0 or spec.trace_time_scale <= 0:
        raise ValueError("arrivals.rate_rps, arrivals.cv and arrivals.time_scale must be positive")
    deployment = str(document.get("deployment", "shared"))
    if deployment not in ("shared", "dedicated"):
        raise ValueError("deployment must be shared or dedicated")
    replicas = int(pods.get("replicas", 6))
    if replicas < 1:
        raise ValueError("pods.replicas must be at least 1")
    scrape_interval_s = float(document.get("scrape_interval_s", 0.1))
    if scrape_interval_s <= 0:
        raise ValueError("scrape_interval_s must be positive")
    splits = _splits(document.get("splits"), spec.adapters)
    epp_replicas = int(document.get("epp_replicas", 1))
    if epp_replicas < 1:
        raise ValueError("epp_replicas must be at least 1")
    epp_peers = document.get("epp_peers", True)
    if not isinstance(epp_peers, bool):
        raise ValueError("epp_peers must be true or false")
    epp_latency_s = float(document.get("epp_latency_s", 0.0))
    if epp_latency_s < 0:
        raise ValueError("epp_latency_s must not be negative")
    if splits and deployment == "dedicated":
        raise ValueError("splits need deployment: shared (a dedicated deployment serves one adapter)")
    return Scenario(
        name=str(document.get("name", "custom")),
        description=str(document.get("description", "")).strip(),
        profile=_profile(document, model, adapters),
        pod_config=config,
        replicas=replicas,
        workload=spec,
        slo=Slo(
            ttft_s=float(slo_doc.get("ttft_s", 2.0)),
            target_goodput=float(slo_doc.get("target_goodput", 0.95)),
            max_replicas=int(slo_doc.get("max_replicas", 32)),
        ),
        seed=int(document.get("seed", 1)),
        warmup_s=float(document.get("warmup_s", min(60.0, duration_s / 10))),
        scrape_interval_s=scrape_interval_s,
        deployment=deployment,
        splits=splits,
        epp_replicas=epp_replicas,
        epp_peers=epp_peers,
        epp_latency_s=epp_latency_s,
    )


def _profile(document: Mapping[str, Any], model: str, adapters: Mapping[str, Any]) -> PodProfile:
    """The cost model: `sim_cost` (`epp sim`'s latencies) when given, else the named hardware profile."""
    if "sim_cost" in document:
        if "model" in document or "rank" in adapters:
            raise ValueError("sim_cost replaces the model profile: give sim_cost or model/adapters.rank")
        return parse_sim_cost(document["sim_cost"])
    # adapters.rank (optional): the LoRA rank, which prices adapter loads (default: the profile's).
    return PROFILES[model].at_rank(int(adapters["rank"])) if "rank" in adapters else PROFILES[model]


def _shift(value: Any, count: int) -> workload.PopularityShift | None:
    """`adapters.shift: {at_s: 300, rotate: 50}`."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) != {"at_s", "rotate"}:
        raise ValueError("adapters.shift must be {at_s: seconds, rotate: adapters}")
    shift = workload.PopularityShift(at_s=float(value["at_s"]), rotate=int(value["rotate"]))
    if shift.at_s < 0 or not 0 < shift.rotate < count:
        raise ValueError("adapters.shift: at_s ≥ 0 and 0 < rotate < adapters.count")
    return shift


def _diurnal(value: Any) -> workload.DiurnalSwing | None:
    """`arrivals.diurnal: {period_s: 1200, amplitude: 0.6}`."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) != {"period_s", "amplitude"}:
        raise ValueError("arrivals.diurnal must be {period_s: seconds, amplitude: 0..1}")
    swing = workload.DiurnalSwing(period_s=float(value["period_s"]), amplitude=float(value["amplitude"]))
    if swing.period_s <= 0 or not 0 <= swing.amplitude < 1:
        raise ValueError("arrivals.diurnal: period_s > 0 and 0 ≤ amplitude < 1")
    return swing


def _number(value: Any, where: str) -> float:
    """A YAML number (not a bool, not a string), finite."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where} must be a number, not {value!r}")
    return float(value)


def _integer(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where} must be an integer, not {value!r}")
    return value


def _tenants(value: Any) -> workload.Tenants | None:
    """`tenants: {by: adapter}` or `tenants: {count: N}`."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or len(value) != 1 or not set(value) <= {"by", "count"}:
        raise ValueError("tenants must be {by: adapter} or {count: N}")
    if "by" in value:
        if value["by"] != "adapter":
            raise ValueError(f"tenants.by must be adapter, not {value['by']!r}")
        return workload.Tenants(by_adapter=True)
    count = _integer(value["count"], "tenants.count")
    if count < 1:
        raise ValueError("tenants.count must be at least 1")
    return workload.Tenants(count=count)


_FLOOD_KEYS = {"adapter", "factor", "at_s", "duration_s"}


def _flood(value: Any, spec: workload.WorkloadSpec) -> workload.Flood | None:
    """`flood: {adapter: 3 | adapter-003, factor: 10, at_s: 120, duration_s: 60}`."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) != _FLOOD_KEYS:
        raise ValueError(
            "flood must be {adapter: index or name, factor: ×rate, at_s: seconds, duration_s: seconds}"
        )
    adapter = value["adapter"]
    if isinstance(adapter, str):
        if adapter not in spec.adapters:
            raise ValueError(
                f"flood.adapter: {adapter!r} is not one of the workload's adapters ({spec.adapters[0]} …)"
            )
        index = spec.adapters.index(adapter)
    else:
        index = _integer(adapter, "flood.adapter")
        if not 0 <= index < len(spec.adapters):
            raise ValueError(f"flood.adapter: index {index} is outside 0..{len(spec.adapters) - 1}")
    flood = workload.Flood(
        adapter=index,
        factor=_number(value["factor"], "flood.factor"),
        at_s=_number(value["at_s"], "flood.at_s"),
        duration_s=_number(value["duration_s"], "flood.duration_s"),
    )
    check_flood(flood, spec)
    return flood


def check_flood(flood: workload.Flood, spec: workload.WorkloadSpec) -> None:
    """ValueError when `flood` does not fit `spec` (also after overrides changed it)."""
    if flood.factor < 1:
        raise ValueError("flood.factor must be at least 1 (the adapter's rate is multiplied by it)")
    if flood.at_s < 0 or flood.duration_s <= 0:
        raise ValueError("flood: at_s ≥ 0 and duration_s > 0")
    if not 0 <= flood.adapter < len(spec.adapters):
        raise ValueError(
            f"flood.adapter: index {flood.adapter} is outside the workload's {len(spec.adapters)} adapters"
        )
    if flood.at_s >= spec.duration_s:
        raise ValueError(
            f"flood.at_s ({flood.at_s:g}) must be before the end of the run ({spec.duration_s:g} s)"
        )
    if spec.shift is not None and flood.at_s < spec.shift.at_s < flood.end_s:
        raise ValueError("flood: the window must not straddle adapters.shift.at_s (whose rate would it be?)")


def _priorities(value: Any) -> tuple[workload.PriorityClass, ...]:
    """`priorities: [{objective: critical, priority: 10, share: 0.2}, …]`, shares summing to 1."""
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        raise ValueError("priorities must be a non-empty list of {objective, priority, share}")
    classes = []
    for i, entry in enumerate(value):
        where = f"priorities[{i}]"
        if not isinstance(entry, Mapping) or set(entry) != {"objective", "priority", "share"}:
            raise ValueError(f"{where} must be {{objective: name, priority: integer, share: 0..1}}")
        name = entry["objective"]
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}.objective must be a non-empty name")
        share = _number(entry["share"], f"{where}.share")
        if not 0 < share <= 1:
            raise ValueError(f"{where}.share must be in (0, 1]")
        classes.append(workload.PriorityClass(name, _integer(entry["priority"], f"{where}.priority"), share))
    names = [c.objective for c in classes]
    if len(set(names)) != len(names):
        raise ValueError("priorities: an objective is named twice")
    total = sum(c.share for c in classes)
    if not math.isclose(total, 1.0, abs_tol=1e-6):
        raise ValueError(f"priorities: shares must sum to 1 (they sum to {total:g})")
    return tuple(classes)


def _splits(value: Any, adapters: tuple[str, ...]) -> Splits:
    """`splits: {client-model: {target: weight, ...}}`; every client model is one of the workload's."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ValueError("splits must map a model name to {target: weight}")
    result = []
    for name, targets in value.items():
        if name not in adapters:
            raise ValueError(f"splits: {name!r} is not one of the workload's adapters ({adapters[0]} …)")
        if not isinstance(targets, Mapping) or not targets:
            raise ValueError(f"splits.{name} must map at least one target to a weight")
        weights = tuple((str(target), int(weight)) for target, weight in targets.items())
        if any(weight < 0 for _, weight in weights) or sum(w for _, w in weights) <= 0:
            raise ValueError(f"splits.{name}: weights must be ≥ 0 and not all 0")
        result.append((str(name), weights))
    return tuple(result)
