"""`epp serve` flags → the ServeSettings tree."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

from epp.errors import ConfigError
from epp.picker.extproc.stream import BodyMode
from epp.picker.scrape.parse import DEFAULT_NAMES
from epp.serve.settings import PoolSettings, ServeSettings, configure_parser, settings_from_args
from epp.serve.settings.flags import FLAG, NOT_SPELT, SUB_FLAGS, Flag
from epp.serve.settings.tree import GROUP

PEER_TLS = [
    "--peer-tls-ca",
    "/tls/ca.crt",
    "--peer-tls-cert",
    "/tls/tls.crt",
    "--peer-tls-key",
    "/tls/tls.key",
]


def parser() -> argparse.ArgumentParser:
    built = argparse.ArgumentParser(prog="epp serve")
    configure_parser(built)
    return built


def parse(argv: list[str], environ: dict[str, str] | None = None) -> ServeSettings:
    return settings_from_args(parser().parse_args(argv), environ if environ is not None else {})


def at(settings: object, path: str) -> object:
    """`at(s, "listen.grpc_port")` is `s.listen.grpc_port`."""
    return functools.reduce(getattr, path.split("."), settings)


DEFAULTS = ServeSettings(pool=PoolSettings(name="p", namespace="default"))


def concern_fields(member: dataclasses.Field[Any]) -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(getattr(DEFAULTS, member.name))


def tree_fields() -> Iterator[tuple[str, dataclasses.Field[Any]]]:
    """Every leaf field of the tree, with its path, read from the dataclasses themselves."""
    for member in dataclasses.fields(ServeSettings):
        for leaf in concern_fields(member):
            yield f"{member.name}.{leaf.name}", leaf


def flags_of(leaf: dataclasses.Field[Any]) -> list[Flag]:
    return [leaf.metadata[FLAG]] if FLAG in leaf.metadata else list(leaf.metadata.get(SUB_FLAGS, {}).values())


def action(flag: str) -> argparse.Action:
    (found,) = (a for a in parser()._actions if flag in a.option_strings)
    return found


def test_defaults_match_upstream() -> None:
    s = parse(["--pool-name", "p"])
    assert (s.listen.grpc_port, s.listen.grpc_health_port, s.listen.metrics_port) == (9002, 9003, 9090)
    assert s.listen.secure_serving is True
    assert s.pool.namespace == "default"
    assert s.pool.group == "inference.networking.k8s.io"
    assert s.scrape.refresh_metrics_interval_s == pytest.approx(0.1)
    assert s.scrape.staleness_threshold_s == pytest.approx(2.0)
    assert s.listen.body_mode is BodyMode.FULL_DUPLEX_STREAMED
    assert s.scrape.port is None
    assert s.scrape.insecure_skip_verify is True
    assert s.logging.verbosity == 2 and s.logging.log_format == "json"
    assert (s.drain.drain_period_s, s.drain.grace_period_s, s.listen.access_log_timeout_s) == (
        5.0,
        10.0,
        600.0,
    )
    assert s.lease_name == "epp-default-p.gateway-api-inference-extension.sigs.k8s.io"


def test_every_field_has_a_flag_with_help() -> None:
    flags = {a for action in parser()._actions for a in action.option_strings}
    for path, leaf in tree_fields():
        specs = flags_of(leaf)
        assert specs, f"{path} has no flag"
        for spec in specs:
            assert spec.name in flags and spec.help, path


def test_every_flag_belongs_to_a_field() -> None:
    """No flag is added beside the tree: each is a field's own, or the file form of one."""
    from_fields = {"-h", "--help"}
    for _, leaf in tree_fields():
        for spec in flags_of(leaf):
            from_fields |= {spec.name, *([spec.file_flag] if spec.file_flag else [])}
    assert {flag for a in parser()._actions for flag in a.option_strings} == from_fields


def test_every_flag_default_is_its_settings_field_default() -> None:
    """A default is written once, on the field: a flag that restates one could drift from it.

    Where the flag spells the field's default otherwise (`absent`: 0 for the metrics port's None, ""
    for the pool's required name and namespace), the flag holds that spelling.
    """
    for path, leaf in tree_fields():
        if SUB_FLAGS in leaf.metadata:
            for part, spec in leaf.metadata[SUB_FLAGS].items():
                assert action(spec.name).default == getattr(leaf.default, part), spec.name
            continue
        spec = leaf.metadata[FLAG]
        expected = leaf.default if spec.absent is NOT_SPELT else spec.absent
        assert action(spec.name).default == expected, path


def test_no_flags_give_the_settings_defaults() -> None:
    assert parse(["--pool-name", "p"]) == DEFAULTS


def test_every_unit_is_in_its_field_name() -> None:
    for path, leaf in tree_fields():
        unit = leaf.metadata[FLAG].unit if FLAG in leaf.metadata else None
        for suffix in ("s", "bytes"):
            assert (unit == suffix) == path.endswith(f"_{suffix}"), path


# One non-default value per field, given on the command line (after `--pool-name p`), and what the
# field then holds: every field of the tree appears at least once.
ROUND_TRIPS: list[tuple[list[str], str, object]] = [
    (["--pool-name", "q"], "pool.name", "q"),
    (["--pool-namespace", "team-b"], "pool.namespace", "team-b"),
    (["--pool-group", "inference.networking.x-k8s.io"], "pool.group", "inference.networking.x-k8s.io"),
    (["--pool-file", "/pool.yaml"], "pool.file", pathlib.Path("/pool.yaml")),
    (["--kubeconfig", "/kube/config"], "pool.kubeconfig", "/kube/config"),
    (["--host", "127.0.0.1"], "listen.host", "127.0.0.1"),
    (["--grpc-port", "0"], "listen.grpc_port", 0),
    (["--grpc-health-port", "9103"], "listen.grpc_health_port", 9103),
    (["--metrics-port", "9190"], "listen.metrics_port", 9190),
    (["--secure-serving=false"], "listen.secure_serving", False),
    (["--secure-serving", "false"], "listen.secure_serving", False),
    (["--cert-path", "/certs"], "listen.cert_path", pathlib.Path("/certs")),
    (["--body-mode", "buffered"], "listen.body_mode", BodyMode.BUFFERED),
    (["--max-request-body-bytes", "1024"], "listen.max_request_body_bytes", 1024),
    (["--max-header-bytes", "2048"], "listen.max_header_bytes", 2048),
    (["--access-log-timeout", "2m"], "listen.access_log_timeout_s", 120.0),
    (["--drain-period", "0s"], "drain.drain_period_s", 0.0),
    (["--drain-period=15s"], "drain.drain_period_s", 15.0),
    (["--grace-period", "3s"], "drain.grace_period_s", 3.0),
    (["--grace-period=-1"], "drain.grace_period_s", 0.0),
    (
        ["--config-text", "kind: EndpointPickerConfig"],
        "scheduling.picker_config_text",
        "kind: EndpointPickerConfig",
    ),
    (["--policy", "round-robin"], "scheduling.policy", "round-robin"),
    (["--seed", "7"], "scheduling.seed", 7),
    (["--refresh-metrics-interval", "50ms"], "scrape.refresh_metrics_interval_s", 0.05),
    (["--refresh-metrics-interval=1m30s"], "scrape.refresh_metrics_interval_s", 90.0),
    (["--metrics-staleness-threshold", "500ms"], "scrape.staleness_threshold_s", 0.5),
    (["--model-server-metrics-port", "8001"], "scrape.port", 8001),
    (["--model-server-metrics-path", "/stats"], "scrape.path", "/stats"),
    (["--model-server-metrics-scheme", "https"], "scrape.scheme", "https"),
    (["--model-server-metrics-https-insecure-skip-verify=false"], "scrape.insecure_skip_verify", False),
    (
        ["--cache-info-metric", "x:cache"],
        "scrape.metric_names",
        dataclasses.replace(DEFAULT_NAMES, cache_info="x:cache"),
    ),
    (["--adapter-catalog", "/catalog.yaml"], "adapters.catalog", pathlib.Path("/catalog.yaml")),
    (["--adapter-state-port", "9005"], "adapters.state_port", 9005),
    (["--adapter-idle-unload", "0"], "adapters.idle_unload_s", 0.0),
    (["--peers", " r:9004 ", "--peer-insecure"], "peers.addresses", "r:9004"),
    (["--peer-selector", " app=epp ", "--peer-insecure"], "peers.selector", "app=epp"),
    (["--peers", "r:9004", "--peer-insecure"], "peers.insecure", True),
    (["--peer-port", "9104"], "peers.port", 9104),
    (["--peer-interval", "50ms"], "peers.interval_s", 0.05),
    (["--peers", "r:9004", *PEER_TLS], "peers.tls_ca", pathlib.Path("/tls/ca.crt")),
    (["--peers", "r:9004", *PEER_TLS], "peers.tls_cert", pathlib.Path("/tls/tls.crt")),
    (["--peers", "r:9004", *PEER_TLS], "peers.tls_key", pathlib.Path("/tls/tls.key")),
    (["--ha-enable-leader-election"], "leader.enabled", True),
    (["--tracing"], "observability.tracing", True),
    (
        ["--metrics-auth-token-file", "/run/token"],
        "observability.metrics_auth_token_file",
        pathlib.Path("/run/token"),
    ),
    (["--decision-log-size", "10"], "observability.decision_log_size", 10),
    (["--v", "4"], "logging.verbosity", 4),
    (["--log-format", "text"], "logging.log_format", "text"),
]


@pytest.mark.parametrize(("argv", "path", "value"), ROUND_TRIPS, ids=[" ".join(a) for a, _, _ in ROUND_TRIPS])
def test_a_flag_value_reaches_its_field(argv: list[str], path: str, value: object) -> None:
    got = at(parse(["--pool-name", "p", *argv]), path)
    assert got == (pytest.approx(value) if isinstance(value, float) else value)
    assert value != at(DEFAULTS, path), "the case must move the field off its default"


# Spellings that give a field its default: a bare bool flag is true, and 0 is the metrics port's None.
@pytest.mark.parametrize(
    ("argv", "path", "value"),
    [
        (["--secure-serving"], "listen.secure_serving", True),
        (["--secure-serving=false", "--secure-serving", "yes"], "listen.secure_serving", True),
        (["--model-server-metrics-port", "0"], "scrape.port", None),
    ],
    ids=["bare-bool", "bool-word", "port-zero"],
)
def test_spellings_of_a_default(argv: list[str], path: str, value: object) -> None:
    assert at(parse(["--pool-name", "p", *argv]), path) == value == at(DEFAULTS, path)


def test_every_field_has_a_round_trip() -> None:
    assert {path for path, _ in tree_fields()} == {path for _, path, _ in ROUND_TRIPS}


def test_help_lists_each_concern_as_a_group_with_its_flags() -> None:
    built = parser()
    groups = {group.title: group for group in built._action_groups}
    text = built.format_help()
    for member in dataclasses.fields(ServeSettings):
        title = member.metadata[GROUP]
        assert f"\n{title}:\n" in text
        listed = {flag for a in groups[title]._group_actions for flag in a.option_strings}
        for leaf in concern_fields(member):
            assert {spec.name for spec in flags_of(leaf)} <= listed, f"{title}: {leaf.name}"


def test_help_shows_durations_as_written() -> None:
    assert "(default 100ms: a Python scrape" in parser().format_help().replace("\n", " ").replace("  ", "")


def test_namespace_from_environment() -> None:
    assert parse(["--pool-name", "p"], {"NAMESPACE": "team-a"}).pool.namespace == "team-a"
    assert parse(["--pool-name", "p", "--pool-namespace", "x"], {"NAMESPACE": "team-a"}).pool.namespace == "x"


def test_config_file_is_read(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "picker.yaml"
    path.write_text("apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n")
    settings = parse(["--pool-name", "p", "--config-file", str(path)])
    assert settings.scheduling.picker_config_text == path.read_text()


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
        (
            ["--pool-name", "p", "--peers", "r:9004", "--peer-selector", "app=epp", "--peer-insecure"],
            "both name the peers: choose one",
        ),
        (
            ["--pool-name", "p", "--peer-selector", "app=epp,tier in (a)", "--peer-insecure"],
            "--peer-selector: expected KEY=VALUE",
        ),
        (
            ["--pool-file", "pool.yaml", "--pool-name", "p", "--peer-selector", "app=epp", "--peer-insecure"],
            "--peer-selector finds the replicas through the Kubernetes API, which --pool-file",
        ),
        (["--pool-name", "p", "--peer-selector", "app=epp"], "--peer-selector needs --peer-tls-ca"),
        (
            [
                "--pool-name",
                "p",
                "--peer-selector",
                "app=epp",
                "--peer-insecure",
                "--ha-enable-leader-election",
            ],
            "--peer-selector runs replicas active-active",
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
        "peers-and-peer-selector",
        "peer-selector-not-equality",
        "peer-selector-without-kubernetes",
        "peer-selector-without-tls-or-insecure",
        "peer-selector-and-lease",
    ],
)
def test_inconsistent_flags_are_config_errors(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("-", r"\-")):
        parse(argv)


def test_peers_are_parsed_with_their_defaults() -> None:
    s = parse(
        ["--pool-name", "p", "--peers", " epp-replicas.ns.svc:9004 ", "--peer-interval", "50ms", *PEER_TLS]
    )
    assert (s.peers.addresses, s.peers.port, s.peers.interval_s) == ("epp-replicas.ns.svc:9004", 9004, 0.05)
    assert (s.peers.tls_ca, s.peers.tls_cert, s.peers.tls_key, s.peers.insecure) == (
        pathlib.Path("/tls/ca.crt"),
        pathlib.Path("/tls/tls.crt"),
        pathlib.Path("/tls/tls.key"),
        False,
    )
    insecure = parse(["--pool-name", "p", "--peers", "epp-replicas:9004", "--peer-insecure"])
    assert (insecure.peers.insecure, insecure.peers.tls_ca) == (True, None)
    assert parse(["--pool-name", "p"]).peers.addresses == ""
    selected = parse(["--pool-name", "p", "--peer-selector", " app=epp, !canary,tier!=x ", "--peer-insecure"])
    assert (selected.peers.selector, selected.peers.enabled) == ("app=epp, !canary,tier!=x", True)


def test_pool_file_makes_pool_name_optional(tmp_path: pathlib.Path) -> None:
    s = parse(["--pool-file", str(tmp_path / "pool.yaml")])
    assert s.pool.file == tmp_path / "pool.yaml" and s.pool.name == ""


def test_every_flag_is_documented() -> None:
    undocumented = [a.option_strings for a in parser()._actions if a.option_strings and not a.help]
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
    s = parse(["--pool-name", "p", *argv], environ).observability
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
    names = s.scrape.metric_names
    assert (names.waiting, names.lora_info) == ("sglang:num_queue_reqs", "x:lora")
    assert names.running == "vllm:num_requests_running"  # the others keep vLLM's names
    with pytest.raises(ConfigError, match="must not be empty"):
        parse(["--pool-name", "p", "--kv-cache-usage-percentage-metric", ""])
