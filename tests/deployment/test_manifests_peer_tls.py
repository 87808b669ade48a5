"""manifests/epp-active-active's peer TLS: `peer-tls.sh` makes the Secret the overlay mounts, and
`epp serve` accepts what is in it for the overlay's pool in the namespace it was made for (the
same checks it runs at start: CA signature, key, the pool's name).

Needs openssl and kubectl (`kubectl kustomize`, `kubectl create --dry-run=client`: no cluster);
without them these tests skip."""

from __future__ import annotations

import base64
import pathlib
import subprocess
from typing import Any

import pytest
import yaml

from epp.errors import ConfigError
from epp.picker.peers import PeerTlsFiles, load_peer_tls, peer_identity
from tests.deployment.tools import find, missing

ROOT = pathlib.Path(__file__).resolve().parents[2]
OVERLAY = ROOT / "manifests" / "epp-active-active"
SCRIPT = OVERLAY / "peer-tls.sh"
POOL = "vllm-llama3-8b"
KUBECTL = find("kubectl")
pytestmark = [
    pytest.mark.skipif(KUBECTL is None, reason=missing("kubectl")),
    pytest.mark.skipif(find("openssl") is None, reason=missing("openssl")),
]


def made_secret(namespace: str) -> dict[str, Any]:
    assert KUBECTL is not None
    path = f"{pathlib.Path(KUBECTL).parent}:/usr/bin:/bin"
    result = subprocess.run(
        ["sh", str(SCRIPT), namespace, "--print"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": path},
    )
    assert result.returncode == 0, result.stderr
    secret: dict[str, Any] = yaml.safe_load(result.stdout)
    return secret


def overlay_container_and_volumes() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    assert KUBECTL is not None
    built = subprocess.run(
        [KUBECTL, "kustomize", str(OVERLAY)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    (deployment,) = [d for d in yaml.safe_load_all(built) if d and d["kind"] == "Deployment"]
    spec = deployment["spec"]["template"]["spec"]
    return spec["containers"][0], spec["volumes"]


def write_files(secret: dict[str, Any], directory: pathlib.Path) -> None:
    for key, value in secret["data"].items():
        (directory / key).write_bytes(base64.b64decode(value))


def test_the_script_makes_the_secret_the_overlay_mounts_and_the_epp_accepts_it(
    tmp_path: pathlib.Path,
) -> None:
    secret = made_secret("team-a")
    container, volumes = overlay_container_and_volumes()
    (volume,) = [v for v in volumes if "secret" in v]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert (secret["metadata"]["name"], secret["metadata"]["namespace"]) == (
        volume["secret"]["secretName"],
        "team-a",
    )
    assert secret["type"] == "kubernetes.io/tls"
    assert mount["readOnly"] is True
    flags = dict(a.split("=", 1) for a in container["args"] if a.startswith("--peer-tls-"))
    assert flags == {f"--peer-tls-{flag}": f"{mount['mountPath']}/{key}" for flag, key in
                     (("ca", "ca.crt"), ("cert", "tls.crt"), ("key", "tls.key"))}  # fmt: skip
    assert f"--pool-name={POOL}" in container["args"]
    write_files(secret, tmp_path)
    files = PeerTlsFiles(tmp_path / "ca.crt", tmp_path / "tls.crt", tmp_path / "tls.key")
    loaded = load_peer_tls(files, peer_identity("team-a", POOL))
    loaded.server_context()  # loads into ssl as the peer port does
    with pytest.raises(ConfigError, match="peers of this pool expect"):
        load_peer_tls(files, peer_identity("team-b", POOL))  # made for another namespace


def test_each_run_makes_a_new_ca() -> None:
    assert made_secret("default")["data"]["ca.crt"] != made_secret("default")["data"]["ca.crt"]
