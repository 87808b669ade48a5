"""A real Kubernetes control plane on loopback (`kind/local-cluster.sh`), as tests drive it.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok, built from their Go
modules by `kind/controlplane/install.sh`. `LocalCluster.start` runs the script's `up` into a
directory and `stop` its `down`; `kubectl` runs the real kubectl against it as cluster-admin,
or as a ServiceAccount with `as_token`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
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

    @property
    def pod_cidr(self) -> str:
        """The range kwok gives Pod IPs from (loopback: a test serves a Pod on its IP)."""
        return (self.dir / "pod-cidr").read_text().strip()

    @classmethod
    def start(cls, directory: pathlib.Path, kubectl_bin: str) -> LocalCluster:
        """Start a control plane in `directory`, with a Pod range no other running cluster on this
        host has (127.1.0.0/16 for the first): Pod IPs are host addresses here, and two clusters
        handing out the same one would put two Pods' processes on one address."""
        directory.mkdir(parents=True, exist_ok=True)
        cidr = _reserve_pod_cidr(directory)
        result = subprocess.run(
            ["bash", str(SCRIPT), "up", str(directory)],
            capture_output=True,
            text=True,
            timeout=300,
            env=os.environ | {"POD_CIDR": cidr},
            # Its processes in a session of their own: a Ctrl-C in the terminal that started a
            # long-lived cluster (`python -m testkit.local_e2e`) reaches only the caller, which
            # stops what runs on the cluster before the cluster.
            start_new_session=True,
        )
        if result.returncode != 0:
            _release_pod_cidr(directory)
            raise ClusterError(f"local-cluster.sh up failed:\n{result.stdout}\n{result.stderr}")
        return cls(directory, kubectl_bin)

    def stop(self) -> None:
        subprocess.run(["bash", str(SCRIPT), "down", str(self.dir)], capture_output=True, timeout=60)
        _release_pod_cidr(self.dir)

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
        self,
        namespace: str,
        service_account: str,
        path: pathlib.Path,
        *,
        duration: str = "1h",
        bound_pod: tuple[str, str] | None = None,
    ) -> pathlib.Path:
        """A kubeconfig that authenticates as the ServiceAccount, with a token the API server
        issues for it (the TokenRequest API, as a projected token in a pod would be). With
        `bound_pod` (name, uid) the token is bound to that Pod, as a projected one is: it stops
        working when the Pod is gone."""
        bound = ["--bound-object-kind=Pod", f"--bound-object-name={bound_pod[0]}"] if bound_pod else []
        bound += [f"--bound-object-uid={bound_pod[1]}"] if bound_pod else []
        token = self.kubectl(
            "create", "token", service_account, "-n", namespace, "--duration", duration, *bound
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

    def restart_apiserver(
        self, *, timeout_s: float = 90.0, while_down: Callable[[], object] | None = None
    ) -> None:
        """Stop kube-apiserver (SIGTERM, as a rollout does) and start it again with the same
        command line; returns once it is ready. Every open watch ends; its watch cache starts
        over from etcd's current revision. `while_down` runs once it has exited (an outage)."""
        pid_file = self.dir / "pids" / "kube-apiserver"
        pid = int(pid_file.read_text())
        command = [
            part.decode() for part in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if part
        ]
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: _exited(pid), "kube-apiserver to exit", within_s=timeout_s)
        if while_down is not None:
            while_down()
        with (self.dir / "logs" / "kube-apiserver.log").open("ab") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        pid_file.write_text(f"{process.pid}\n")
        wait_until(
            lambda: self.kubectl("get", "--raw", "/readyz", check=False).returncode == 0,
            "kube-apiserver ready again",
            within_s=timeout_s,
        )

    def etcd_compact(self) -> int:
        """Compact etcd past everything written so far (what the API server does every few
        minutes); returns the revision. A scratch key outside the API server's prefix is written
        first, so the revision moves past any resourceVersion handed out before this call, and a
        watch resumed from one gets 410 Gone."""
        base = f"http://127.0.0.1:{self.ports['ETCD_PORT']}/v3"
        scratch = {"key": base64.b64encode(b"/lora-epp-test/compaction").decode(), "value": "AA=="}
        revision = int(_post(f"{base}/kv/put", scratch)["header"]["revision"])
        _post(f"{base}/kv/compaction", {"revision": revision, "physical": True})
        return revision


# One directory per /16 in use, holding the cluster directory that uses it.
POD_CIDRS = pathlib.Path(tempfile.gettempdir()) / "lora-epp-pod-cidrs"
RESERVATION_GRACE_S = 600.0  # a reservation younger than this is kept while its cluster starts


def _reserve_pod_cidr(directory: pathlib.Path) -> str:
    """The first 127.N.0.0/16 (N from 1) no running cluster holds; recorded in DIR/pod-cidr."""
    POD_CIDRS.mkdir(parents=True, exist_ok=True)
    for n in range(1, 255):
        reservation = POD_CIDRS / f"127.{n}"
        if reservation.exists() and _stale(reservation):
            shutil.rmtree(reservation, ignore_errors=True)
        try:
            reservation.mkdir()  # atomic: one cluster wins each range
        except FileExistsError:
            continue
        (reservation / "owner").write_text(str(directory.resolve()))
        cidr = f"127.{n}.0.0/16"
        (directory / "pod-cidr").write_text(cidr + "\n")
        return cidr
    raise ClusterError(f"every 127.N.0.0/16 is held by a running cluster (see {POD_CIDRS})")


def _stale(reservation: pathlib.Path) -> bool:
    """Its cluster is gone: its API server is not running, and it is not starting either."""
    try:
        owner = pathlib.Path((reservation / "owner").read_text())
        age = time.time() - reservation.stat().st_mtime
    except (FileNotFoundError, NotADirectoryError):
        return False  # being written or removed right now
    pid_file = owner / "pids" / "kube-apiserver"
    if not pid_file.exists():
        return age > RESERVATION_GRACE_S
    try:
        return _exited(int(pid_file.read_text()))
    except (ValueError, OSError):
        return True


def _release_pod_cidr(directory: pathlib.Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        n = (directory / "pod-cidr").read_text().split(".")[1]
        reservation = POD_CIDRS / f"127.{n}"
        if (reservation / "owner").read_text() == str(directory.resolve()):
            shutil.rmtree(reservation, ignore_errors=True)


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
