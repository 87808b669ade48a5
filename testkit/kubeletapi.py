"""The two parts of a kubelet that the API server and the control loops talk to, for `PodLauncher`:
readiness probes (which decide a Pod's Ready condition) and the container-log endpoint (which
`kubectl logs` and `read_namespaced_pod_log` reach through the API server).

kwok marks every Pod Ready the moment it runs and serves no logs (its own log endpoint needs a
container runtime's files). On a real node a Pod is Ready only while its readiness probe passes,
so a standby EPP replica (its probe says NOT_SERVING until it leads) is not Ready, is in no
headless Service's answer, and `kubectl get` shows it 0/1; and a Pod's log is what its process
wrote. These pieces give the local control plane the same.
"""

from __future__ import annotations

import http.server
import pathlib
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.tls import self_signed

# -- readiness probes ------------------------------------------------------------------------------


STARTING_INTERVAL_S = 0.25  # between tries until the first pass, for up to STARTING_FOR_S
STARTING_FOR_S = 30.0


@dataclass
class Prober:
    """One container's readiness probe, run on the kubelet's schedule: first after
    `initialDelaySeconds`, then every `periodSeconds`; Ready after `successThreshold` passes in a
    row, not Ready after `failureThreshold` failures in a row (and not Ready until the first pass).

    One difference: until the first pass (for at most `STARTING_FOR_S`) it tries every
    `STARTING_INTERVAL_S` rather than every period, so a new Pod is seen Ready as soon as its
    server answers, not up to a period later; that changes how soon, never whether.
    """

    probe: dict[str, Any]
    ip: str
    ports: dict[str, int]  # the container's named ports
    started: float = field(default_factory=time.monotonic)
    ready: bool = False
    _due: float = 0.0
    _passes: int = 0
    _failures: int = 0
    _passed: bool = False  # ever

    def __post_init__(self) -> None:
        self._due = self.started + float(self.probe.get("initialDelaySeconds", 0))

    def due(self, now: float) -> bool:
        return now >= self._due

    def run(self, now: float) -> bool:
        """Probe once (when due) and return whether the container is Ready now."""
        period = float(self.probe.get("periodSeconds", 10))
        starting = not self._passed and now - self.started < STARTING_FOR_S
        self._due = now + (min(period, STARTING_INTERVAL_S) if starting else period)
        if self.check():
            self._passed = True
            self._passes, self._failures = self._passes + 1, 0
            if self._passes >= int(self.probe.get("successThreshold", 1)):
                self.ready = True
        else:
            self._passes, self._failures = 0, self._failures + 1
            if self._failures >= int(self.probe.get("failureThreshold", 3)):
                self.ready = False
        return self.ready

    def check(self) -> bool:
        """One probe: httpGet (2xx/3xx), tcpSocket (connects) or grpc (SERVING), to the Pod IP."""
        timeout = float(self.probe.get("timeoutSeconds", 1))
        if "httpGet" in self.probe:
            spec = self.probe["httpGet"]
            scheme = str(spec.get("scheme", "HTTP")).lower()
            url = f"{scheme}://{self.ip}:{self._port(spec['port'])}{spec.get('path', '/')}"
            context = ssl._create_unverified_context() if scheme == "https" else None  # as a kubelet does
            try:
                with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
                    return 200 <= int(response.status) < 400
            except (urllib.error.URLError, OSError, ValueError):
                return False
        if "tcpSocket" in self.probe:
            try:
                with socket.create_connection(
                    (self.ip, self._port(self.probe["tcpSocket"]["port"])), timeout
                ):
                    return True
            except OSError:
                return False
        if "grpc" in self.probe:
            spec = self.probe["grpc"]
            with grpc.insecure_channel(f"{self.ip}:{int(spec['port'])}") as channel:
                request = health_pb2.HealthCheckRequest(service=spec.get("service", ""))
                try:
                    reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=timeout)
                except grpc.RpcError:
                    return False
            return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
        return True  # exec probes: nothing here can run them; the container counts as ready

    def _port(self, port: int | str) -> int:
        return self.ports[port] if isinstance(port, str) else int(port)


# -- the container-log endpoint --------------------------------------------------------------------


@dataclass(frozen=True)
class LogSource:
    """Where one Pod's container log is, and whether its process still writes to it."""

    path: pathlib.Path
    running: Callable[[], bool]


class LogServer:
    """`GET /containerLogs/NAMESPACE/POD/CONTAINER` over HTTPS, as a kubelet serves it to the API
    server (which, with no `--kubelet-certificate-authority`, does not verify the certificate).

    Supports `tailLines`, `limitBytes` and `follow`; `previous`, `timestamps` and the `since`
    parameters answer 400, as there is no earlier container and no per-line time recorded."""

    def __init__(self, find: Callable[[str, str], LogSource | None], directory: pathlib.Path) -> None:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(find))
        server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*_self_signed(directory))
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="kubelet-logs", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


_UNSUPPORTED = ("previous", "timestamps", "sinceSeconds", "sinceTime")
FOLLOW_POLL_S = 0.2


def _handler(find: Callable[[str, str], LogSource | None]) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            parts = url.path.strip("/").split("/")
            query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
            if len(parts) != 4 or parts[0] != "containerLogs":
                self._fail(404, "not found")
                return
            source = find(parts[1], parts[2])
            if source is None:
                self._fail(404, f"pod {parts[1]}/{parts[2]} is not running here")
                return
            unsupported = [name for name in _UNSUPPORTED if query.get(name, "false") not in ("", "false")]
            if unsupported:
                self._fail(400, f"{', '.join(unsupported)}: not kept by this node (no runtime records them)")
                return
            data = source.path.read_bytes() if source.path.exists() else b""
            if "tailLines" in query:
                tail = int(query["tailLines"])
                data = b"".join(data.splitlines(keepends=True)[-tail:]) if tail > 0 else b""
            limit = int(query["limitBytes"]) if "limitBytes" in query else None
            data = data[:limit] if limit is not None else data
            follow = query.get("follow") == "true" and limit is None
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            if not follow:
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            if follow:
                self._follow(source, source.path.stat().st_size if source.path.exists() else 0)

        def _follow(self, source: LogSource, offset: int) -> None:
            """Stream what the process writes until it exits or the client goes away."""
            while True:
                alive = source.running()
                with source.path.open("rb") as log:
                    log.seek(offset)
                    chunk = log.read()
                if chunk:
                    offset += len(chunk)
                    try:
                        self.wfile.write(chunk)
                        self.wfile.flush()
                    except OSError:
                        return
                if not alive:
                    return
                time.sleep(FOLLOW_POLL_S)

        def _fail(self, status: int, message: str) -> None:
            body = message.encode() + b"\n"
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the API server's own log has every call."""

    return Handler


def _self_signed(directory: pathlib.Path) -> tuple[str, str]:
    """A throw-away serving certificate for 127.0.0.1, written into `directory`."""
    pair = self_signed(common_name="kwok-node-kubelet", valid_days=1)
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(pair.cert_pem)
    key_path.write_bytes(pair.key_pem)
    return str(cert_path), str(key_path)
