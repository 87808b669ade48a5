"""`epp sim` started with the real servers' flags, for the side-by-side diff tests."""

from __future__ import annotations

import contextlib
import pathlib
import random
import subprocess
import sys
from collections.abc import Iterator

from epp.tools.localstack import pick_pod_addresses
from testkit.waiting import poll_until
from tests.realvllm.client import ADAPTERS, BASE_MODEL, RealPod, get_text


@contextlib.contextmanager
def running_sim(log_path: pathlib.Path, *extra_args: str) -> Iterator[RealPod]:
    """tiny-llama with lora-0 … lora-3, 2 GPU slots, 4 in host memory, context 512, as the servers."""
    hosts, port = pick_pod_addresses(1, random.Random())
    pod = RealPod("sim", hosts[0], port)
    command = [
        sys.executable, "-m", "epp", "sim", "--host", pod.host, "--port", str(pod.port),
        "--served-model-name", BASE_MODEL, "--max-model-len", "512", "--max-num-seqs", "8",
        "--max-loras", "2", "--max-cpu-loras", "4", "--block-size", "128", "--kv-cache-tokens", "1048576",
        "--lora-modules", *(f"{name}=/models/{name}" for name in ADAPTERS), *extra_args,
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:

        def healthy() -> bool:
            try:
                get_text(f"{pod.url}/health", timeout_s=1)
            except OSError:
                return False
            return True

        assert poll_until(healthy, within_s=30), log_path.read_text()[-3000:]
        yield pod
    finally:
        process.terminate()
        process.wait(timeout=10)
