"""`epp serve` flags → ServeSettings."""

from __future__ import annotations

import argparse
import dataclasses
import pathlib

import pytest

from epp.errors import ConfigError
from epp.picker.extproc.stream import BodyMode
from epp.serve.settings import ServeSettings, configure_parser, settings_from_args

PEER_TLS = [
    "--peer-tls-ca",
    "/tls/ca.crt",
    "--peer-tls-cert",
    "/tls/tls.crt",
    "--peer-tls-key",
    "/tls/tls.key",
]


def parse(argv: list[str], environ: dict[str, str] | None = None) -> ServeSettings:
    parser = argparse.ArgumentParser(prog="epp serve")
    configure_parser(parser)
    return settings_from_args(parser.parse_args(argv), environ if environ is not None else {})


def test_defaults_match_upstream() -> None:
    s = parse(["--pool-name", "p"])
    assert (s.grpc_port, s.grpc_health_port, s.metrics_port) == (9002, 9003, 9090)
    assert s.secure_serving is True
    assert s.pool_namespace == "default"
    assert s.pool_group == "inference.networking.k8s.io"
    assert s.refresh_metrics_interval_s == pytest.approx(0.1)
    assert s.metrics_staleness_threshold_s == pytest.approx(2.0)
    assert s.body_mode is BodyMode.FULL_DUPLEX_STREAMED
    assert s.model_server_metrics_port is None
    assert s.model_server_metrics_insecure_skip_verify is True
    assert s.verbosity == 2 and s.log_format == "json"
    assert (s.drain_period_s, s.grace_period_s, s.access_log_timeout_s) == (5.0, 10.0, 600.0)
    assert s.lease_name == "epp-default-p.gateway-api-inference-extension.sigs.k8s.io"


# Flags whose field is named otherwise (besides a duration's `_s`), and flags with no field default
# of their own: the pool's name and namespace have none, the config flags are read into
# `picker_config_text`, the metric-name flags fill `metric_names`, and the metrics port's 0 is the
# flag's spelling of the field's None.
FIELD_OF_DEST = {
    "v": "verbosity",
    "model_server_metrics_https_insecure_skip_verify": "model_server_metrics_insecure_skip_verify",
}
NO_FIELD_DEFAULT = {
    "help",
    "pool_name",
    "pool_namespace",
    "config_file",
    "config_text",
    "model_server_metrics_port",
}


def test_every_flag_default_is_its_settings_field_default() -> None:
    """A default is written once, on the field: a flag that restates one could drift from it."""
    parser = argparse.ArgumentParser(prog="epp serve")
    configure_parser(parser)
    field_defaults = {
        f.name: f.default for f in dataclasses.fields(ServeSettings) if f.default is not dataclasses.MISSING
    }
    checked: set[str] = set()
    for action in parser._actions:
        if action.dest in NO_FIELD_DEFAULT or action.dest.endswith("_metric"):
            continue
        named = FIELD_OF_DEST.get(action.dest, action.dest)
        field = next((name for name in (named, f"{named}_s") if name in field_defaults), None)
        assert field is not None, f"{action.option_strings}: no ServeSettings field with a default"
        assert action.default == field_defaults[field], action.option_strings
        checked.add(field)
    assert set(field_defaults) - checked == {
        "picker_config_text",
        "metric_names",
        "model_server_metrics_port",
    }


def test_no_flags_give_the_settings_defaults() -> None:
    assert parse(["--pool-name", "p"]) == ServeSettings(pool_name="p", pool_namespace="default")


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["--secure-serving=false"], "secure_serving", False),
        (["--secure-serving", "false"], "secure_serving", False),
        (["--secure-serving"], "secure_serving", True),
        (["--ha-enable-leader-election"], "ha_enable_leader_election", True),
        (
            ["--model-server-metrics-https-insecure-skip-verify=false"],
            "model_server_metrics_insecure_skip_verify",
            False,
        ),
        (["--refresh-metrics-interval", "50ms"], "refresh_metrics_interval_s", 0.05),
        (["--refresh-metrics-interval=1m30s"], "refresh_metrics_interval_s", 90.0),
        (["--metrics-staleness-threshold", "500ms"], "metrics_staleness_threshold_s", 0.5),
        (["--body-mode", "buffered"], "body_mode", BodyMode.BUFFERED),
        (["--model-server-metrics-port", "8001"], "model_server_metrics_port", 8001),
        (["--policy", "round-robin"], "policy", "round-robin"),
        (["--config-text", "kind: EndpointPickerConfig"], "picker_config_text", "kind: EndpointPickerConfig"),
        (["--v", "4"], "verbosity", 4),
        (["--grpc-port", "0"], "grpc_port", 0),
        (["--max-request-body-bytes", "1024"], "max_request_body_bytes", 1024),
        (["--drain-period", "0s"], "drain_period_s", 0.0),
        (["--drain-period=15s"], "drain_period_s", 15.0),
        (["--access-log-timeout", "2m"], "access_log_timeout_s", 120.0),
    ],
    ids=[
        "secure-false-equals",
        "secure-false-space",
        "secure-bare",
        "leader-election",
        "skip-verify-false",
        "refresh-ms",
        "refresh-compound",
        "staleness",
        "body-mode",
        "metrics-port",
        "policy",
        "config-text",
        "verbosity",
        "ephemeral-port",
        "body-limit",
        "no-drain",
        "drain",
        "access-log-timeout",
    ],
)
def test_flag_values(argv: list[str], field: str, value: object) -> None:
    s = parse(["--pool-name", "p", *argv])
    got = getattr(s, field)
    assert got == (pytest.approx(value) if isinstance(value, float) else value)


def test_namespace_from_environment() -> None:
    assert parse(["--pool-name", "p"], {"NAMESPACE": "team-a"}).pool_namespace == "team-a"
    assert parse(["--pool-name", "p", "--pool-namespace", "x"], {"NAMESPACE": "team-a"}).pool_namespace == "x"


def test_config_file_is_read(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "picker.yaml"
    path.write_text("apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n")
    assert parse(["--pool-name", "p", "--config-file", str(path)]).picker_config_text == path.read_text()


@pytest.mark.parametrize(
    "argv",
    [
        ["--pool-name", "p", "--config-file", "a.yaml", "--config-text", "x"],
        ["--pool-name", "p", "--refresh-metrics-interval", "soon"],
        ["--pool-name", "p", "--refresh-metrics-interval", "0s"],
        ["--pool-name", "p", "--grpc-port", "70000"],
        ["--pool-name", "p", "--secure-serving=maybe"],
        ["--pool-name", "p", "--body-mode", "STREAMED"],
        ["--pool-name", "p", "--policy", "best"],
        ["--pool-name", "p", "--max-request-body-bytes", "0"],
        ["--pool-name", "p", "--drain-period", "-1s"],
        ["--pool-name", "p", "--access-log-timeout", "0s"],
    ],
    ids=[
        "config-exclusive",
        "bad-duration",
        "zero-duration",
        "bad-port",
        "bad-bool",
        "bad-mode",
        "bad-policy",
        "zero-limit",
        "negative-drain",
        "zero-access-log-timeout",
    ],
)
def test_bad_flags_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parse(argv)
    assert caught.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--pool-name is required"),
        (
            ["--pool-name", "p", "--config-file", "/nonexistent/picker.yaml"],
            "--config-file /nonexistent/picker.yaml",
        ),
        (["--pool-name", "p", "--secure-serving=false", "--cert-path", "/certs"], "--cert-path needs"),
        (["--pool-name", "p", "--policy", "random", "--config-text", "x"], "--policy cannot be combined"),
        (["--pool-name", "p", "--peers", "epp-replicas"], "--peers: expected NAME:PORT entries"),
        (
            ["--pool-name", "p", "--peers", "epp-replicas:9004", "--ha-enable-leader-election"],
            "--peers runs replicas active-active",
        ),
        (
            ["--pool-name", "p", "--peers", "epp-replicas:9004"],
            "--peers needs --peer-tls-ca, --peer-tls-cert and --peer-tls-key",
        ),
        (
            ["--pool-name", "p", "--peers", "r:9004", "--peer-tls-ca", "ca.crt", "--peer-tls-key", "tls.key"],
            "--peer-tls-ca, --peer-tls-key needs --peer-tls-cert too",
        ),
        (
            ["--pool-name", "p", "--peers", "r:9004", "--peer-insecure", *PEER_TLS],
            "--peer-insecure and --peer-tls-",
        ),
        (["--pool-name", "p", *PEER_TLS], "only apply with --peers"),
        (
            ["--pool-file", "pool.yaml", "--peers", "r:9004", *PEER_TLS],
            "need --pool-name: the peer certificates name the pool",
        ),
    ],
    ids=[
        "no-pool",
        "missing-config-file",
        "cert-without-tls",
        "policy-and-config",
        "peer-no-port",
        "peers-and-lease",
        "peers-without-tls-or-insecure",
        "peer-tls-incomplete",
        "peer-tls-and-insecure",
        "peer-tls-without-peers",
        "peer-tls-without-pool-name",
    ],
)
def test_inconsistent_flags_are_config_errors(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("-", r"\-")):
        parse(argv)


def test_peers_are_parsed_with_their_defaults() -> None:
    s = parse(
        ["--pool-name", "p", "--peers", " epp-replicas.ns.svc:9004 ", "--peer-interval", "50ms", *PEER_TLS]
    )
    assert (s.peers, s.peer_port, s.peer_interval_s) == ("epp-replicas.ns.svc:9004", 9004, 0.05)
    assert (s.peer_tls_ca, s.peer_tls_cert, s.peer_tls_key, s.peer_insecure) == (
        pathlib.Path("/tls/ca.crt"),
        pathlib.Path("/tls/tls.crt"),
        pathlib.Path("/tls/tls.key"),
        False,
    )
    insecure = parse(["--pool-name", "p", "--peers", "epp-replicas:9004", "--peer-insecure"])
    assert (insecure.peer_insecure, insecure.peer_tls_ca) == (True, None)
    assert parse(["--pool-name", "p"]).peers == ""


def test_pool_file_makes_pool_name_optional(tmp_path: pathlib.Path) -> None:
    s = parse(["--pool-file", str(tmp_path / "pool.yaml")])
    assert s.pool_file == tmp_path / "pool.yaml" and s.pool_name == ""


def test_every_flag_is_documented() -> None:
    parser = argparse.ArgumentParser(prog="epp serve")
    configure_parser(parser)
    undocumented = [a.option_strings for a in parser._actions if a.option_strings and not a.help]
    assert undocumented == []


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        ([], {}, (False, None, 256)),
        (["--tracing"], {}, (True, None, 256)),
        ([], {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, (True, None, 256)),
        (["--tracing=false"], {}, (False, None, 256)),
        (
            ["--metrics-auth-token-file", "/var/run/token", "--decision-log-size", "10"],
            {},
            (False, "/var/run/token", 10),
        ),
    ],
    ids=["defaults", "tracing-flag", "otlp-endpoint-env", "tracing-off", "token-and-log-size"],
)
def test_observability_flags(argv: list[str], environ: dict[str, str], expected: tuple[object, ...]) -> None:
    s = parse(["--pool-name", "p", *argv], environ)
    token = str(s.metrics_auth_token_file) if s.metrics_auth_token_file is not None else None
    assert (s.tracing, token, s.decision_log_size) == expected


@pytest.mark.parametrize("size", ["0", "100001"], ids=["zero", "too-large"])
def test_decision_log_size_is_bounded(size: str) -> None:
    with pytest.raises((SystemExit, ConfigError)):
        parse(["--pool-name", "p", "--decision-log-size", size])


def test_decision_log_size_names_its_limit() -> None:
    with pytest.raises(ConfigError, match=r"^--decision-log-size must be at most 100000$"):
        parse(["--pool-name", "p", "--decision-log-size", "100001"])


def test_upstream_metric_name_flags_choose_what_the_scraper_reads() -> None:
    s = parse(
        [
            "--pool-name",
            "p",
            "--total-queued-requests-metric",
            "sglang:num_queue_reqs",
            "--lora-info-metric=x:lora",
        ]
    )
    assert (s.metric_names.waiting, s.metric_names.lora_info) == ("sglang:num_queue_reqs", "x:lora")
    assert s.metric_names.running == "vllm:num_requests_running"  # the others keep vLLM's names
    with pytest.raises(ConfigError, match="must not be empty"):
        parse(["--pool-name", "p", "--kv-cache-usage-percentage-metric", ""])
