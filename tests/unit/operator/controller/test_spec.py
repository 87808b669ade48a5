"""Every shape of `spec` the product brief writes is accepted and normalised to one form;
bad specs are rejected with the offending field named."""

from __future__ import annotations

import pathlib
import re
from typing import Any

import pytest
import yaml

from epp.errors import ConfigError
from epp.operator.controller.spec import (
    AdapterSource,
    PreloadStrategy,
    SourceKind,
    parse_source,
    parse_spec,
)

FRAGMENTS = pathlib.Path(__file__).resolve().parents[3] / "fixtures" / "llmis"


def _fragment(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((FRAGMENTS / name).read_text())
    return doc


DEFAULT_WEIGHTS = {"adapterAffinity": 0.5, "kvCacheMatch": 0.2, "load": 0.15, "gpuHeadroom": 0.15}


@pytest.mark.parametrize(
    ("fragment", "expected"),
    [
        (
            "fragment-1-base.yaml",
            {
                "model": "llama-3.1-70b",
                "replicas": 1,
                "adapters": {"maxSlots": 4, "preloadStrategy": "demand", "items": []},
                "routing": {"strategy": "lora-affinity", "scoringWeights": DEFAULT_WEIGHTS},
            },
        ),
        (
            "fragment-2-routing.yaml",
            {
                "model": "llama-3.1-70b",
                "replicas": 1,
                "adapters": {"maxSlots": 4, "preloadStrategy": "demand", "items": []},
                "routing": {
                    "strategy": "lora-affinity",
                    "scoringWeights": {"adapterAffinity": 0.5, "kvCacheMatch": 0.2},
                },
            },
        ),
        (
            "fragment-3-adapters.yaml",
            {
                "model": "llama-3.1-70b",
                "replicas": 1,
                "adapters": {
                    "maxSlots": 4,
                    "preloadStrategy": "demand",
                    "items": [
                        {"name": "legal-assistant-v2", "source": "hf://legal-lora"},
                        {"name": "code-reviewer-xl", "source": "hf://code-lora"},
                    ],
                },
                "routing": {"strategy": "lora-affinity", "scoringWeights": DEFAULT_WEIGHTS},
            },
        ),
        (
            "fragment-4-scale-out.yaml",
            {
                "model": "llama-3.1-70b",
                "replicas": 6,
                "adapters": {"maxSlots": 4, "preloadStrategy": "demand", "items": []},
                "routing": {"strategy": "lora-affinity", "scoringWeights": DEFAULT_WEIGHTS},
            },
        ),
    ],
    ids=["base", "routing", "adapter-list", "scale-out"],
)
def test_every_brief_fragment_is_accepted_and_normalised(fragment: str, expected: dict[str, Any]) -> None:
    assert parse_spec(_fragment(fragment)["spec"]).canonical() == expected


def test_the_canonical_form_round_trips() -> None:
    spec = parse_spec(_fragment("fragment-3-adapters.yaml")["spec"])
    assert parse_spec(spec.canonical()) == spec


def test_canonical_mapping_with_items_keeps_settings_and_list() -> None:
    spec = parse_spec(
        {
            "model": "m",
            "adapters": {
                "maxSlots": 2,
                "preloadStrategy": "all",
                "items": [{"name": "a", "source": "s3://bucket/a", "secretRef": {"name": "aws"}}],
            },
        }
    )
    assert spec.adapters.max_slots == 2
    assert spec.adapters.preload_strategy is PreloadStrategy.ALL
    assert [(a.name, a.source.kind, a.secret_ref) for a in spec.adapters.items] == [
        ("a", SourceKind.S3, "aws")
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("huggingface/legal-lora", AdapterSource(SourceKind.HUGGINGFACE, "legal-lora")),
        ("huggingface/org/legal-lora", AdapterSource(SourceKind.HUGGINGFACE, "org/legal-lora")),
        ("hf://org/legal-lora", AdapterSource(SourceKind.HUGGINGFACE, "org/legal-lora")),
        ("org/legal-lora", AdapterSource(SourceKind.HUGGINGFACE, "org/legal-lora")),
        ("s3://bucket/loras/legal", AdapterSource(SourceKind.S3, "s3://bucket/loras/legal")),
        ("pvc://adapters/legal/v2", AdapterSource(SourceKind.PVC, "legal/v2", claim="adapters")),
        ("pvc://adapters", AdapterSource(SourceKind.PVC, "", claim="adapters")),
        ("/models/loras/legal", AdapterSource(SourceKind.LOCAL, "/models/loras/legal")),
    ],
    ids=["huggingface-short", "huggingface-org", "hf-scheme", "bare-repo", "s3", "pvc", "pvc-root", "local"],
)
def test_sources(text: str, expected: AdapterSource) -> None:
    assert parse_source(text, "source") == expected


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({}, "spec.model"),
        ({"model": ""}, "spec.model"),
        ({"model": "m", "replicas": -1}, "spec.replicas"),
        ({"model": "m", "replicas": "6"}, "spec.replicas"),
        ({"model": "m", "adapters": "legal"}, "spec.adapters"),
        ({"model": "m", "adapters": {"maxSlots": 0}}, "spec.adapters.maxSlots"),
        ({"model": "m", "adapters": {"maxslots": 4}}, "spec.adapters: unknown field(s) maxslots"),
        ({"model": "m", "adapters": {"preloadStrategy": "eager"}}, "spec.adapters.preloadStrategy"),
        ({"model": "m", "adapters": {"items": {"name": "a"}}}, "spec.adapters.items"),
        ({"model": "m", "adapters": [{"name": "a"}]}, "spec.adapters[0].source"),
        ({"model": "m", "adapters": [{"name": "Legal_LoRA", "source": "/x"}]}, "spec.adapters[0].name"),
        ({"model": "m", "adapters": [{"name": "a", "source": "ftp://x"}]}, "spec.adapters[0].source"),
        ({"model": "m", "adapters": [{"name": "a", "source": "s3://"}]}, "spec.adapters[0].source"),
        (
            {"model": "m", "adapters": [{"name": "a", "source": "/x"}, {"name": "a", "source": "/y"}]},
            "listed twice",
        ),
        ({"model": "m", "adapters": [{"name": "m", "source": "/x"}]}, "named like the base model"),
        ({"model": "m", "routing": {"strategy": "round-robin"}}, "spec.routing.strategy"),
        ({"model": "m", "routing": {"scoringWeights": {"latency": 1}}}, "spec.routing.scoringWeights"),
        ({"model": "m", "routing": {"scoringWeights": {"load": -1}}}, "spec.routing.scoringWeights.load"),
        ({"model": "m", "routing": {"scoringWeights": {"load": 0}}}, "at least one weight"),
        ({"model": "m", "replica": 2}, "spec: unknown field(s) replica"),
    ],
    ids=[
        "no-model",
        "empty-model",
        "negative-replicas",
        "string-replicas",
        "adapters-string",
        "zero-slots",
        "typo-in-settings",
        "unknown-strategy",
        "items-not-list",
        "adapter-without-source",
        "adapter-name-not-dns",
        "unknown-scheme",
        "s3-without-bucket",
        "duplicate-adapter",
        "adapter-named-like-model",
        "unknown-routing-strategy",
        "unknown-weight",
        "negative-weight",
        "all-weights-zero",
        "typo-at-top",
    ],
)
def test_bad_specs_are_rejected_naming_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(field)):
        parse_spec(spec)
