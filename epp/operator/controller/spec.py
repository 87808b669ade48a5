"""LLMInferenceService spec: validation and normalisation to one canonical form.

The product brief writes `spec.adapters` in two shapes, and a user who copies it must not
be rejected, so both are accepted (and the canonical one):

    adapters: {maxSlots: 4, preloadStrategy: demand}            # settings only
    adapters: [{name: a, source: huggingface/a}, ...]           # the adapter list only
    adapters: {maxSlots: 4, preloadStrategy: demand, items: [...]}   # canonical: both

Everything downstream sees only `ServiceSpec` (canonical). Defaults: replicas 1,
maxSlots 4, preloadStrategy `demand`, routing strategy `lora-affinity` with the brief's
weights. Adapter sources:

    huggingface/<repo>, hf://<repo>   Hugging Face repo id (vLLM fetches it; token from secretRef)
    s3://bucket/prefix                downloaded by an init container (AWS keys from secretRef)
    pvc://<claim>/<path>              a PersistentVolumeClaim mounted read-only
    /absolute/path                    a path already present in the model-server image/node

Errors are `ConfigError` with the offending field path; nothing is half-applied.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from epp.errors import ConfigError
from epp.picker.scheduling.picker_config import SCORING_WEIGHT_PLUGINS

GROUP = "inference.llm-d.ai"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "LLMInferenceService"

DEFAULT_REPLICAS = 1
DEFAULT_MAX_SLOTS = 4
MAX_SLOTS_LIMIT = 256
DEFAULT_STRATEGY = "lora-affinity"
STRATEGIES = frozenset({"lora-affinity"})
DEFAULT_SCORING_WEIGHTS: Mapping[str, float] = {
    "adapterAffinity": 0.50,
    "kvCacheMatch": 0.20,
    "load": 0.15,
    "gpuHeadroom": 0.15,
}
# Adapter names become `model` values, Kubernetes object-name suffixes and label values.
_ADAPTER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")
_SETTINGS_KEYS = frozenset({"maxSlots", "preloadStrategy", "items"})
_ADAPTER_KEYS = frozenset({"name", "source", "secretRef"})
_SPEC_KEYS = frozenset({"model", "modelSource", "replicas", "adapters", "routing", "image"})


class PreloadStrategy(enum.StrEnum):
    DEMAND = "demand"  # loaded through the runtime API on the first request naming it
    PLANNED = "planned"  # on demand, and ahead of traffic on the EPP's planned homes for it
    ALL = "all"  # registered on every replica at start (`--lora-modules`)


class SourceKind(enum.StrEnum):
    HUGGINGFACE = "huggingface"
    S3 = "s3"
    PVC = "pvc"
    LOCAL = "local"


@dataclass(frozen=True, slots=True)
class AdapterSource:
    """Where an adapter's weights come from; `location` is the repo id, URL, claim path or path."""

    kind: SourceKind
    location: str
    claim: str = ""  # PVC name (kind PVC only)


@dataclass(frozen=True, slots=True)
class AdapterSpec:
    name: str
    source: AdapterSource
    secret_ref: str = ""  # Secret holding HF_TOKEN or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY


@dataclass(frozen=True, slots=True)
class AdapterSettings:
    max_slots: int = DEFAULT_MAX_SLOTS
    preload_strategy: PreloadStrategy = PreloadStrategy.DEMAND
    items: tuple[AdapterSpec, ...] = ()


@dataclass(frozen=True, slots=True)
class RoutingSpec:
    strategy: str = DEFAULT_STRATEGY
    scoring_weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_SCORING_WEIGHTS))


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """The canonical, validated spec of one LLMInferenceService."""

    model: str
    model_source: AdapterSource
    replicas: int = DEFAULT_REPLICAS
    adapters: AdapterSettings = AdapterSettings()
    routing: RoutingSpec = RoutingSpec()
    image: str = ""  # empty: the controller's default model-server image

    def canonical(self) -> dict[str, Any]:
        """The spec written out in canonical form (what `docs/` shows and tests compare)."""
        return {
            "model": self.model,
            "replicas": self.replicas,
            "adapters": {
                "maxSlots": self.adapters.max_slots,
                "preloadStrategy": str(self.adapters.preload_strategy),
                "items": [
                    {"name": a.name, "source": source_text(a.source)}
                    | ({"secretRef": a.secret_ref} if a.secret_ref else {})
                    for a in self.adapters.items
                ],
            },
            "routing": {
                "strategy": self.routing.strategy,
                "scoringWeights": dict(self.routing.scoring_weights),
            },
        }


def source_text(source: AdapterSource) -> str:
    if source.kind is SourceKind.HUGGINGFACE:
        return f"hf://{source.location}"
    if source.kind is SourceKind.PVC:
        return f"pvc://{source.claim}/{source.location}".rstrip("/")
    return source.location


def parse_source(text: Any, where: str) -> AdapterSource:
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{where}: expected a non-empty string, got {text!r}")
    text = text.strip()
    for prefix in ("hf://", "huggingface/", "huggingface://"):
        if text.startswith(prefix):
            repo = text[len(prefix) :].strip("/")
            if not repo:
                raise ConfigError(f"{where}: {text!r} names no Hugging Face repository")
            return AdapterSource(SourceKind.HUGGINGFACE, repo)
    if text.startswith("s3://"):
        if len(text) <= len("s3://") or text[len("s3://")] == "/":
            raise ConfigError(f"{where}: {text!r} names no S3 bucket")
        return AdapterSource(SourceKind.S3, text)
    if text.startswith("pvc://"):
        claim, _, sub_path = text[len("pvc://") :].partition("/")
        if not claim:
            raise ConfigError(f"{where}: {text!r} names no PersistentVolumeClaim")
        return AdapterSource(SourceKind.PVC, sub_path.strip("/"), claim=claim)
    if text.startswith("/"):
        return AdapterSource(SourceKind.LOCAL, text)
    if "://" in text:
        raise ConfigError(f"{where}: unsupported source scheme in {text!r} (hf://, s3://, pvc://, /path)")
    # A bare repo id (`org/name`), as vLLM's --model takes it.
    return AdapterSource(SourceKind.HUGGINGFACE, text)


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _only(fields: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(map(str, unknown))}")


def _int(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{where}: expected an integer in [{low}, {high}], got {value!r}")
    return value


def _parse_adapter(raw: Any, where: str) -> AdapterSpec:
    item = _mapping(raw, where)
    _only(item, _ADAPTER_KEYS, where)
    name = item.get("name")
    if not isinstance(name, str) or not _ADAPTER_NAME.match(name):
        raise ConfigError(
            f"{where}.name: expected a lower-case DNS-style name (a-z, 0-9, '-', '.'; ≤63), got {name!r}"
        )
    secret = item.get("secretRef", "")
    if isinstance(secret, Mapping):
        secret = secret.get("name", "")
    if not isinstance(secret, str):
        raise ConfigError(f"{where}.secretRef: expected a Secret name, got {secret!r}")
    return AdapterSpec(name, parse_source(item.get("source"), f"{where}.source"), secret)


def _parse_adapters(raw: Any) -> AdapterSettings:
    if raw is None:
        return AdapterSettings()
    if isinstance(raw, list):
        settings: Mapping[str, Any] = {}
        items_raw: Any = raw
    else:
        settings = _mapping(raw, "spec.adapters")
        _only(settings, _SETTINGS_KEYS, "spec.adapters")
        items_raw = settings.get("items", [])
        if not isinstance(items_raw, list):
            raise ConfigError(f"spec.adapters.items: expected a list, got {type(items_raw).__name__}")
    items = tuple(_parse_adapter(item, f"spec.adapters[{i}]") for i, item in enumerate(items_raw))
    seen: set[str] = set()
    for adapter in items:
        if adapter.name in seen:
            raise ConfigError(f"spec.adapters: adapter {adapter.name!r} is listed twice")
        seen.add(adapter.name)
    max_slots = _int(
        settings.get("maxSlots", DEFAULT_MAX_SLOTS), "spec.adapters.maxSlots", 1, MAX_SLOTS_LIMIT
    )
    strategy_raw = settings.get("preloadStrategy", PreloadStrategy.DEMAND.value)
    try:
        strategy = PreloadStrategy(strategy_raw)
    except ValueError:
        allowed = ", ".join(s.value for s in PreloadStrategy)
        raise ConfigError(
            f"spec.adapters.preloadStrategy: expected one of {allowed}, got {strategy_raw!r}"
        ) from None
    return AdapterSettings(max_slots, strategy, items)


def _parse_routing(raw: Any) -> RoutingSpec:
    if raw is None:
        return RoutingSpec()
    routing = _mapping(raw, "spec.routing")
    _only(routing, frozenset({"strategy", "scoringWeights"}), "spec.routing")
    strategy = routing.get("strategy", DEFAULT_STRATEGY)
    if strategy not in STRATEGIES:
        raise ConfigError(
            f"spec.routing.strategy: expected one of {', '.join(sorted(STRATEGIES))}, got {strategy!r}"
        )
    weights_raw = _mapping(
        routing.get("scoringWeights", DEFAULT_SCORING_WEIGHTS), "spec.routing.scoringWeights"
    )
    _only(weights_raw, frozenset(SCORING_WEIGHT_PLUGINS), "spec.routing.scoringWeights")
    weights: dict[str, float] = {}
    for key, value in weights_raw.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or value != value:
            raise ConfigError(f"spec.routing.scoringWeights.{key}: expected a number ≥ 0, got {value!r}")
        weights[str(key)] = float(value)
    if not any(weights.values()):
        raise ConfigError("spec.routing.scoringWeights: at least one weight must be positive")
    return RoutingSpec(str(strategy), weights)


def parse_spec(raw: Any) -> ServiceSpec:
    """Validate one object's `spec` and return its canonical form; `ConfigError` if invalid."""
    spec = _mapping(raw, "spec")
    _only(spec, _SPEC_KEYS, "spec")
    model = spec.get("model")
    if not isinstance(model, str) or not model.strip():
        raise ConfigError(f"spec.model: expected a non-empty string, got {model!r}")
    model_source = parse_source(spec.get("modelSource", model), "spec.modelSource")
    if model_source.kind is SourceKind.S3:
        raise ConfigError("spec.modelSource: s3:// is supported for adapters only (use a PVC for the model)")
    image = spec.get("image", "")
    if not isinstance(image, str):
        raise ConfigError(f"spec.image: expected a string, got {image!r}")
    adapters = _parse_adapters(spec.get("adapters"))
    if any(a.name == model for a in adapters.items):
        raise ConfigError(f"spec.adapters: an adapter may not be named like the base model {model!r}")
    return ServiceSpec(
        model=model.strip(),
        model_source=model_source,
        replicas=_int(spec.get("replicas", DEFAULT_REPLICAS), "spec.replicas", 0, 10_000),
        adapters=adapters,
        routing=_parse_routing(spec.get("routing")),
        image=image,
    )
