"""The CRDs in manifests/crds are valid Kubernetes objects, and the samples pass both their own
CRD schema (OpenAPI and CEL rules) and the EPP's parser, which reject the same bad objects."""

from __future__ import annotations

import copy
import pathlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import celpy
import celpy.adapter
import jsonschema  # type: ignore[import-untyped]  # no stubs installed
import kubernetes_validate
import pytest
import yaml

from epp.picker.datastore import InferenceModel, InferenceObjective, Pool
from epp.picker.sources.objects import ObjectError, parse_object

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "manifests" / "crds"
SAMPLE_DIR = ROOT / "manifests" / "samples"
KUBERNETES_VERSION = "1.30.0"

CRD_FILES = sorted(CRD_DIR.glob("*.yaml"))
SAMPLE_FILES = sorted(SAMPLE_DIR.glob("*.yaml"))


def _load(path: pathlib.Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) → openAPIV3Schema, over every CRD file."""
    schemas = {}
    for path in CRD_FILES:
        for crd in _load(path):
            for version in crd["spec"]["versions"]:
                key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
                schemas[key] = version["schema"]["openAPIV3Schema"]
    return schemas


SCHEMAS = _schemas()
SAMPLES = [(path.name, index, doc) for path in SAMPLE_FILES for index, doc in enumerate(_load(path))]


def _schema_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    return SCHEMAS[(obj["apiVersion"], obj["kind"])]


def _walk(schema: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), Mapping):
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), Mapping):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


def schema_errors(obj: Mapping[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(_schema_of(obj))
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]


_CEL = celpy.Environment()


def _cel_violations(schema: Mapping[str, Any], value: Any, path: str) -> Iterator[str]:
    """Evaluate every create-time `x-kubernetes-validations` rule where its field is set."""
    for rule in schema.get("x-kubernetes-validations", ()):
        if "oldSelf" in rule["rule"]:
            continue  # transition rules only run on update
        program = _CEL.program(_CEL.compile(rule["rule"]))
        result = program.evaluate({"self": celpy.adapter.json_to_cel(value)})
        if not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            yield f"{path}: {rule['message']}"
    if isinstance(value, Mapping):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                yield from _cel_violations(sub, value[name], f"{path}.{name}")
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            yield from _cel_violations(schema["items"], item, f"{path}[{index}]")


def cel_violations(obj: Mapping[str, Any]) -> list[str]:
    return list(_cel_violations(_schema_of(obj), obj, ""))


# -- the CRDs themselves ---------------------------------------------------------------------


@pytest.mark.parametrize("path", CRD_FILES, ids=[p.name for p in CRD_FILES])
def test_crd_is_a_valid_kubernetes_object(path: pathlib.Path) -> None:
    (crd,) = _load(path)
    kubernetes_validate.validate(crd, KUBERNETES_VERSION, strict=True)
    assert path.name == f"{crd['spec']['group']}_{crd['spec']['names']['plural']}.yaml"
    assert crd["metadata"]["name"] == f"{crd['spec']['names']['plural']}.{crd['spec']['group']}"
    assert crd["spec"]["scope"] == "Namespaced"
    for version in crd["spec"]["versions"]:
        assert version["subresources"] == {"status": {}}


@pytest.mark.parametrize("path", CRD_FILES, ids=[p.name for p in CRD_FILES])
def test_crd_schema_is_structural_and_its_defaults_and_rules_are_valid(path: pathlib.Path) -> None:
    (crd,) = _load(path)
    for version in crd["spec"]["versions"]:
        for where, node in _walk(version["schema"]["openAPIV3Schema"]):
            assert "type" in node, f"{where}: a structural schema gives every node a type"
            if "default" in node:
                jsonschema.Draft7Validator(node).validate(node["default"])
            for rule in node.get("x-kubernetes-validations", ()):
                _CEL.compile(rule["rule"])  # raises on a syntax error
                assert rule["message"], f"{where}: every rule explains itself"


def test_a_schema_error_in_a_crd_is_caught() -> None:
    (crd,) = _load(CRD_DIR / "inference.networking.k8s.io_inferencepools.yaml")
    crd["spec"]["versions"][0]["served"] = "yes"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(crd, KUBERNETES_VERSION, strict=True)


def test_every_kind_the_epp_reads_has_a_crd() -> None:
    assert set(SCHEMAS) == {
        ("inference.networking.k8s.io/v1", "InferencePool"),
        ("inference.networking.x-k8s.io/v1alpha2", "InferencePool"),
        ("inference.networking.x-k8s.io/v1alpha2", "InferenceModel"),
        ("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective"),
    }


@pytest.mark.parametrize(
    ("filename", "short_names", "columns"),
    [
        ("inference.networking.k8s.io_inferencepools.yaml", ["infpool"], []),
        (
            "inference.networking.x-k8s.io_inferencemodels.yaml",
            [],
            ["Model Name", "Inference Pool", "Criticality", "Age"],
        ),
        ("inference.networking.x-k8s.io_inferenceobjectives.yaml", [], ["Inference Pool", "Priority", "Age"]),
    ],
    ids=["pool-v1", "model", "objective"],
)
def test_short_names_and_printer_columns(filename: str, short_names: list[str], columns: list[str]) -> None:
    (crd,) = _load(CRD_DIR / filename)
    assert crd["spec"]["names"].get("shortNames", []) == short_names
    (version,) = crd["spec"]["versions"]
    assert [c["name"] for c in version.get("additionalPrinterColumns", [])] == columns


# -- samples ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("filename", "index", "obj"), SAMPLES, ids=[f"{f}#{i}" for f, i, _ in SAMPLES])
def test_sample_passes_its_crd_and_the_parser(filename: str, index: int, obj: dict[str, Any]) -> None:
    assert schema_errors(obj) == []
    assert cel_violations(obj) == []
    parsed = parse_object(obj, default_namespace="default", strict=True)
    assert parsed.name == obj["metadata"]["name"]


def test_samples_describe_one_pool_with_adapters_and_an_objective() -> None:
    parsed = [parse_object(obj, default_namespace="default") for _, _, obj in SAMPLES]
    pools = [p for p in parsed if isinstance(p, Pool)]
    assert {(p.group, p.name, p.selector["app"], p.target_ports) for p in pools} == {
        ("inference.networking.k8s.io", "vllm-llama3-8b", "vllm", (8000,)),
        ("inference.networking.x-k8s.io", "vllm-llama3-8b", "vllm", (8000,)),
    }
    assert all(
        (p.endpoint_picker_name, p.endpoint_picker_port) == ("vllm-llama3-8b-epp", 9002) for p in pools
    )
    models = [m for m in parsed if isinstance(m, InferenceModel)]
    assert len(models) >= 3 and all(m.pool_name == "vllm-llama3-8b" for m in models)
    assert any(len(m.target_models) > 1 for m in models)
    objectives = [o for o in parsed if isinstance(o, InferenceObjective)]
    assert [o.pool_name for o in objectives] == ["vllm-llama3-8b"]


def _sample(filename: str, index: int = 0) -> dict[str, Any]:
    return copy.deepcopy(_load(SAMPLE_DIR / filename)[index])


def _set(path: list[str | int], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(obj: dict[str, Any]) -> None:
        target: Any = obj
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _delete(path: list[str | int]) -> Callable[[dict[str, Any]], None]:
    def mutate(obj: dict[str, Any]) -> None:
        target: Any = obj
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return mutate


# (sample file, doc index, mutation, which check rejects it: "schema" or "cel", field the parser names)
BAD_SAMPLES = [
    (
        "inferencepool.yaml",
        0,
        _set(["spec", "targetPorts", 0, "number"], 0),
        "schema",
        "spec.targetPorts[0].number",
    ),
    (
        "inferencepool.yaml",
        0,
        _set(["spec", "targetPorts"], [{"number": 8000}, {"number": 8000}]),
        "cel",
        "spec.targetPorts[1].number",
    ),
    ("inferencepool.yaml", 0, _set(["spec", "targetPorts"], []), "schema", "spec.targetPorts"),
    (
        "inferencepool.yaml",
        0,
        _set(["spec", "targetPorts"], [{"number": 8000 + i} for i in range(9)]),
        "schema",
        "spec.targetPorts",
    ),
    (
        "inferencepool.yaml",
        0,
        _delete(["spec", "endpointPickerRef", "port"]),
        "cel",
        "spec.endpointPickerRef.port",
    ),
    (
        "inferencepool.yaml",
        0,
        _set(["spec", "endpointPickerRef", "failureMode"], "FailSometimes"),
        "schema",
        "spec.endpointPickerRef.failureMode",
    ),
    (
        "inferencepool.yaml",
        0,
        _set(["spec", "selector", "matchLabels", "app"], "-vllm"),
        "schema",
        "spec.selector.matchLabels.app",
    ),
    (
        "inferencepool.yaml",
        0,
        _set(["spec", "selector", "matchLabels"], {}),
        "schema",
        "spec.selector.matchLabels",
    ),
    ("inferencepool.yaml", 0, _set(["spec", "appProtocol"], "grpc"), "schema", "spec.appProtocol"),
    (
        "inferencepool-v1alpha2.yaml",
        0,
        _set(["spec", "targetPortNumber"], 70000),
        "schema",
        "spec.targetPortNumber",
    ),
    ("inferencepool-v1alpha2.yaml", 0, _delete(["spec", "extensionRef"]), "schema", "spec.extensionRef"),
    (
        "inferencemodels.yaml",
        1,
        _delete(["spec", "targetModels", 1, "weight"]),
        "cel",
        "spec.targetModels[1].weight",
    ),
    (
        "inferencemodels.yaml",
        1,
        _set(["spec", "targetModels", 0, "weight"], 1_000_001),
        "schema",
        "spec.targetModels[0].weight",
    ),
    ("inferencemodels.yaml", 0, _set(["spec", "modelName"], "m" * 257), "schema", "spec.modelName"),
    ("inferencemodels.yaml", 0, _set(["spec", "criticality"], "Urgent"), "schema", "spec.criticality"),
    ("inferencemodels.yaml", 0, _delete(["spec", "poolRef"]), "schema", "spec.poolRef"),
    (
        "inferencemodels.yaml",
        1,
        _set(["spec", "targetModels"], [{"name": f"a{i}"} for i in range(11)]),
        "schema",
        "spec.targetModels",
    ),
    ("inferenceobjective.yaml", 0, _set(["spec", "priority"], "high"), "schema", "spec.priority"),
    ("inferenceobjective.yaml", 0, _delete(["spec", "poolRef", "name"]), "schema", "spec.poolRef.name"),
]


@pytest.mark.parametrize(
    ("filename", "index", "mutate", "rejected_by", "field"),
    BAD_SAMPLES,
    ids=[
        "port-0",
        "duplicate-ports",
        "no-ports",
        "nine-ports",
        "service-without-port",
        "bad-failure-mode",
        "bad-label-value",
        "empty-selector",
        "bad-app-protocol",
        "v1alpha2-port-70000",
        "v1alpha2-no-extension-ref",
        "weights-on-some-targets",
        "weight-too-big",
        "model-name-257",
        "bad-criticality",
        "model-without-pool-ref",
        "eleven-targets",
        "priority-not-int",
        "objective-pool-ref-without-name",
    ],
)
def test_bad_sample_fails_its_crd_and_the_parser(
    filename: str,
    index: int,
    mutate: Callable[[dict[str, Any]], None],
    rejected_by: str,
    field: str,
) -> None:
    obj = _sample(filename, index)
    mutate(obj)
    if rejected_by == "schema":
        assert schema_errors(obj) != []
    else:
        assert schema_errors(obj) == []
        assert cel_violations(obj) != []
    with pytest.raises(ObjectError) as caught:
        parse_object(obj, default_namespace="default", strict=True)
    assert caught.value.field == field
    assert caught.value.name == obj["metadata"]["name"]
    assert caught.value.kind == obj["kind"]
