"""What a kubelet would run for kwok's Pods: each Running Pod's container, as a local process on
the Pod's IP.

kwok marks a Pod Running and Ready and gives it an IP from 127.1.0.0/16, but runs nothing. For
Pods of our own image (`epp ...`), `PodLauncher` starts the first container's arguments with this
interpreter (`python -m epp ARGS`), `--host=0.0.0.0` bound to the Pod's IP and `$(VAR)` expanded
from the container's field-ref env (the Pod's name, namespace and IP), and stops it when the Pod
goes away or stops running. So `kubectl scale` and `kubectl delete pod` change what answers on
the Pod IPs, as they would on a cluster with a container runtime.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any

from testkit.localcluster import LocalCluster

SYNC_INTERVAL_S = 0.2
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_FIELDS = {"metadata.name", "metadata.namespace", "status.podIP"}


@dataclass
class _Running:
    ip: str
    process: subprocess.Popen[bytes]


class PodLauncher:
    """Keeps one process per Running Pod matching `selector` in `namespace` (a background thread)."""

    def __init__(self, cluster: LocalCluster, namespace: str, selector: str, workdir: pathlib.Path) -> None:
        self._cluster = cluster
        self._namespace = namespace
        self._selector = selector
        self._workdir = workdir
        self._running: dict[str, _Running] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pod-launcher", daemon=True)

    def __enter__(self) -> PodLauncher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        with self._lock:
            for name in list(self._running):
                self._end(name)

    def running(self) -> dict[str, str]:
        """Pod name -> IP of every Pod whose process runs now."""
        with self._lock:
            return {name: r.ip for name, r in self._running.items() if r.process.poll() is None}

    def _loop(self) -> None:
        while not self._stop.wait(SYNC_INTERVAL_S):
            try:
                pods = self._cluster.get("pods", "-n", self._namespace, "-l", self._selector)["items"]
            except Exception:  # an API hiccup: try again next round, as a kubelet does
                continue
            with self._lock:
                self._sync(pods)

    def _sync(self, pods: list[dict[str, Any]]) -> None:
        wanted = {
            pod["metadata"]["name"]: pod
            for pod in pods
            if pod.get("status", {}).get("phase") == "Running"
            and pod["status"].get("podIP")
            and not pod["metadata"].get("deletionTimestamp")
        }
        for name in [n for n in self._running if n not in wanted]:
            self._end(name)
        for name, pod in wanted.items():
            if name not in self._running:
                self._start(pod)

    def _start(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        ip = pod["status"]["podIP"]
        container = pod["spec"]["containers"][0]
        values = {
            "metadata.name": name,
            "metadata.namespace": pod["metadata"]["namespace"],
            "status.podIP": ip,
        }
        env = {
            e["name"]: values[e["valueFrom"]["fieldRef"]["fieldPath"]]
            for e in container.get("env", [])
            if e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") in _FIELDS
        }
        args = [_VAR.sub(lambda m: env.get(m.group(1), m.group(0)), arg) for arg in container["args"]]
        args = [f"--host={ip}" if arg == "--host=0.0.0.0" else arg for arg in args]
        log = (self._workdir / f"{name}.log").open("wb")
        process = subprocess.Popen([sys.executable, "-m", "epp", *args], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self._running[name] = _Running(ip, process)

    def _end(self, name: str) -> None:
        process = self._running.pop(name).process
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
