"""What can be checked about the cluster setup without a cluster: the Dockerfile (hadolint and
its promises), the build context and constraints, every YAML file under manifests/, kind/ and
e2e/ (built-in kinds against the Kubernetes schemas, our CRs against our CRDs, third-party CRs
for the fields their implementations require, kustomizations for what they reference), the
generated Envoy config, and the shell scripts (shellcheck, and their messages when a tool is
missing)."""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator, Mapping
from typing import Any

import kubernetes_validate
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.deployment.tools import require
from tests.support.envoy_validation import validate_config
from tests.support.kube_objects import (
    THIRD_PARTY_GROUPS,
    get,
    group,
    is_ours,
    ours_errors,
    schemas_of,
    third_party_errors,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
KUBERNETES_VERSION = "1.30.0"
YAML_ROOTS = ("manifests", "kind", "e2e")


def _yaml_files() -> list[pathlib.Path]:
    files = []
    for top in YAML_ROOTS:
        files += [p for p in (ROOT / top).rglob("*.y*ml") if p.suffix in (".yaml", ".yml")]
    return sorted(files)


def _rel(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT))


def _docs(path: pathlib.Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


YAML_FILES = _yaml_files()


def _is_kustomization(path: pathlib.Path) -> bool:
    return path.name == "kustomization.yaml"


def _is_config_file(path: pathlib.Path) -> bool:
    """Files that are not Kubernetes objects: Helm values, kind, kwok and Envoy configs."""
    return path.name == "values.yaml" or _rel(path) in {
        "kind/cluster.yaml",
        "kind/controlplane/pod-ready.yaml",
        "manifests/gateway/envoy/envoy.yaml",
    }


def _objects() -> Iterator[tuple[str, int, dict[str, Any]]]:
    for path in YAML_FILES:
        if _is_kustomization(path) or _is_config_file(path):
            continue
        for index, doc in enumerate(_docs(path)):
            yield _rel(path), index, doc


OBJECTS = list(_objects())


CRD_SCHEMAS = schemas_of(obj for _, _, obj in OBJECTS)


# -- Dockerfile ------------------------------------------------------------------------------------


DOCKERFILE = (ROOT / "Dockerfile").read_text()


def test_dockerfile_passes_hadolint() -> None:
    result = subprocess.run(
        [require("hadolint"), "--no-color", "-"], input=DOCKERFILE, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_a_bad_dockerfile() -> None:
    bad = "FROM python:latest\nRUN pip install aiohttp\n"
    hadolint = require("hadolint")
    result = subprocess.run([hadolint, "--no-color", "-"], input=bad, capture_output=True, text=True)
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # latest tag
    assert "DL3013" in result.stdout  # unpinned pip install


def _instructions(text: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", text)
    lines = [line.strip() for line in joined.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if line and not line.startswith("#")
    ]


def test_dockerfile_is_multi_stage_pinned_non_root_and_reproducible() -> None:
    steps = _instructions(DOCKERFILE)
    base = next(value for op, value in steps if op == "ARG" and value.startswith("PYTHON_IMAGE="))
    assert re.fullmatch(r"PYTHON_IMAGE=python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", base), base
    stages = [value for op, value in steps if op == "FROM"]
    assert len(stages) >= 2 and stages[0].endswith(" AS builder"), stages
    final = steps[max(i for i, (op, _) in enumerate(steps) if op == "FROM") :]
    users = [value for op, value in final if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root"), users
    assert ("ENTRYPOINT", '["epp"]') in final
    assert any(op == "COPY" and value.startswith("--from=builder") for op, value in final)
    assert not any(op == "RUN" for op, _ in final), "the runtime stage only copies the built virtualenv"
    assert any(op == "ARG" and value.startswith("SOURCE_DATE_EPOCH") for op, value in steps)
    run_text = " ".join(value for op, value in steps if op == "RUN")
    assert "--constraint /src/constraints.txt" in run_text
    assert "PIP_NO_CACHE_DIR=1" in DOCKERFILE


# -- constraints and build context -------------------------------------------------------------------


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"constraints.txt: {line!r} is not NAME==VERSION"
            pins[canonicalize_name(name)] = version
    return pins


def _runtime_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(text) for text in project["dependencies"]]


def _linux_marker_holds(requirement: Requirement) -> bool:
    env = {"sys_platform": "linux", "platform_system": "Linux", "python_version": "3.11", "extra": ""}
    return requirement.marker is None or requirement.marker.evaluate(env)


def test_constraints_pin_every_runtime_dependency_within_pyproject_bounds() -> None:
    pins = _pins()
    missing, outside = [], []
    seen: set[str] = set()
    stack = [r for r in _runtime_requirements() if _linux_marker_holds(r)]
    while stack:
        requirement = stack.pop()
        name = canonicalize_name(requirement.name)
        if name not in pins:
            missing.append(name)
            continue
        if not requirement.specifier.contains(pins[name], prereleases=True):
            outside.append(f"{name}=={pins[name]} does not satisfy {requirement}")
        if name in seen:
            continue
        seen.add(name)
        try:
            dependencies = importlib.metadata.requires(requirement.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed here; its own pin was checked above
        stack += [r for r in map(Requirement, dependencies) if _linux_marker_holds(r)]
    assert not missing, f"constraints.txt lacks pins for {sorted(set(missing))}"
    assert not outside, outside


def _dockerignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """(is_exception, regex) per line, with Docker's matching: `*` stays within one path
    segment, `**` spans segments, and a pattern that matches a directory matches its content."""
    patterns = []
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        patterns.append((exception, re.compile(regex + "(?:/.*)?")))
    return patterns


def build_context_files() -> list[pathlib.Path]:
    """The files `docker build .` sends, by .dockerignore (the last matching line wins)."""
    patterns = _dockerignore_patterns()
    kept = []
    for path in sorted(ROOT.rglob("*")):
        if not path.is_file() or ".git" in path.relative_to(ROOT).parts[:1]:
            continue
        relative = path.relative_to(ROOT).as_posix()
        included = True
        for exception, regex in patterns:
            if regex.fullmatch(relative):
                included = exception
        if included:
            kept.append(path)
    return kept


def test_build_context_holds_the_sources_and_nothing_heavy() -> None:
    context = {p.relative_to(ROOT).as_posix() for p in build_context_files()}
    assert {
        "pyproject.toml",
        "constraints.txt",
        "epp/cli.py",
        "epp/serve/app.py",
        "epp/tools/sim/cli.py",
    } <= context
    for unwanted in (".venv/", "tests/", "e2e/", ".git/", "benchmarks/", "__pycache__/"):
        assert not any(f.startswith(unwanted) or f"/{unwanted}" in f for f in context), unwanted


@pytest.mark.timeout(300)
def test_wheel_built_from_the_build_context_has_the_whole_package(tmp_path: pathlib.Path) -> None:
    """What the builder stage does, minus Docker: copy the context, build the wheel offline."""
    context = tmp_path / "context"
    for path in build_context_files():
        target = context / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            ".",
        ],
        cwd=context,
        capture_output=True,
        text=True,
        timeout=280,
        env={**os.environ, "SOURCE_DATE_EPOCH": "315532800"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = tmp_path.glob("lora_epp-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "epp = epp.cli:main" in archive.read(entry_points).decode()
    expected = {
        p.relative_to(context).as_posix()
        for p in (context / "epp").rglob("*")
        if p.is_file()
        and p.suffix in (".py", ".yaml", ".csv", ".json")
        and "__pycache__" not in p.parts
        and "_proto" not in p.parts
    }
    assert expected <= names, sorted(expected - names)[:10]


# -- YAML: Kubernetes objects ------------------------------------------------------------------------


def test_every_yaml_file_parses_and_is_known() -> None:
    assert len(YAML_FILES) > 10
    for path in YAML_FILES:
        docs = _docs(path)
        assert docs, f"{_rel(path)} is empty"
        assert all(isinstance(doc, dict) for doc in docs), f"{_rel(path)}: every document is a mapping"


def _is_ours(obj: Mapping[str, Any]) -> bool:
    """A kind one of our CRDs (manifests/crds, manifests/controller) defines."""
    return is_ours(obj, CRD_SCHEMAS)


BUILT_IN = [(f, i, o) for f, i, o in OBJECTS if not _is_ours(o) and group(o) not in THIRD_PARTY_GROUPS]
OURS = [(f, i, o) for f, i, o in OBJECTS if _is_ours(o)]
THIRD_PARTY = [(f, i, o) for f, i, o in OBJECTS if group(o) in THIRD_PARTY_GROUPS]


@pytest.mark.parametrize(("path", "index", "obj"), BUILT_IN, ids=[f"{f}#{i}" for f, i, _ in BUILT_IN])
def test_built_in_object_validates_against_the_kubernetes_schema(
    path: str, index: int, obj: dict[str, Any]
) -> None:
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize(("path", "index", "obj"), OURS, ids=[f"{f}#{i}" for f, i, _ in OURS])
def test_our_custom_resource_passes_its_crd_and_the_epp_parser(
    path: str, index: int, obj: dict[str, Any]
) -> None:
    assert ours_errors(obj, CRD_SCHEMAS) == [], path


def _names_of(kind: str) -> set[str]:
    return {o["metadata"]["name"] for _, _, o in OBJECTS if o.get("kind") == kind}


@pytest.mark.parametrize(("path", "index", "obj"), THIRD_PARTY, ids=[f"{f}#{i}" for f, i, _ in THIRD_PARTY])
def test_third_party_object_has_the_fields_its_implementation_requires(
    path: str, index: int, obj: dict[str, Any]
) -> None:
    kind = obj["kind"]
    assert third_party_errors(obj) == [], path
    if kind == "HTTPRoute":
        for ref in obj["spec"]["parentRefs"]:
            assert ref["name"] in _names_of("Gateway"), f"{path}: parent {ref['name']} is no Gateway here"
        for rule in obj["spec"]["rules"]:
            assert rule["backendRefs"], f"{path}: a rule without backends"
            for ref in rule["backendRefs"]:
                if ref.get("kind") == "InferencePool":
                    assert ref.get("group") == "inference.networking.k8s.io", ref
                    assert ref["name"] in _names_of("InferencePool"), (
                        f"{path}: no InferencePool {ref['name']}"
                    )
                    assert "port" not in ref, "an InferencePool backendRef ignores port; do not set one"
                else:
                    assert ref.get("kind", "Service") == "Service" and ref["name"] in _names_of("Service"), (
                        ref
                    )
                    assert "port" in ref, f"{path}: a Service backendRef needs a port"


def test_every_pool_names_an_epp_service_that_exists_on_its_port() -> None:
    services = {o["metadata"]["name"]: o for _, _, o in OBJECTS if o.get("kind") == "Service"}
    services |= {  # the e2e second pool's EPP Service is manifests/epp's with suffix -b
        f"{name}-b": obj for name, obj in services.items() if name == "vllm-llama3-8b-epp"
    }
    for path, _, obj in OURS:
        if obj["kind"] != "InferencePool" or obj["apiVersion"] != "inference.networking.k8s.io/v1":
            continue
        ref = obj["spec"]["endpointPickerRef"]
        assert ref["name"] in services, f"{path}: no Service {ref['name']}"
        ports = {p["port"] for p in services[ref["name"]]["spec"]["ports"]}
        assert ref["port"]["number"] in ports, (
            f"{path}: Service {ref['name']} has no port {ref['port']['number']}"
        )


def _pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for path, _, obj in BUILT_IN:
        template = get(obj, "spec.template.spec")
        if isinstance(template, dict):
            yield f"{path}:{obj['metadata']['name']}", template


@pytest.mark.parametrize(("where", "spec"), list(_pod_specs()), ids=[w for w, _ in _pod_specs()])
def test_workload_images_are_pinned_and_containers_cannot_escalate(where: str, spec: dict[str, Any]) -> None:
    for container in spec["containers"]:
        image = container["image"]
        assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), (
            f"{where}: unpinned image {image}"
        )
        assert container["securityContext"]["allowPrivilegeEscalation"] is False, where
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], where


# -- YAML: kustomizations and configs -------------------------------------------------------------------


KUSTOMIZATIONS = [p for p in YAML_FILES if _is_kustomization(p)]


@pytest.mark.parametrize("path", KUSTOMIZATIONS, ids=[_rel(p) for p in KUSTOMIZATIONS])
def test_kustomization_references_exist(path: pathlib.Path) -> None:
    (doc,) = _docs(path)
    assert doc["kind"] == "Kustomization"
    for resource in doc.get("resources", []):
        target = (path.parent / resource).resolve()
        assert target.is_file() or (target / "kustomization.yaml").is_file(), (
            f"{_rel(path)}: {resource} is missing"
        )
        if target.is_file():
            assert target.is_relative_to(path.parent), (
                f"{_rel(path)}: kustomize refuses files outside its root"
            )
    for generator in doc.get("configMapGenerator", []):
        for file in generator.get("files", []):
            assert (path.parent / file).is_file(), f"{_rel(path)}: {file} is missing"


@pytest.mark.parametrize("path", KUSTOMIZATIONS, ids=[_rel(p) for p in KUSTOMIZATIONS])
def test_kustomization_builds_with_kubectl(path: pathlib.Path) -> None:
    kubectl = require("kubectl")
    result = subprocess.run(
        [kubectl, "kustomize", str(path.parent)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    for doc in yaml.safe_load_all(result.stdout):
        if doc and not _is_ours(doc) and group(doc) not in THIRD_PARTY_GROUPS:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_second_pool_overlay_patches_the_epp_arguments_it_means_to() -> None:
    """The e2e second pool patches manifests/epp by position: the position must still hold the
    argument the patch replaces."""
    (deployment,) = _docs(ROOT / "manifests" / "epp" / "deployment.yaml")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][0] == "serve"
    assert container["args"][1].startswith("--pool-name="), "e2e/manifests/second-pool/epp replaces args[1]"


def test_kind_cluster_config() -> None:
    (config,) = _docs(ROOT / "kind" / "cluster.yaml")
    assert (config["kind"], config["apiVersion"]) == ("Cluster", "kind.x-k8s.io/v1alpha4")
    roles = [node["role"] for node in config["nodes"]]
    assert roles.count("control-plane") == 1 and set(roles) <= {"control-plane", "worker"}


def test_helm_values_switch_on_inference_pool_support() -> None:
    kgateway = _docs(ROOT / "manifests/gateway/kgateway/values.yaml")[0]
    assert kgateway["inferenceExtension"]["enabled"] is True
    istio = _docs(ROOT / "manifests/gateway/istio/values.yaml")[0]
    assert istio["pilot"]["env"]["ENABLE_GATEWAY_API_INFERENCE_EXTENSION"] == "true"
    envoy_gateway = _docs(ROOT / "manifests/gateway/envoy-gateway/values.yaml")[0]
    resources = envoy_gateway["config"]["envoyGateway"]["extensionManager"]["backendResources"]
    assert {"group": "inference.networking.k8s.io", "kind": "InferencePool", "version": "v1"} in resources


ENVOY_DIR = ROOT / "manifests" / "gateway" / "envoy"


# The command in manifests/gateway/envoy/kustomization.yaml that wrote envoy.yaml.
ENVOY_RENDER_ARGS = [
    "--upstream", "override-host",
    "--epp-address", "vllm-llama3-8b-epp-replicas.default.svc.cluster.local:9002",
    "--epp-health-port", "9003",
    "--failure-mode", "FailOpen",
    "--pool-endpoint", "vllm-llama3-8b-pods.default.svc.cluster.local:8000",
    "--listen-port", "8081",
    "--admin-port", "19000",
]  # fmt: skip


def test_plain_envoy_config_is_what_epp_envoy_config_renders(tmp_path: pathlib.Path) -> None:
    """manifests/gateway/envoy/envoy.yaml equals a fresh render with the command written in its
    kustomization.yaml, so the shipped config never drifts from the generator."""
    comment = " ".join(
        line.lstrip("#").replace("\\", " ")
        for line in (ENVOY_DIR / "kustomization.yaml").read_text().splitlines()
        if line.startswith("#")
    )
    assert "epp envoy-config " + " ".join(ENVOY_RENDER_ARGS) in " ".join(comment.split())
    fresh = tmp_path / "envoy.yaml"
    result = subprocess.run(
        [sys.executable, "-m", "epp", "envoy-config", *ENVOY_RENDER_ARGS, "-o", str(fresh)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    shipped = (ENVOY_DIR / "envoy.yaml").read_text()
    assert shipped == fresh.read_text(), "re-render envoy.yaml with the command in its kustomization.yaml"


@pytest.mark.timeout(120)
def test_plain_envoy_config_passes_envoy_validation() -> None:
    validate_config(ENVOY_DIR / "envoy.yaml")


# -- shell scripts -----------------------------------------------------------------------------------


SHELL_SCRIPTS = sorted(
    {
        *ROOT.glob("kind/**/*.sh"),
        *ROOT.glob("manifests/**/*.sh"),
        *ROOT.glob("e2e/**/*.sh"),
        *ROOT.glob(".ci/*.sh"),
        *ROOT.glob("benchmarks/**/*.sh"),
        *[p for p in [ROOT / ".ci" / "run"] if p.exists()],
    }
)


@pytest.mark.parametrize("path", SHELL_SCRIPTS, ids=[_rel(p) for p in SHELL_SCRIPTS])
def test_shell_script_passes_shellcheck(path: pathlib.Path) -> None:
    shellcheck = require("shellcheck")
    result = subprocess.run([shellcheck, "--shell=bash", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_shellcheck_catches_a_bad_script(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "bad.sh"
    script.write_text("#!/usr/bin/env bash\nrm -rf $DIR/*\n")
    result = subprocess.run([require("shellcheck"), str(script)], capture_output=True, text=True)
    assert result.returncode != 0 and "SC2086" in result.stdout


def _sandbox_path(tmp_path: pathlib.Path, fakes: Mapping[str, str]) -> str:
    """A PATH with the few real tools the scripts need and fake ones given as script bodies."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "cat", "grep", "sed", "head", "sleep", "mktemp", "rm", "seq"):
        real = shutil.which(tool)
        assert real is not None
        (bin_dir / tool).symlink_to(real)
    for name, body in fakes.items():
        fake = bin_dir / name
        fake.write_text(f"#!{shutil.which('bash')}\n{body}\n")
        fake.chmod(0o755)
    return str(bin_dir)


def _run_script(script: str, path: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [shutil.which("bash") or "bash", str(ROOT / "kind" / script)],
        env={"PATH": path, "HOME": "/nonexistent", **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


OK = "exit 0"


@pytest.mark.parametrize(
    ("fakes", "env", "message"),
    [
        ({}, {}, "docker is not installed"),
        ({"docker": OK}, {}, "kind is not installed"),
        ({"docker": OK, "kind": OK}, {}, "kubectl is not installed"),
        ({"docker": OK, "kind": OK, "kubectl": OK}, {}, "helm is not installed"),
        (
            {"docker": OK, "kind": OK, "kubectl": OK, "helm": OK},
            {"GATEWAY": "nginx"},
            "GATEWAY must be kgateway",
        ),
        (
            {"docker": "exit 1", "kind": OK, "kubectl": OK, "helm": OK},
            {"GATEWAY": "envoy"},
            "daemon is not reachable",
        ),
    ],
    ids=["no-docker", "no-kind", "no-kubectl", "no-helm", "unknown-gateway", "docker-daemon-down"],
)
def test_up_sh_says_what_is_missing_and_changes_nothing(
    tmp_path: pathlib.Path, fakes: dict[str, str], env: dict[str, str], message: str
) -> None:
    calls = tmp_path / "calls"
    recorded = {name: f'echo "{name} $*" >> {calls}; {body}' for name, body in fakes.items()}
    result = _run_script("up.sh", _sandbox_path(tmp_path, recorded), **env)
    assert result.returncode == 1
    assert message in result.stderr
    made = calls.read_text().splitlines() if calls.exists() else []
    assert all(line in ("docker info",) for line in made), f"up.sh acted before checking its tools: {made}"


@pytest.mark.parametrize(
    ("clusters", "deleted"), [("", False), ("other\nlora-epp", True)], ids=["absent", "present"]
)
def test_down_sh_is_idempotent(tmp_path: pathlib.Path, clusters: str, deleted: bool) -> None:
    calls = tmp_path / "calls"
    kind = f'echo "kind $*" >> {calls}\nif [ "$1 $2" = "get clusters" ]; then printf "{clusters}\\n"; fi'
    result = _run_script("down.sh", _sandbox_path(tmp_path, {"kind": kind}))
    assert result.returncode == 0, result.stderr
    assert ("kind delete cluster --name lora-epp" in calls.read_text()) is deleted
    assert ("nothing to do" in result.stdout) is not deleted


def test_down_sh_without_kind_says_so(tmp_path: pathlib.Path) -> None:
    result = _run_script("down.sh", _sandbox_path(tmp_path, {}))
    assert result.returncode == 1 and "kind is not installed" in result.stderr


# -- the e2e suite without a cluster ------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_e2e_suite_skips_with_one_clear_line_when_no_cluster_answers(tmp_path: pathlib.Path) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "gone", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "nobody"}}],
                "users": [{"name": "nobody", "user": {}}],
                "current-context": "gone",
            }
        )
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "e2e",
            "-q",
            "-p",
            "no:cacheprovider",
            "--kubeconfig",
            str(kubeconfig),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert result.returncode == 0, result.stdout[-2000:]
    reasons = [line for line in result.stdout.splitlines() if line.startswith("e2e: skipped: ")]
    assert len(reasons) == 1, result.stdout[-2000:]
    assert f"127.0.0.1:{port}" in reasons[0] and "kind/up.sh" in reasons[0]
    assert re.search(r"\b\d+ skipped\b", result.stdout) and " passed" not in result.stdout


def test_the_active_active_overlay_runs_every_replica_with_peers_it_can_reach() -> None:
    kubectl = require("kubectl")
    built = subprocess.run(
        [kubectl, "kustomize", str(ROOT / "manifests" / "epp-active-active")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(built) if d}
    deployment = docs[("Deployment", "vllm-llama3-8b-epp")]
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    container = pod["spec"]["containers"][0]
    assert deployment["spec"]["replicas"] >= 2
    assert not any(a.startswith("--ha-enable-leader-election") for a in container["args"])
    [peers] = [a for a in container["args"] if a.startswith("--peer-selector=")]
    selector = dict(term.split("=") for term in peers.removeprefix("--peer-selector=").split(","))
    assert selector.items() <= labels.items(), "the replicas find every EPP pod"
    container_ports = {p["name"] for p in container["ports"]}
    assert "grpc-peers" in container_ports
    for kind in ("PodDisruptionBudget", "NetworkPolicy"):
        selector = next(d for (k, _), d in docs.items() if k == kind)["spec"]
        match = selector.get("selector", selector.get("podSelector"))["matchLabels"]
        assert match.items() <= labels.items(), f"the {kind} selects the EPP pods"
    policy = next(d for (k, _), d in docs.items() if k == "NetworkPolicy")["spec"]
    allowed = {p["port"] for rule in policy["ingress"] for p in rule["ports"]}
    assert allowed == container_ports, "the NetworkPolicy leaves no EPP port unreachable by mistake"
    [peer_rule] = [r for r in policy["ingress"] if any(p["port"] == "grpc-peers" for p in r["ports"])]
    assert peer_rule["from"][0]["podSelector"]["matchLabels"].items() <= labels.items()
    spread = pod["spec"]["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in spread} == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
