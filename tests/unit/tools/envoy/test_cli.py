"""`epp envoy-config` as a user runs it: flags and a pool file in, a bootstrap out."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from epp.cli import main
from epp.serve.settings import ListenSettings

POOL = """\
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata:
  name: p
spec:
  selector:
    matchLabels: {app: vllm}
  targetPorts: [{number: 8000}]
  endpointPickerRef:
    name: p-epp
    port: {number: 9002}
    failureMode: FailOpen
---
apiVersion: v1
kind: Pod
metadata: {name: a, labels: {app: vllm}}
status: {podIP: 10.1.0.1}
---
apiVersion: v1
kind: Pod
metadata: {name: b, labels: {app: vllm}}
status:
  podIP: 10.1.0.2
  conditions: [{type: Ready, status: "False"}]
"""


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["envoy-config", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _ext_proc(bootstrap: dict[str, object]) -> dict[str, object]:
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]  # type: ignore[index]
    config: dict[str, object] = hcm["http_filters"][1]["typed_config"]
    return config


def _cluster(bootstrap: dict[str, object], name: str) -> dict[str, object]:
    clusters = bootstrap["static_resources"]["clusters"]  # type: ignore[index]
    found: dict[str, object] = next(c for c in clusters if c["name"] == name)
    return found


def test_pool_file_sets_fail_open_and_the_fallback_pods(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = tmp_path / "pool.yaml"
    pool.write_text(POOL)
    code, out, _ = _run(["--pool-file", str(pool), "--epp-address", "10.2.0.1:9002"], capsys)
    assert code == 0
    bootstrap = yaml.safe_load(out)
    assert _ext_proc(bootstrap)["failure_mode_allow"] is True
    fallback = _cluster(bootstrap, "pool")
    lb_endpoints = fallback["load_assignment"]["endpoints"][0]["lb_endpoints"]  # type: ignore[index]
    # Only the Ready pod is a fallback target.
    assert [e["endpoint"]["address"]["socket_address"] for e in lb_endpoints] == [
        {"address": "10.1.0.1", "port_value": 8000}
    ]
    epp = _cluster(bootstrap, "epp")
    epp_address = epp["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]  # type: ignore[index]
    assert epp_address["socket_address"] == {"address": "10.2.0.1", "port_value": 9002}


def test_flags_override_the_pool_file(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    pool = tmp_path / "pool.yaml"
    pool.write_text(POOL)
    out_file = tmp_path / "envoy.yaml"
    code, out, _ = _run(
        ["--pool-file", str(pool), "--failure-mode", "FailClose", "--body-mode", "FULL_DUPLEX_STREAMED",
         "--epp-tls=false", "--output", str(out_file)],
        capsys,
    )  # fmt: skip
    assert (code, out) == (0, "")
    bootstrap = yaml.safe_load(out_file.read_text())
    ext_proc = _ext_proc(bootstrap)
    assert ext_proc["failure_mode_allow"] is False
    assert ext_proc["processing_mode"]["request_body_mode"] == "FULL_DUPLEX_STREAMED"  # type: ignore[index]
    sockets = [m["transport_socket"]["name"] for m in _cluster(bootstrap, "epp")["transport_socket_matches"]]  # type: ignore[attr-defined]
    assert sockets == ["envoy.transport_sockets.raw_buffer", "envoy.transport_sockets.raw_buffer"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--failure-mode", "FailOpen"], "needs the pool's pod endpoints"),
        (
            ["--upstream", "original-dst", "--failure-mode", "FailOpen"],
            "FailOpen needs the pool's pod endpoints",
        ),
        (["--mode", "round-robin"], "needs the pool's pod endpoints"),
        (["--epp-address", "nohost"], "expected HOST:PORT"),
        (["--failure-mode", "FailOpen", "--pool-endpoint", "10.0.0.1:99999"], "port out of range"),
        (["--pool-file", "/nonexistent/pool.yaml"], "cannot read pool file"),
        (["--upstream", "original-dst", "--max-request-body-bytes", "0"], "--max-request-body-bytes"),
    ],
    ids=[
        "no-pods",
        "original-dst-fail-open-no-pods",
        "round-robin-no-pods",
        "bad-epp-address",
        "bad-pool-endpoint",
        "missing-pool-file",
        "no-body-limit",
    ],
)
def test_bad_input_is_a_clear_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(argv, capsys)
    assert code == 2
    assert out == ""
    assert message in err


def test_bad_pool_file_is_a_clear_error(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    pool = tmp_path / "pool.yaml"
    pool.write_text("kind: InferencePool\n")
    code, out, err = _run(["--pool-file", str(pool)], capsys)
    assert code == 2
    assert out == ""
    assert str(pool) in err


def _hcm(bootstrap: dict[str, object]) -> dict[str, object]:
    hcm: dict[str, object] = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][  # type: ignore[index]
        "typed_config"
    ]
    return hcm


def test_by_default_the_epp_gets_requests_and_the_access_log(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = tmp_path / "pool.yaml"
    pool.write_text(POOL)
    code, out, _ = _run(["--pool-file", str(pool)], capsys)
    assert code == 0
    bootstrap = yaml.safe_load(out)
    assert _ext_proc(bootstrap)["processing_mode"]["response_body_mode"] == "NONE"  # type: ignore[index]
    # Envoy holds the request body while the EPP routes (a dying EPP fails open), as much of it as
    # `epp serve` accepts by default.
    assert _ext_proc(bootstrap)["processing_mode"]["request_body_mode"] == "BUFFERED"  # type: ignore[index]
    listener = bootstrap["static_resources"]["listeners"][0]
    assert listener["per_connection_buffer_limit_bytes"] == ListenSettings().max_request_body_bytes
    assert [logger["name"] for logger in _hcm(bootstrap)["access_log"]] == ["envoy.access_loggers.http_grpc"]  # type: ignore[attr-defined]
    # With no --epp-address, Envoy asks `epp serve` on its default ext_proc and health ports.
    (epp,) = [c for c in bootstrap["static_resources"]["clusters"] if c["name"] == "epp"]
    (endpoint,) = [
        e["endpoint"] for group in epp["load_assignment"]["endpoints"] for e in group["lb_endpoints"]
    ]
    assert endpoint["address"]["socket_address"]["port_value"] == ListenSettings().grpc_port
    assert endpoint["health_check_config"]["port_value"] == ListenSettings().grpc_health_port


def test_responses_through_the_epp_and_no_access_log_on_request(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = tmp_path / "pool.yaml"
    pool.write_text(POOL)
    code, out, _ = _run(["--pool-file", str(pool), "--process-responses", "--access-log=false"], capsys)
    assert code == 0
    bootstrap = yaml.safe_load(out)
    assert _ext_proc(bootstrap)["processing_mode"]["response_body_mode"] == "FULL_DUPLEX_STREAMED"  # type: ignore[index]
    assert "access_log" not in _hcm(bootstrap)


def test_several_epp_addresses_are_replicas_of_one_cluster(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = tmp_path / "pool.yaml"
    pool.write_text(POOL)
    code, out, _ = _run(
        ["--pool-file", str(pool), "--epp-address", "10.2.0.1:9002", "--epp-address", "10.2.0.2:9002"], capsys
    )
    assert code == 0
    epp = _cluster(yaml.safe_load(out), "epp")
    lb_endpoints = epp["load_assignment"]["endpoints"][0]["lb_endpoints"]  # type: ignore[index]
    assert [
        (
            e["endpoint"]["address"]["socket_address"]["address"],
            e["endpoint"]["health_check_config"]["port_value"],
        )
        for e in lb_endpoints
    ] == [("10.2.0.1", 9003), ("10.2.0.2", 9003)]


def test_the_body_limit_follows_the_epps(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    pool = tmp_path / "pool.yaml"
    pool.write_text(POOL)
    code, out, _ = _run(["--pool-file", str(pool), "--max-request-body-bytes", "4194304"], capsys)
    assert code == 0
    listener = yaml.safe_load(out)["static_resources"]["listeners"][0]
    assert listener["per_connection_buffer_limit_bytes"] == 4194304
