"""The LLMInferenceService CRD admits every brief fragment (OpenAPI schema and CEL rules) and
rejects bad shapes; the objects the controller renders are valid Kubernetes objects, and the
controller's own Role holds every right of the EPP Role it creates (Kubernetes refuses a Role
that grants more than its creator holds)."""

from __future__ import annotations

import pathlib
import re
from collections.abc import Iterator, Mapping
from typing import Any

import celpy
import celpy.adapter
import jsonschema  # type: ignore[import-untyped]  # no stubs installed
import kubernetes_validate
import pytest
import yaml

from epp.errors import ConfigError
from epp.operator.controller.render import Owner, RenderSettings, desired_objects, epp_rbac
from epp.operator.controller.spec import parse_spec

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "manifests" / "controller" / "inference.llm-d.ai_llminferenceservices.yaml"
CONTROLLER_ROLE = ROOT / "manifests" / "controller" / "role.yaml"
FRAGMENTS = sorted((ROOT / "tests" / "fixtures" / "llmis").glob("*.yaml"))
SAMPLE = ROOT / "manifests" / "controller" / "samples" / "legal-assistants.yaml"
KUBERNETES_VERSION = "1.30.0"
_CEL = celpy.Environment()


def _load(path: pathlib.Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _schema() -> dict[str, Any]:
    (crd,) = _load(CRD_PATH)
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _cel_violations(schema: Mapping[str, Any], value: Any, path: str) -> Iterator[str]:
    for rule in schema.get("x-kubernetes-validations", ()):
        program = _CEL.program(_CEL.compile(rule["rule"]))
        result = program.evaluate({"self": celpy.adapter.json_to_cel(value)})
        if not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            yield f"{path}: {rule['message']}"
    if isinstance(value, Mapping):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                yield from _cel_violations(sub, value[name], f"{path}.{name}")


def admission_errors(obj: Mapping[str, Any]) -> list[str]:
    schema = _schema()
    errors = [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(obj)]
    return errors + list(_cel_violations(schema, obj, ""))


def test_crd_is_a_valid_kubernetes_object_with_status_and_columns() -> None:
    (crd,) = _load(CRD_PATH)
    kubernetes_validate.validate(crd, KUBERNETES_VERSION, strict=True)
    (version,) = crd["spec"]["versions"]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Ready",
        "Replicas",
        "Ready Replicas",
        "Adapters",
        "Age",
    ]


def test_schema_is_structural_except_the_two_shaped_adapters_field() -> None:
    def walk(node: Mapping[str, Any], where: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
        yield where, node
        for name, sub in node.get("properties", {}).items():
            yield from walk(sub, f"{where}.{name}")
        if isinstance(node.get("items"), Mapping):
            yield from walk(node["items"], f"{where}[]")

    untyped = [where for where, node in walk(_schema(), "") if "type" not in node]
    assert untyped == [".spec.adapters"]
    assert _schema()["properties"]["spec"]["properties"]["adapters"]["x-kubernetes-preserve-unknown-fields"]


@pytest.mark.parametrize("path", [*FRAGMENTS, SAMPLE], ids=[p.name for p in [*FRAGMENTS, SAMPLE]])
def test_every_brief_fragment_and_the_sample_are_admitted_and_parsed(path: pathlib.Path) -> None:
    (obj,) = _load(path)
    assert admission_errors(obj) == []
    parse_spec(obj["spec"])


@pytest.mark.parametrize(
    ("adapters", "message"),
    [
        ("legal", "spec.adapters"),
        (4, "spec.adapters"),
        ({"maxSlots": 0}, "spec.adapters.maxSlots"),
        ({"maxSlots": "4"}, "spec.adapters.maxSlots"),
        ({"preloadStrategy": "eager"}, "spec.adapters.preloadStrategy"),
        ({"items": {"name": "a"}}, "spec.adapters.items"),
    ],
    ids=["string", "number", "zero-slots", "string-slots", "bad-strategy", "items-mapping"],
)
def test_bad_adapter_shapes_pass_admission_and_the_controller_refuses_them(
    adapters: Any, message: str
) -> None:
    """The API server cannot check an untyped field (CEL cannot see it): the controller does."""
    obj = {
        "apiVersion": "inference.llm-d.ai/v1alpha1",
        "kind": "LLMInferenceService",
        "metadata": {"name": "x"},
        "spec": {"model": "m", "adapters": adapters},
    }
    assert admission_errors(obj) == []
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_spec(obj["spec"])


def test_zero_weights_are_refused_at_admission() -> None:
    obj = {
        "apiVersion": "inference.llm-d.ai/v1alpha1",
        "kind": "LLMInferenceService",
        "metadata": {"name": "x"},
        "spec": {"model": "m", "routing": {"scoringWeights": {"load": 0.0}}},
    }
    assert any("at least one scoring weight" in e for e in admission_errors(obj))


def _pool_and_model_schemas() -> dict[str, dict[str, Any]]:
    schemas = {}
    for name in (
        "inference.networking.k8s.io_inferencepools.yaml",
        "inference.networking.x-k8s.io_inferencemodels.yaml",
    ):
        (crd,) = _load(ROOT / "manifests" / "crds" / name)
        for version in crd["spec"]["versions"]:
            key = f"{crd['spec']['group']}/{version['name']}/{crd['spec']['names']['kind']}"
            schemas[key] = version["schema"]["openAPIV3Schema"]
    return schemas


@pytest.mark.parametrize(
    "strategy_and_sources",
    [
        ("demand", ["huggingface/legal-lora", "s3://bucket/code", "pvc://loras/x", "/opt/lora"]),
        ("all", ["hf://org/legal-lora"]),
    ],
    ids=["demand-every-source", "all"],
)
def test_rendered_objects_are_valid_kubernetes_objects(strategy_and_sources: tuple[str, list[str]]) -> None:
    strategy, sources = strategy_and_sources
    spec = parse_spec(
        {
            "model": "llama-3.1-70b",
            "replicas": 6,
            "adapters": {
                "maxSlots": 4,
                "preloadStrategy": strategy,
                "items": [
                    {"name": f"adapter-{i}", "source": s, "secretRef": "creds"} for i, s in enumerate(sources)
                ],
            },
        }
    )
    crd_schemas = _pool_and_model_schemas()
    objects = desired_objects(Owner("legal", "ns", "uid-1"), spec, RenderSettings())
    for obj in objects:
        key = f"{obj['apiVersion']}/{obj['kind']}"
        if key in crd_schemas:
            jsonschema.Draft7Validator(crd_schemas[key]).validate(obj)
        else:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def _granted(role: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_controller_holds_every_right_it_grants_the_epp() -> None:
    (controller_role,) = _load(CONTROLLER_ROLE)
    (epp_role,) = [o for o in epp_rbac(Owner("legal", "ns", "uid-1")) if o["kind"] == "Role"]
    assert _granted(epp_role) - _granted(controller_role) == set(), (
        "the EPP Role grants what manifests/controller/role.yaml does not hold: the API server refuses it"
    )
