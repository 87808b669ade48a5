"""A whole gateway on loopback: N `epp sim` pods, a pool file, `epp serve`, and Envoy.

Used by `epp demo`, the integration tests and `epp bench --live`. Each pod gets its own
127.x.y.N address and all share one port, as pods do in Kubernetes. Every process is a child
started here and stopped by `LocalStack.stop()` (also on Ctrl-C, via the context manager);
readiness is checked over the wire (sim `/health`, EPP gRPC health, Envoy `/ready`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import pathlib
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from epp import tls
from epp.clock import Clock, SystemClock
from epp.picker.datastore.types import FailureMode
from epp.picker.extproc.stream import BodyMode
from epp.picker.peers import peer_identity
from epp.tools.envoy.bootstrap import (
    EPP_CLUSTER,
    EnvoyOptions,
    EppEndpoint,
    HostPort,
    RoutingMode,
    build_bootstrap,
    render_yaml,
)
from epp.tools.envoy.process import EnvoyProcess

ADAPTER_LOADS_METRIC = "vllm_sim:lora_adapter_loads"  # counter; exposed as ..._total
POOL_NAME = "sim-pool"
POOL_NAMESPACE = "default"  # what `epp serve` assumes for a pool file without one


class StackError(RuntimeError):
    """A process of the stack did not start; the message carries its log tail."""


@dataclasses.dataclass(frozen=True, slots=True)
class SimOptions:
    """Flags every simulated pod gets (the demo's defaults make adapter swaps visible)."""

    base_model: str = "base"
    adapters: tuple[str, ...] = ()
    max_loras: int = 2
    max_cpu_loras: int | None = None
    max_num_seqs: int = 8
    time_to_first_token_s: float = 0.02
    inter_token_latency_s: float = 0.005
    lora_load_latency_s: float = 0.2
    extra_args: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class StackOptions:
    pods: int = 4
    sim: SimOptions = SimOptions()
    routing: RoutingMode = RoutingMode.EPP
    body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED
    failure_mode: FailureMode = FailureMode.FAIL_CLOSE
    process_responses: bool = (
        False  # response bodies through the EPP (`epp envoy-config --process-responses`)
    )
    access_log: bool = True  # Envoy's gRPC access log to the EPP
    # Endpoints in Envoy's EPP cluster, each with its own ports; one runs at start, the others
    # are free for a rolling restart (a new EPP comes up before the old one drains).
    epp_slots: int = 1
    # EPPs that serve at once (active-active, `epp serve --peers` between them), in the first
    # slots; more than `epp_slots` adds slots.
    epp_replicas: int = 1
    # With several replicas: the peer exchange over mutual TLS (a CA and a certificate made in the
    # workdir, as the chart makes them); False runs it plaintext (`--peer-insecure`).
    peer_tls: bool = True
    policy: str | None = None  # `epp serve --policy`; None = its default
    # How the EPP is started (benchmarks run another checkout's EPP beside this one's this way).
    epp_command: tuple[str, ...] = (sys.executable, "-m", "epp")
    refresh_metrics_interval: str = "50ms"
    # `epp serve --drain-period`: 0 stops a stack at once; rolling restarts under load set it
    # (None: the flag is not passed, for EPP builds that predate it).
    drain_period: str | None = "0s"
    extra_serve_args: tuple[str, ...] = ()
    extra_pool_yaml: str = ""  # more documents (InferenceModels, …) appended to the pool file
    keep_workdir: bool = False  # keep the pool file, configs and logs after stop()
    epp_tls: bool = False  # True: the EPP's default self-signed TLS on ext_proc
    start_epp: bool = True  # False: Envoy points at a closed EPP port (EPP-down tests)
    # Edits the generated Envoy bootstrap before it is written (tests add filters this way).
    envoy_bootstrap_hook: Callable[[dict[str, Any]], None] | None = None
    # An `epp sidecar` next to each sim (one port on every pod IP) and `epp serve
    # --adapter-state-port` pointing at it.
    sidecars: bool = False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct free ports: every socket stays bound until all are chosen, so the kernel
    cannot hand the same port out twice (separate `free_port` calls can)."""
    with contextlib.ExitStack() as held:
        sockets = []
        for _ in range(count):
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            sockets.append(sock)
        return [int(sock.getsockname()[1]) for sock in sockets]


def _port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def epp_ready(health_port: int) -> bool:
    """Whether `epp serve` answers SERVING for `readiness` on its gRPC health port."""
    with grpc.insecure_channel(f"127.0.0.1:{health_port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=1.0)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def pick_pod_addresses(count: int, rng: random.Random) -> tuple[list[str], int]:
    """`count` addresses in one random 127.x.y.0/24 and a port free on every one of them."""
    for _ in range(50):
        prefix = f"127.{rng.randint(1, 254)}.{rng.randint(1, 254)}"
        hosts = [f"{prefix}.{i}" for i in range(2, 2 + count)]
        port = _port_free_on_all(hosts, tries=1)
        if port is not None:
            return hosts, port
    raise StackError("no port free on every pod address")


def _port_free_on_all(hosts: Sequence[str], tries: int = 50) -> int | None:
    """A port the kernel gave on the first host that is also free on the others, if found."""
    for _ in range(tries):
        port = free_port(hosts[0])
        if all(_port_is_free(host, port) for host in hosts):
            return port
    return None


def write_peer_tls(
    directory: pathlib.Path, *, dns_name: str, ca: tls.KeyPair | None = None
) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    """A peer CA (made unless given) and a certificate it signs for `dns_name`, written as
    ca.crt, tls.crt and tls.key (a Kubernetes TLS Secret's names) in `directory`; returns the
    three paths in `--peer-tls-ca`, `--peer-tls-cert`, `--peer-tls-key` order."""
    ca = ca or tls.new_ca()
    leaf = tls.issue(ca, dns_names=[dns_name])
    directory.mkdir(parents=True, exist_ok=True)
    paths = (directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    for path, content in zip(paths, (ca.cert_pem, leaf.cert_pem, leaf.key_pem), strict=True):
        path.write_bytes(content)
    paths[2].chmod(0o600)
    return paths


def pool_yaml(
    pool_name: str,
    pods: Sequence[tuple[str, str]],
    port: int,
    failure_mode: FailureMode,
    *,
    ready: bool = True,
) -> str:
    """A pool file: one InferencePool and a Ready v1 Pod per (name, ip)."""
    mode = "FailOpen" if failure_mode is FailureMode.FAIL_OPEN else "FailClose"
    docs = [
        "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\n"
        f"metadata:\n  name: {pool_name}\nspec:\n  selector:\n    matchLabels:\n      app: sim\n"
        f"  targetPorts:\n  - number: {port}\n  endpointPickerRef:\n    name: {pool_name}-epp\n"
        f"    port:\n      number: 9002\n    failureMode: {mode}\n"
    ]
    ready_text = "True" if ready else "False"
    for name, ip in pods:
        docs.append(
            f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels:\n    app: sim\n"
            f'status:\n  podIP: {ip}\n  conditions:\n  - type: Ready\n    status: "{ready_text}"\n'
        )
    return "---\n".join(docs)


class Child:
    """One child process with its log file."""

    def __init__(self, name: str, command: list[str], log_path: pathlib.Path) -> None:
        self.name = name
        self.command = command
        self.log_path = log_path
        with log_path.open("wb") as log_file:
            self.process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, n_chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n_chars:]
        except FileNotFoundError:
            return ""

    def terminate(self) -> None:
        """SIGTERM, without waiting: `stop()` then waits (stopping many, signal them all first)."""
        if self.process.poll() is None:
            self.process.terminate()

    def stop(self, grace_s: float = 5.0) -> None:
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=grace_s)


@dataclasses.dataclass(slots=True)
class EppSlot:
    """One endpoint of Envoy's EPP cluster: the ports an `epp serve` there listens on."""

    grpc_port: int
    health_port: int
    metrics_port: int
    peer_port: int = 0  # the peer exchange, with several replicas
    process: Child | None = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.alive()


@dataclasses.dataclass(frozen=True, slots=True)
class Pod:
    name: str
    ip: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{self.port}"


class LocalStack:
    """Start with `start()` (or `with LocalStack(...) as stack:`); `gateway_url` is Envoy's listener."""

    def __init__(self, options: StackOptions, *, seed: int = 0, clock: Clock | None = None) -> None:
        self.options = options
        self._clock = clock or SystemClock()
        self._rng = random.Random(seed)
        self.workdir = pathlib.Path(tempfile.mkdtemp(prefix="epp-localstack-"))
        self.pods: list[Pod] = []
        self._sims: dict[str, Child] = {}
        self._sidecars: dict[str, Child] = {}
        self.sidecar_port = 0
        self._sidecar_starts: dict[str, int] = {}
        self._slots: list[EppSlot] = []
        self._current = 0  # the slot of the EPP started last
        self._epp_starts = 0
        self.envoy: EnvoyProcess | None = None
        self.gateway_url = ""
        self.pool_file = self.workdir / "pool.yaml"

    @property
    def epp_grpc_port(self) -> int:
        return self._slots[self._current].grpc_port if self._slots else 0

    @property
    def epp_health_port(self) -> int:
        return self._slots[self._current].health_port if self._slots else 0

    @property
    def epp_metrics_port(self) -> int:
        return self._slots[self._current].metrics_port if self._slots else 0

    @property
    def epp_pid(self) -> int | None:
        """The process id of the EPP started last, while it runs."""
        slot = self.epp_slot
        return slot.process.process.pid if slot is not None and slot.process is not None else None

    @property
    def epp_slots(self) -> tuple[EppSlot, ...]:
        """Every endpoint of Envoy's EPP cluster (`StackOptions.epp_slots`), running or not."""
        return tuple(self._slots)

    @property
    def epp_slot(self) -> EppSlot | None:
        """The slot of the EPP started last; None before `start()`."""
        return self._slots[self._current] if self._slots else None

    def sim_process(self, pod_name: str) -> Child:
        """The `epp sim` process serving pod `pod_name`."""
        return self._sims[pod_name]

    def sidecar_process(self, pod_name: str) -> Child:
        """The adapter-state sidecar of pod `pod_name` started last."""
        return self._sidecars[pod_name]

    # ----- lifecycle -----

    def start(self, *, timeout_s: float = 60.0) -> None:
        try:
            self._start(timeout_s)
        except BaseException:
            self._stop_processes()  # the workdir (logs) stays until stop()
            raise

    def _start(self, timeout_s: float) -> None:
        opts = self.options
        hosts, port = pick_pod_addresses(opts.pods, self._rng)
        self.pods = [Pod(f"sim-{i}", host, port) for i, host in enumerate(hosts)]
        for pod in self.pods:
            self._start_sim(pod)
        if opts.sidecars:
            sidecar_port = _port_free_on_all(hosts)
            if sidecar_port is None:
                raise StackError("no sidecar port free on every pod address")
            self.sidecar_port = sidecar_port
            for pod in self.pods:
                self.start_sidecar(pod.name)
        self.pool_file.write_text(self.pool_file_text())
        slots = max(1, opts.epp_slots, opts.epp_replicas)
        ports = free_ports(4 * slots)  # every replica's four ports, none shared
        self._slots = [
            EppSlot(
                grpc_port=ports[i],
                health_port=ports[i + 1],
                metrics_port=ports[i + 2],
                peer_port=ports[i + 3],
            )
            for i in range(0, 4 * slots, 4)
        ]
        serving = self._slots[: max(1, opts.epp_replicas)]
        if opts.routing is RoutingMode.EPP and opts.start_epp:
            for slot in serving:
                self._start_epp(slot)
        self._start_envoy()
        deadline = self._clock.now() + timeout_s
        for pod in self.pods:
            self._wait(functools.partial(self._http_ok, f"{pod.url}/health"), self._sims[pod.name], deadline)
        for name, sidecar in self._sidecars.items():
            self._wait(functools.partial(self.sidecar_listening, name), sidecar, deadline)
        started = [slot for slot in serving if slot.process is not None]
        for slot in started:
            assert slot.process is not None
            self._wait(functools.partial(epp_ready, slot.health_port), slot.process, deadline)
        assert self.envoy is not None
        self.envoy.start(ready_timeout_s=max(1.0, deadline - self._clock.now()))
        for slot in started:
            assert slot.process is not None
            self._wait(functools.partial(self.envoy_sees_epp, slot, "healthy"), slot.process, deadline)

    def _start_sim(self, pod: Pod) -> None:
        sim = self.options.sim
        command = [
            sys.executable, "-m", "epp", "sim",
            "--host", pod.ip, "--port", str(pod.port), "--pod-name", pod.name,
            "--served-model-name", sim.base_model,
            "--max-loras", str(sim.max_loras),
            "--max-num-seqs", str(sim.max_num_seqs),
            "--time-to-first-token", str(sim.time_to_first_token_s),
            "--inter-token-latency", str(sim.inter_token_latency_s),
            "--lora-load-latency", str(sim.lora_load_latency_s),
        ]  # fmt: skip
        if sim.max_cpu_loras is not None:
            command += ["--max-cpu-loras", str(sim.max_cpu_loras)]
        if sim.adapters:
            command += ["--lora-modules", *(f"{name}=/adapters/{name}" for name in sim.adapters)]
        command += list(sim.extra_args)
        self._sims[pod.name] = Child(pod.name, command, self.workdir / f"{pod.name}.log")

    def _start_epp(self, slot: EppSlot) -> None:
        opts = self.options
        command = [
            *opts.epp_command, "serve",
            "--pool-file", str(self.pool_file),
            "--host", "127.0.0.1",
            "--grpc-port", str(slot.grpc_port),
            "--grpc-health-port", str(slot.health_port),
            "--metrics-port", str(slot.metrics_port),
            f"--secure-serving={str(opts.epp_tls).lower()}",
            "--refresh-metrics-interval", opts.refresh_metrics_interval,
        ]  # fmt: skip
        if opts.drain_period is not None:
            command += ["--drain-period", opts.drain_period]
        if opts.policy is not None:
            command += ["--policy", opts.policy]
        if self.sidecar_port:
            command += ["--adapter-state-port", str(self.sidecar_port)]
        if opts.epp_replicas > 1:
            peers = ",".join(f"127.0.0.1:{s.peer_port}" for s in self._slots)
            command += ["--peers", peers, "--peer-port", str(slot.peer_port), "--peer-interval", "50ms"]
            command += self._peer_tls_args()
        command += list(opts.extra_serve_args)
        self._epp_starts += 1
        log_name = "epp.log" if self._epp_starts == 1 else f"epp-{self._epp_starts}.log"
        slot.process = Child("epp", command, self.workdir / log_name)
        self._current = self._slots.index(slot)

    def _peer_tls_args(self) -> list[str]:
        """`--peer-tls-*` for one CA and certificate every replica of this stack shares (made on
        first use), or `--peer-insecure`."""
        if not self.options.peer_tls:
            return ["--peer-insecure"]
        directory = self.workdir / "peer-tls"
        if not directory.exists():
            write_peer_tls(directory, dns_name=peer_identity(POOL_NAMESPACE, POOL_NAME))
        return [
            "--pool-name", POOL_NAME,
            "--peer-tls-ca", str(directory / "ca.crt"),
            "--peer-tls-cert", str(directory / "tls.crt"),
            "--peer-tls-key", str(directory / "tls.key"),
        ]  # fmt: skip

    def _start_envoy(self) -> None:
        opts = self.options
        listen_port = free_port()
        first, *more = self._slots
        envoy_options = EnvoyOptions(
            listen_address="127.0.0.1",
            listen_port=listen_port,
            mode=opts.routing,
            epp=HostPort("127.0.0.1", first.grpc_port),
            epp_health_port=first.health_port,
            more_epps=tuple(EppEndpoint(HostPort("127.0.0.1", s.grpc_port), s.health_port) for s in more),
            epp_tls=opts.epp_tls,
            body_mode=opts.body_mode,
            process_responses=opts.process_responses,
            access_log=opts.access_log,
            failure_mode=opts.failure_mode,
            pool_endpoints=tuple(HostPort(p.ip, p.port) for p in self.pods),
        )
        bootstrap = build_bootstrap(envoy_options)
        if opts.envoy_bootstrap_hook is not None:
            opts.envoy_bootstrap_hook(bootstrap)
        config_path = self.workdir / "envoy.yaml"
        config_path.write_text(render_yaml(bootstrap))
        self.envoy = EnvoyProcess(config_path, log_path=self.workdir / "envoy.log")
        self.gateway_url = f"http://127.0.0.1:{listen_port}"

    def stop(self) -> None:
        """Stop every process this stack started and remove its files; safe to call twice."""
        self._stop_processes()
        if not self.options.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _stop_processes(self) -> None:
        # Envoy first (no new requests), then every other child signalled at once and waited for:
        # each takes a moment to exit, and one after the other those moments add up.
        if self.envoy is not None:
            self.envoy.stop()
        children = [slot.process for slot in self._slots if slot.process is not None]
        children += [*self._sidecars.values(), *self._sims.values()]
        for child in children:
            child.terminate()
        for child in children:
            child.stop()

    def __enter__(self) -> LocalStack:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ----- processes -----

    def start_sidecar(self, name: str) -> None:
        """(Re)start the adapter-state sidecar of pod `name` on `sidecar_port`."""
        pod = next(p for p in self.pods if p.name == name)
        old = self._sidecars.get(name)
        if old is not None:
            old.stop()
        command = [
            sys.executable, "-m", "epp", "sidecar",
            "--model-server", pod.url,
            "--host", pod.ip, "--port", str(self.sidecar_port),
            "--poll-interval", "50ms", "--log-level", "INFO",
        ]  # fmt: skip
        starts = self._sidecar_starts.get(name, 0) + 1
        self._sidecar_starts[name] = starts
        log_path = self.workdir / f"{name}-sidecar-{starts}.log"
        self._sidecars[name] = Child(f"{name}-sidecar", command, log_path)

    def sidecar_listening(self, name: str) -> bool:
        pod = next(p for p in self.pods if p.name == name)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            return sock.connect_ex((pod.ip, self.sidecar_port)) == 0

    def start_epp_slot(self, slot: EppSlot, *, timeout_s: float = 30.0) -> None:
        """Start an EPP in `slot` (one of `epp_slots`, not running) and make it the current one.

        Returns once it serves and Envoy's health checks see it, so that what follows can rely
        on it (restarts and rolling restarts of the EPP are built on this).
        """
        self._start_epp(slot)
        assert slot.process is not None
        deadline = self._clock.now() + timeout_s
        self._wait(functools.partial(epp_ready, slot.health_port), slot.process, deadline)
        self._wait(functools.partial(self.envoy_sees_epp, slot, "healthy"), slot.process, deadline)

    # ----- observation -----

    def adapter_loads(self) -> dict[str, float]:
        """`vllm_sim:lora_adapter_loads_total` summed over live pods, by adapter."""
        totals: dict[str, float] = {}
        for pod in self.pods:
            if not self._sims[pod.name].alive():
                continue
            text = self._http_text(f"{pod.url}/metrics")
            for family in text_string_to_metric_families(text):
                if family.name != ADAPTER_LOADS_METRIC:
                    continue
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        adapter = sample.labels.get("adapter", "")
                        totals[adapter] = totals.get(adapter, 0.0) + sample.value
        return totals

    def pool_file_text(self, *, ready: bool = True) -> str:
        """This stack's pool file, with every pod Ready or not."""
        text = pool_yaml(
            POOL_NAME,
            [(p.name, p.ip) for p in self.pods],
            self.pods[0].port,
            self.options.failure_mode,
            ready=ready,
        )
        if self.options.extra_pool_yaml:
            text += "---\n" + self.options.extra_pool_yaml
        return text

    # ----- readiness helpers -----

    def _wait(self, check: Callable[[], bool], child: Child, deadline: float) -> None:
        while self._clock.now() < deadline:
            if not child.alive():
                raise StackError(f"{child.name} exited with {child.process.returncode}:\n{child.log_tail()}")
            if check():
                return
            time.sleep(0.05)
        raise StackError(f"{child.name} not ready in time:\n{child.log_tail()}")

    @staticmethod
    def _http_ok(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    @staticmethod
    def _http_text(url: str) -> str:
        with urllib.request.urlopen(url, timeout=5.0) as response:
            body: bytes = response.read()
        return body.decode()

    def envoy_sees_epp(self, slot: EppSlot, health: str) -> bool:
        """Whether Envoy's health checks see the EPP endpoint of `slot` as `health`."""
        if self.envoy is None:
            return False
        return self.envoy.host_health(EPP_CLUSTER, f"127.0.0.1:{slot.grpc_port}") == health
