"""What a kubelet would run for kwok's Pods: each Running Pod's container, as a local process on
the Pod's IP.

kwok marks a Pod Running and Ready and gives it an IP from 127.1.0.0/16, but runs nothing.
`PodLauncher` starts the first container of each Running Pod matching its selector, and stops it
when the Pod goes away or stops running. So `kubectl scale` and `kubectl delete pod` change what
answers on the Pod IPs, as they would on a cluster with a container runtime. What it runs:

- our image (`lora-epp:...`): `python -m epp ARGS` with this interpreter; the Envoy image
  (`envoyproxy/envoy:...`): the Envoy binary (`epp.tools.envoy.process.find_envoy`) with the
  container's arguments. Pods of other images are left alone;
- `$(VAR)` in the arguments expanded, and the container's `env` set, from literal values and the
  field refs a kubelet resolves (the Pod's name, namespace, IP, node, ServiceAccount);
- bound to the Pod IP: `--host=0.0.0.0` becomes `--host=POD_IP`, and `epp serve` / `epp sim`
  without `--host` get it; an Envoy config's listeners and admin on `0.0.0.0` / `127.0.0.1` move to
  the Pod IP (the Pod's own loopback would be private to it; loopback here is shared);
- ConfigMap volumes written into a directory of the Pod's, and arguments that name a file under a
  mount path pointed there;
- the ServiceAccount's credentials: a token the API server issues for it, bound to the Pod (so it
  stops working when the Pod is gone, as a projected token does), in a kubeconfig named by
  `KUBECONFIG` (a process here cannot read `/var/run/secrets`); none when
  `automountServiceAccountToken: false`. Nothing else of the caller's kubeconfig leaks in;
- the Pod's name as host name (a UTS namespace, via `unshare`, where the kernel lets an unprivileged
  user make one: `hostname_isolation()`), which is what `epp serve` puts in its Lease as holder;
- readiness: the container's readiness probe (httpGet, tcpSocket, grpc) decides the Pod's Ready
  condition, written to its status when the probe's verdict changes (not Ready until it passes,
  as on a node; kwok alone would mark a Pod Ready before anything listens). A condition someone
  else writes stays until the verdict changes again.

With `kubelet=True` it also does what a kubelet does beyond starting, probing and stopping, which
the plain mode leaves to kwok (which deletes a deleted Pod at once, while its process is told to
stop):

- termination: a finalizer holds each Pod it runs, so a deleted Pod stays Terminating until its
  process has ended, as on a node: the `preStop` sleep (within the grace period), SIGTERM, SIGKILL
  when the grace period (the deletion's, at least 1 s; the kubelet's minimum of 2 s after
  SIGTERM) runs out, then the finalizer is removed and the Pod deleted;
- logs: `kubectl logs` / `read_namespaced_pod_log` answered from what the process wrote
  (`testkit.kubeletapi.LogServer`, its port set as the node's kubelet endpoint);
- `dns`: the cluster DNS stand-in (`testkit.clusterdns`) that Envoy's resolver uses, so its
  `STRICT_DNS` clusters on `*.svc.cluster.local` names resolve as in a cluster.

Not done: liveness probes and restarts, `exec` hooks and probes, Secret and projected volumes.
One `kubelet=True` launcher per cluster at a time: the node has one kubelet endpoint.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
import pathlib
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import yaml
from kubernetes import client, config, watch

from epp.tools.envoy.process import find_envoy
from testkit.kubeletapi import LogServer, LogSource, Prober
from testkit.localcluster import LocalCluster

SYNC_INTERVAL_S = 0.2
FINALIZER = "lora-epp.test/pod-launcher"
MIN_KILL_GRACE_S = 2.0  # the kubelet's minimum between SIGTERM and SIGKILL
API_TIMEOUT_S = 10  # every call: a stopped API server never holds the launcher up
WATCH_WINDOW_S = 5  # each watch call ends after this; the next resumes from its resourceVersion
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_STRATEGIC = "application/strategic-merge-patch+json"
_CARES = "type.googleapis.com/envoy.extensions.network.dns_resolver.cares.v3.CaresDnsResolverConfig"


EPP_IMAGE, ENVOY_IMAGE = "lora-epp", "envoy"  # image names (any registry, tag or digest)


def _image_kind(image: str) -> str | None:
    """`lora-epp` for our image, `envoy` for Envoy's, None for anything else."""
    name = image.rsplit("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
    return name if name in (EPP_IMAGE, ENVOY_IMAGE) else None


@functools.cache
def hostname_isolation() -> list[str]:
    """The command prefix that runs a program in a UTS namespace of its own (an unprivileged user
    namespace), or [] where the kernel refuses one (then processes keep this host's name)."""
    probe = [sys.executable, "-c", "import socket; socket.sethostname('probe')"]
    for mapping in ("--map-current-user", "--map-root-user"):
        prefix = ["unshare", "--user", mapping, "--uts", "--"]
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if subprocess.run([*prefix, *probe], capture_output=True, timeout=10).returncode == 0:
                return prefix
    return []


# Run inside the new UTS namespace: set the host name, then become the container's program.
_SET_HOSTNAME = "import os, socket, sys; socket.sethostname(sys.argv[1]); os.execv(sys.argv[2], sys.argv[2:])"


@dataclass
class _Stopping:
    sigterm_at: float
    kill_at: float
    confirm_delete: bool  # the Pod is being deleted: confirm it (grace 0) once the process is gone
    sent_sigterm: bool = False


@dataclass
class _Running:
    ip: str
    process: subprocess.Popen[bytes]
    namespace: str
    uid: str
    log: pathlib.Path
    prober: Prober | None = None
    ready: bool | None = None  # what was last written to the Pod's status
    stopping: _Stopping | None = None
    pod: dict[str, Any] = field(default_factory=dict)


class PodLauncher:
    """Keeps one process per Running Pod matching `selector` in `namespace` (background threads);
    an empty selector takes every Pod of the namespace."""

    def __init__(
        self,
        cluster: LocalCluster,
        namespace: str,
        selector: str,
        workdir: pathlib.Path,
        *,
        kubelet: bool = False,
        dns: tuple[str, int] | None = None,
    ) -> None:
        self._cluster = cluster
        self._namespace = namespace
        self._selector = selector
        self._workdir = workdir
        self._kubelet = kubelet
        self._dns = dns
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
        self._core = client.CoreV1Api(api)
        self._pods: dict[str, dict[str, Any]] = {}  # what the watch saw last, by name
        self._deletion_grace: dict[str, int] = {}  # the grace of the first deletion seen, by Pod uid
        self._running: dict[str, _Running] = {}
        self._logs: dict[str, _Running] = {}  # every Pod run so far (its log stays readable)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher: watch.Watch | None = None
        self._threads = [
            threading.Thread(target=self._watch_loop, name="pod-launcher-watch", daemon=True),
            threading.Thread(target=self._loop, name="pod-launcher", daemon=True),
        ]
        self._log_server: LogServer | None = None
        self._node_ports: dict[str, int] = {}  # node → its kubelet port before we set ours

    def __enter__(self) -> PodLauncher:
        self._workdir.mkdir(parents=True, exist_ok=True)
        if self._kubelet:
            self._log_server = LogServer(self._log_source, self._workdir / "kubelet-tls")
            self._log_server.start()
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.stop()  # type: ignore[no-untyped-call]
        for thread in self._threads:
            thread.join(timeout=10)
        with self._lock:
            # All at once: SIGTERM to every process, SIGKILL to those still there after 10 s.
            for running in self._running.values():
                running.process.terminate()
            deadline = time.monotonic() + 10
            for running in self._running.values():
                try:
                    running.process.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    running.process.kill()
                    running.process.wait()
            self._running.clear()
        if self._kubelet:
            self._release_all()
        if self._log_server is not None:
            for node, port in self._node_ports.items():
                with contextlib.suppress(client.ApiException):
                    self._set_kubelet_port(node, port)
            self._log_server.stop()

    def running(self) -> dict[str, str]:
        """Pod name -> IP of every Pod whose process runs now (and is not being stopped)."""
        with self._lock:
            return {
                name: r.ip
                for name, r in self._running.items()
                if r.process.poll() is None and r.stopping is None
            }

    # -- what the API server says -----------------------------------------------------------------

    def _watch_loop(self) -> None:
        """List, then watch, the Pods: every change is seen, including a deletion's grace period
        before kwok shortens it to 0 (a poll would mostly see only kwok's)."""
        while not self._stop.is_set():
            try:
                listed = self._list()
                with self._lock:
                    self._pods = {}
                    for pod in listed["items"]:
                        self._saw(pod)
                version = listed["metadata"]["resourceVersion"]
                while not self._stop.is_set():
                    self._watcher = watch.Watch()  # type: ignore[no-untyped-call]
                    for event in self._watcher.stream(  # type: ignore[no-untyped-call]
                        self._core.list_namespaced_pod,
                        self._namespace,
                        label_selector=self._selector,
                        resource_version=version,
                        timeout_seconds=WATCH_WINDOW_S,
                        _request_timeout=WATCH_WINDOW_S + 5,
                    ):
                        if event["type"] == "ERROR":
                            raise RuntimeError(f"watch: {event['raw_object']}")  # 410 Gone: list again
                        pod = event["raw_object"]
                        version = pod["metadata"]["resourceVersion"]
                        with self._lock:
                            if event["type"] == "DELETED":
                                self._pods.pop(pod["metadata"]["name"], None)
                            else:
                                self._saw(pod)
            except Exception:  # an API hiccup: list again shortly, as a kubelet does
                self._stop.wait(0.5)

    def _list(self) -> Any:
        """The Pods as the API serves them (JSON, as a watch's `raw_object`)."""
        response: Any = self._core.list_namespaced_pod(
            self._namespace,
            label_selector=self._selector,
            _preload_content=False,
            _request_timeout=API_TIMEOUT_S,
        )
        return json.loads(response.data)

    def _saw(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        self._pods[meta["name"]] = pod
        if meta.get("deletionTimestamp") and meta["uid"] not in self._deletion_grace:
            self._deletion_grace[meta["uid"]] = int(meta.get("deletionGracePeriodSeconds") or 0)

    # -- the kubelet's loop -------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(SYNC_INTERVAL_S):
            with self._lock:
                pods = dict(self._pods)
                try:
                    self._sync(pods)
                except Exception:  # an API hiccup: try again next round, as a kubelet does
                    continue
            self._probe()

    def _sync(self, pods: dict[str, dict[str, Any]]) -> None:
        wanted = {
            name: pod
            for name, pod in pods.items()
            if pod.get("status", {}).get("phase") == "Running"
            and pod["status"].get("podIP")
            and not pod["metadata"].get("deletionTimestamp")
            and _image_kind(pod["spec"]["containers"][0].get("image", "")) is not None
        }
        for name, running in list(self._running.items()):
            if name in wanted:
                running.pod = wanted[name]
            elif not self._kubelet:
                self._end(name)
            else:
                self._stopping(name, running, pods.get(name))
        for name, pod in wanted.items():
            if name not in self._running:
                # One Pod that cannot start (its ConfigMap missing, an API hiccup) holds up no
                # other; it is tried again next round, as a kubelet retries.
                with contextlib.suppress(Exception):
                    self._start(pod)
        for name, pod in pods.items():
            # Claimed, then deleted before its process started (or after it ended): let it go.
            if (
                self._kubelet
                and name not in self._running
                and _claimed(pod)
                and pod["metadata"].get("deletionTimestamp")
            ):
                self._release(name, pod["metadata"]["namespace"], pod["metadata"]["uid"], delete=True)

    def _start(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        name, ip = meta["name"], pod["status"]["podIP"]
        container = spec["containers"][0]
        kind = _image_kind(container["image"])
        poddir = self._workdir / "pods" / name
        poddir.mkdir(parents=True, exist_ok=True)
        if self._kubelet:
            self._claim(pod)
        pod_env = _container_env(pod, container)
        env = self._credentials(pod, poddir) | pod_env
        args = [_expand(arg, pod_env) for arg in container.get("args", [])]
        args = self._mount(pod, container, args, poddir)
        if kind == ENVOY_IMAGE:
            command = [str(find_envoy()), *self._envoy_args(args, ip, poddir)]
        else:
            command = [sys.executable, "-m", "epp", *_bind(args, ip)]
        isolation = hostname_isolation()
        if isolation:
            command = [*isolation, sys.executable, "-c", _SET_HOSTNAME, name, *command]
        log_path = self._workdir / f"{name}.log"
        with log_path.open("wb") as log:
            # A session of its own, as a container is apart from whoever started the node: a Ctrl-C
            # in the terminal reaches the launcher, which stops the Pods in order.
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        running = _Running(ip, process, meta["namespace"], meta["uid"], log_path, pod=pod)
        if container.get("readinessProbe"):
            # Not Ready until the probe passes (kwok said Ready before anything ran): the first
            # probe is due now, and its result is written whatever it is.
            ports = {p["name"]: int(p["containerPort"]) for p in container.get("ports", []) if p.get("name")}
            running.prober = Prober(container["readinessProbe"], ip, ports)
        self._running[name] = running
        self._logs[name] = running

    def _credentials(self, pod: dict[str, Any], poddir: pathlib.Path) -> dict[str, str]:
        """This process's environment (for the interpreter), less any kubeconfig of the caller's,
        plus the ServiceAccount's own credentials unless the Pod opts out of them."""
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        if pod["spec"].get("automountServiceAccountToken") is not False:
            kubeconfig = self._cluster.token_kubeconfig(
                pod["metadata"]["namespace"],
                pod["spec"].get("serviceAccountName", "default"),
                poddir / "kubeconfig",
                duration="24h",
                bound_pod=(pod["metadata"]["name"], pod["metadata"]["uid"]),
            )
            env["KUBECONFIG"] = str(kubeconfig)
        return env

    def _mount(
        self, pod: dict[str, Any], container: dict[str, Any], args: list[str], poddir: pathlib.Path
    ) -> list[str]:
        """ConfigMap volumes as files under the Pod's directory; arguments naming a path under
        their mount path point there instead."""
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        for mount in container.get("volumeMounts", []):
            source = volumes.get(mount["name"], {}).get("configMap")
            if source is None:
                continue
            data = (
                self._core.read_namespaced_config_map(
                    source["name"], pod["metadata"]["namespace"], _request_timeout=API_TIMEOUT_S
                ).data
                or {}
            )
            local = poddir / "volumes" / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            for key, text in data.items():
                (local / key).write_text(text)
            prefix = mount["mountPath"].rstrip("/") + "/"
            args = [_repath(arg, prefix, str(local) + "/") for arg in args]
        return args

    def _envoy_args(self, args: list[str], ip: str, poddir: pathlib.Path) -> list[str]:
        """Envoy's arguments, its config moved onto the Pod IP and the cluster DNS."""
        out = list(args)
        for i, arg in enumerate(out[:-1]):
            if arg in ("-c", "--config-path"):
                bootstrap = yaml.safe_load(pathlib.Path(out[i + 1]).read_text())
                moved = poddir / "envoy.yaml"
                moved.write_text(yaml.safe_dump(_envoy_on_pod(bootstrap, ip, self._dns), sort_keys=False))
                out[i + 1] = str(moved)
        return out

    # -- termination ----------------------------------------------------------------------------------

    def _stopping(self, name: str, running: _Running, pod: dict[str, Any] | None) -> None:
        """Stop a Pod's process as a kubelet does, without holding up the loop."""
        now = time.monotonic()
        if running.stopping is None:
            spec = (pod or running.pod)["spec"]
            requested = self._deletion_grace.get(running.uid)
            grace = float(
                max(1, requested if requested is not None else spec.get("terminationGracePeriodSeconds", 30))
            )
            pre_stop = spec["containers"][0].get("lifecycle", {}).get("preStop", {}).get("sleep", {})
            sigterm_at = now + min(float(pre_stop.get("seconds", 0)), grace)
            running.stopping = _Stopping(
                sigterm_at=sigterm_at,
                kill_at=max(now + grace, sigterm_at + MIN_KILL_GRACE_S),
                confirm_delete=pod is not None and bool(pod["metadata"].get("deletionTimestamp")),
            )
        stop = running.stopping
        process = running.process
        if process.poll() is None:
            if not stop.sent_sigterm and now >= stop.sigterm_at:
                process.terminate()
                stop.sent_sigterm = True
            if now >= stop.kill_at:
                process.kill()
            return
        del self._running[name]
        self._release(name, running.namespace, running.uid, delete=stop.confirm_delete)

    def _end(self, name: str) -> None:
        """Stop at once (SIGTERM, SIGKILL after 10 s) and let go of the Pod."""
        running = self._running.pop(name)
        process = running.process
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _release_all(self) -> None:
        """Every Pod we hold, let go (a deleted one deleted), so nothing waits on us once we stop."""
        with contextlib.suppress(Exception):
            pods = self._list()["items"]
            for pod in filter(_claimed, pods):
                meta = pod["metadata"]
                self._release(
                    meta["name"], meta["namespace"], meta["uid"], delete=bool(meta.get("deletionTimestamp"))
                )

    def _claim(self, pod: dict[str, Any]) -> None:
        """Our finalizer on the Pod: deleted, it stays until its process has ended."""
        self._core.patch_namespaced_pod(
            pod["metadata"]["name"],
            pod["metadata"]["namespace"],
            {"metadata": {"finalizers": [FINALIZER]}},
            _content_type=_STRATEGIC,
            _request_timeout=API_TIMEOUT_S,
        )
        for node in {pod["spec"].get("nodeName", "")} - set(self._node_ports) - {""}:
            self._node_ports[node] = self._kubelet_port(node)
            assert self._log_server is not None
            self._set_kubelet_port(node, self._log_server.port)

    def _release(self, name: str, namespace: str, uid: str, *, delete: bool) -> None:
        """Take our finalizer off; for a deleted Pod, confirm the deletion (grace 0), as the
        kubelet does once the containers are gone."""
        try:
            self._core.patch_namespaced_pod(
                name,
                namespace,
                {"metadata": {"$deleteFromPrimitiveList/finalizers": [FINALIZER]}},
                _content_type=_STRATEGIC,
                _request_timeout=API_TIMEOUT_S,
            )
            if delete:
                options = client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)
                )
                self._core.delete_namespaced_pod(
                    name, namespace, body=options, _request_timeout=API_TIMEOUT_S
                )
        except client.ApiException as error:
            if error.status not in (404, 409):
                raise

    # -- readiness -------------------------------------------------------------------------------------

    def _probe(self) -> None:
        with self._lock:
            due = [
                (name, r)
                for name, r in self._running.items()
                if r.prober is not None and r.stopping is None and r.prober.due(time.monotonic())
            ]
        for name, running in due:
            assert running.prober is not None
            ready = running.prober.run(time.monotonic()) and running.process.poll() is None
            if ready != running.ready:
                with contextlib.suppress(client.ApiException):
                    self._set_ready(name, running, ready)

    def _set_ready(self, name: str, running: _Running, ready: bool) -> None:
        """The Pod's Ready and ContainersReady conditions, and its container's `ready`."""
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status = "True" if ready else "False"
        conditions = [
            {"type": kind, "status": status, "lastTransitionTime": now}
            | ({} if ready else {"reason": "ContainersNotReady"})
            for kind in ("Ready", "ContainersReady")
        ]
        containers = [
            dict(c, ready=ready) for c in running.pod.get("status", {}).get("containerStatuses", [])
        ]
        body: dict[str, Any] = {"status": {"conditions": conditions}}
        if containers:
            body["status"]["containerStatuses"] = containers
        self._core.patch_namespaced_pod_status(
            name, running.namespace, body, _content_type=_STRATEGIC, _request_timeout=API_TIMEOUT_S
        )
        running.ready = ready

    # -- logs --------------------------------------------------------------------------------------------

    def _log_source(self, namespace: str, name: str) -> LogSource | None:
        with self._lock:
            running = self._logs.get(name)
        if running is None or running.namespace != namespace:
            return None
        return LogSource(running.log, lambda: running.process.poll() is None)

    def _kubelet_port(self, node: str) -> int:
        node_status: Any = self._core.read_node_status(node, _request_timeout=API_TIMEOUT_S).status
        return int(node_status.daemon_endpoints.kubelet_endpoint.port or 0)

    def _set_kubelet_port(self, node: str, port: int) -> None:
        self._core.patch_node_status(
            node,
            {"status": {"daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}},
            _content_type=_STRATEGIC,
            _request_timeout=API_TIMEOUT_S,
        )


def _container_env(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """The container's `env`: literal values (with `$(VAR)` of earlier entries) and the field refs
    a kubelet resolves; other sources (Secrets, ConfigMaps, resources) are left out."""
    fields = {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"]["namespace"],
        "metadata.uid": pod["metadata"]["uid"],
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
        "status.podIP": pod["status"]["podIP"],
        "status.hostIP": pod["status"].get("hostIP", ""),
    }
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = _expand(entry["value"], env)
        elif (path := entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")) in fields:
            env[entry["name"]] = fields[path]
    return env


def _expand(text: str, env: dict[str, str]) -> str:
    """`$(VAR)` replaced from the container's env, as Kubernetes does; unknown ones stay."""
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def _claimed(pod: dict[str, Any]) -> bool:
    return FINALIZER in (pod["metadata"].get("finalizers") or [])


def _bind(args: list[str], ip: str) -> list[str]:
    """`epp` arguments bound to the Pod IP instead of every address."""
    out = [f"--host={ip}" if arg == "--host=0.0.0.0" else arg for arg in args]
    for i, arg in enumerate(out[:-1]):
        if arg == "--host" and out[i + 1] == "0.0.0.0":
            out[i + 1] = ip
    if out and out[0] in ("serve", "sim") and not any(a == "--host" or a.startswith("--host=") for a in out):
        out.append(f"--host={ip}")
    return out


def _repath(arg: str, prefix: str, local: str) -> str:
    """`arg` with a path under `prefix` (alone or as `--flag=PATH`) moved under `local`."""
    flag, eq, value = arg.partition("=")
    if eq and value.startswith(prefix):
        return f"{flag}={local}{value[len(prefix) :]}"
    return local + arg[len(prefix) :] if arg.startswith(prefix) else arg


def _envoy_on_pod(bootstrap: dict[str, Any], ip: str, dns: tuple[str, int] | None) -> dict[str, Any]:
    """An Envoy bootstrap as it behaves in its Pod: listeners and admin on the Pod's addresses
    (`0.0.0.0` and `127.0.0.1` both become the Pod IP), names resolved by cluster DNS."""

    def move(address: dict[str, Any]) -> None:
        socket_address = address.get("socket_address", {})
        if socket_address.get("address") in ("0.0.0.0", "127.0.0.1"):
            socket_address["address"] = ip

    out: dict[str, Any] = json.loads(json.dumps(bootstrap))
    if "admin" in out:
        move(out["admin"].get("address", {}))
    for listener in out.get("static_resources", {}).get("listeners", []):
        move(listener.get("address", {}))
    if dns is not None and "typed_dns_resolver_config" not in out:
        out["typed_dns_resolver_config"] = {
            "name": "envoy.network.dns_resolver.cares",
            "typed_config": {
                "@type": _CARES,
                "resolvers": [{"socket_address": {"address": dns[0], "port_value": dns[1]}}],
                "use_resolvers_as_fallback": False,
                "dns_resolver_options": {"no_default_search_domain": True},
            },
        }
    return out
