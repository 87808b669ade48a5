"""The chart (`charts/inferencepool`, with kind/values.yaml) rendered for a namespace of the local
control plane, and `epp serve` run with its Deployment's arguments: what the cluster tier's
RBAC and active-active tests deploy."""

from __future__ import annotations

import json
import pathlib
import subprocess
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from tests.deployment.tools import find

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "inferencepool"
KIND_VALUES = ROOT / "kind" / "values.yaml"
RELEASE = "rbac"
SERVED_GROUPS = frozenset(
    {
        "",
        "apps",
        "rbac.authorization.k8s.io",
        "policy",
        "inference.networking.k8s.io",
        "inference.networking.x-k8s.io",
    }
)


def render(namespace: str, **extra: Any) -> list[dict[str, Any]]:
    """The chart's objects for `namespace`; `extra` values merge into `inferenceExtension`."""
    helm = find("helm")
    if helm is None:
        pytest.skip("helm not found: run bash .ci/k8s_tools.sh")
    values: dict[str, Any] = yaml.safe_load(KIND_VALUES.read_text())
    values |= {"provider": {"name": "none"}, "gateway": {"create": False}, "httpRoute": {"enabled": False}}
    values["inferenceExtension"] |= extra
    result = subprocess.run(
        [helm, "template", RELEASE, str(CHART), "--namespace", namespace, "--values", "-"],
        input=json.dumps(values),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and not o["metadata"]["name"].endswith("-dashboard")]
    return found


@dataclass
class Chart:
    namespace: str
    objects: list[dict[str, Any]]

    @property
    def service_account(self) -> str:
        name: str = one(self.objects, "ServiceAccount")["metadata"]["name"]
        return name

    @property
    def role(self) -> dict[str, Any]:
        return one(self.objects, "Role")

    def applied(self) -> list[dict[str, Any]]:
        """What a test applies: every object of a group the local API server serves, but the
        Deployment and Services (the tests run `epp serve` as processes instead)."""
        return [
            o
            for o in self.objects
            if o["apiVersion"].rpartition("/")[0] in SERVED_GROUPS
            and o["kind"] not in ("Deployment", "Service")
        ]

    def serve_args(self, ports: list[int]) -> list[str]:
        """The Deployment's arguments for `epp serve`, on free loopback ports, the config file
        inlined from the ConfigMap."""
        container = one(self.objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
        args: list[str] = []
        for arg in container["args"]:
            arg = arg.replace("$(POD_NAMESPACE)", self.namespace)
            if arg.startswith("--config-file=/config/"):
                config = one(self.objects, "ConfigMap")["data"]
                arg = "--config-text=" + config[arg.removeprefix("--config-file=/config/")]
            if arg.startswith(("--grpc-port", "--grpc-health-port", "--metrics-port")):
                continue
            args.append(arg)
        grpc, health, metrics = ports
        return [*args, f"--grpc-port={grpc}", f"--grpc-health-port={health}", f"--metrics-port={metrics}"]
