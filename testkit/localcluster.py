"""A real Kubernetes control plane on loopback (`kind/local-cluster.sh`), as tests drive it.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok, built from their Go
modules by `kind/controlplane/install.sh`. `LocalCluster.start` runs the script's `up` into a
directory and `stop` its `down`; `kubectl` runs the real kubectl against it as cluster-admin,
or as a ServiceAccount with `as_token`.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from testkit.waiting import wait_until

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "kind" / "local-cluster.sh"
BIN = ROOT / ".controlplane" / "bin"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
INSTALL = "bash kind/controlplane/install.sh"
TOOLS_DIR = ROOT / ".tools" / "bin"


class ClusterError(RuntimeError):
    """The control plane did not start, or a command against it failed."""


def missing_binaries() -> list[str]:
    """The control-plane binaries not built yet."""
    return [name for name in BINARIES if not (BIN / name).exists()]


def kubectl_path() -> str | None:
    """kubectl as `.ci/k8s_tools.sh` pins it, else PATH's."""
    pinned = TOOLS_DIR / "kubectl"
    return str(pinned) if pinned.exists() else shutil.which("kubectl")


@dataclass
class LocalCluster:
    """A running control plane; `dir` holds its certificates, kubeconfigs, logs and etcd data."""

    dir: pathlib.Path
    kubectl_bin: str

    @property
    def kubeconfig(self) -> pathlib.Path:
        return self.dir / "kubeconfig"

    @property
    def ports(self) -> dict[str, int]:
        lines = (self.dir / "ports.env").read_text().split()
        return {key: int(value) for key, value in (line.split("=", 1) for line in lines)}

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['APISERVER_PORT']}"

    @property
    def ca_file(self) -> pathlib.Path:
        return self.dir / "pki" / "ca.crt"

    @classmethod
    def start(cls, directory: pathlib.Path, kubectl_bin: str) -> LocalCluster:
        result = subprocess.run(
            ["bash", str(SCRIPT), "up", str(directory)], capture_output=True, text=True, timeout=300
        )
        if result.returncode != 0:
            raise ClusterError(f"local-cluster.sh up failed:\n{result.stdout}\n{result.stderr}")
        return cls(directory, kubectl_bin)

    def stop(self) -> None:
        subprocess.run(["bash", str(SCRIPT), "down", str(self.dir)], capture_output=True, timeout=60)

    def log(self, component: str) -> str:
        return (self.dir / "logs" / f"{component}.log").read_text(errors="replace")

    def kubectl(
        self,
        *args: str,
        stdin: str | None = None,
        kubeconfig: pathlib.Path | None = None,
        check: bool = True,
        timeout_s: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against the cluster (cluster-admin unless `kubeconfig` says otherwise)."""
        command = [self.kubectl_bin, "--kubeconfig", str(kubeconfig or self.kubeconfig), *args]
        result = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=timeout_s)
        if check and result.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result

    def get(self, *args: str) -> Any:
        """`kubectl get ... -o json`, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, manifest: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return self.kubectl("apply", "-f", "-", *extra, stdin=manifest)

    def token_kubeconfig(
        self, namespace: str, service_account: str, path: pathlib.Path, *, duration: str = "1h"
    ) -> pathlib.Path:
        """A kubeconfig that authenticates as the ServiceAccount, with a token the API server
        issues for it (the TokenRequest API, as a projected token in a pod would be)."""
        token = self.kubectl(
            "create", "token", service_account, "-n", namespace, "--duration", duration
        ).stdout.strip()
        cluster = {"server": self.server, "certificate-authority": str(self.ca_file)}
        context = {"cluster": "local", "user": service_account, "namespace": namespace}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": cluster}],
            "users": [{"name": service_account, "user": {"token": token}}],
            "contexts": [{"name": "local", "context": context}],
            "current-context": "local",
        }
        path.write_text(json.dumps(config))
        return path

    def restart_apiserver(self, *, timeout_s: float = 90.0) -> None:
        """Stop kube-apiserver (SIGTERM, as a rollout does) and start it again with the same
        command line; returns once it is ready. Every open watch ends; its watch cache starts
        over from etcd's current revision."""
        pid_file = self.dir / "pids" / "kube-apiserver"
        pid = int(pid_file.read_text())
        command = [
            part.decode() for part in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if part
        ]
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: _exited(pid), "kube-apiserver to exit", within_s=timeout_s)
        with (self.dir / "logs" / "kube-apiserver.log").open("ab") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        pid_file.write_text(f"{process.pid}\n")
        wait_until(
            lambda: self.kubectl("get", "--raw", "/readyz", check=False).returncode == 0,
            "kube-apiserver ready again",
            within_s=timeout_s,
        )

    def etcd_compact(self) -> int:
        """Compact etcd to its current revision (what the API server does every few minutes);
        returns that revision. Watches from before it get 410 Gone."""
        base = f"http://127.0.0.1:{self.ports['ETCD_PORT']}/v3"
        revision = int(_post(f"{base}/kv/range", {"key": "AA=="})["header"]["revision"])
        _post(f"{base}/kv/compaction", {"revision": revision, "physical": True})
        return revision


def _exited(pid: int) -> bool:
    """Gone, or a zombie its parent has not reaped yet."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def _post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def dump(objects: Sequence[dict[str, Any]]) -> str:
    """Objects as one multi-document JSON stream kubectl reads."""
    return "\n".join(json.dumps(obj) for obj in objects)
