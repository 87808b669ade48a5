"""`epp serve` settings: the flags (upstream v1 kebab-case names) and the frozen `ServeSettings`.

The metrics refresh default is 100ms rather than upstream's 50ms: a Python scrape costs about
1.5 ms of CPU per pod, so 50ms would spend ~3% of a core per pod on scraping alone, while 100ms
still sees queue changes well within one request's lifetime.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
from dataclasses import dataclass

from epp import durations
from epp.cliutil import add_bool_flag, parse_duration
from epp.errors import ConfigError
from epp.picker import wire
from epp.picker.extproc.stream import BodyMode
from epp.picker.observability import decisions
from epp.picker.scrape.parse import DEFAULT_NAMES, MetricNames

POLICIES = ("default", "round-robin", "random", "least-queue", "gie-v0.3", "gie-v1")
DEFAULT_POOL_GROUP = "inference.networking.k8s.io"
DEFAULT_REFRESH_METRICS_INTERVAL = "100ms"
DEFAULT_STALENESS_THRESHOLD = "2s"
DEFAULT_GRACE_PERIOD = "10s"
# Envoy's health check on the EPP (what `epp envoy-config` writes) runs every second with a 1 s
# timeout and one failure to mark it down: 5 s covers that with room for a slower gateway.
DEFAULT_DRAIN_PERIOD = "5s"
DEFAULT_ACCESS_LOG_TIMEOUT = "10m"
DEFAULT_ADAPTER_IDLE_UNLOAD = "10m"
DEFAULT_PEER_INTERVAL = "100ms"


@dataclass(frozen=True, slots=True)
class ServeSettings:
    pool_name: str
    pool_namespace: str
    pool_group: str = DEFAULT_POOL_GROUP
    pool_file: pathlib.Path | None = None
    adapter_catalog: pathlib.Path | None = None  # on-demand adapter loading (LLMInferenceService)
    adapter_state_port: int = 0  # the pods' `epp sidecar` port; 0 = scrape only
    # 0 = never unload idle on-demand adapters
    adapter_idle_unload_s: float = durations.parse_duration(DEFAULT_ADAPTER_IDLE_UNLOAD)
    kubeconfig: str | None = None
    host: str = "0.0.0.0"
    grpc_port: int = 9002
    grpc_health_port: int = 9003
    metrics_port: int = 9090
    secure_serving: bool = True
    cert_path: pathlib.Path | None = None
    refresh_metrics_interval_s: float = durations.parse_duration(DEFAULT_REFRESH_METRICS_INTERVAL)
    metrics_staleness_threshold_s: float = durations.parse_duration(DEFAULT_STALENESS_THRESHOLD)
    picker_config_text: str | None = None  # from --config-file or --config-text
    policy: str | None = None
    model_server_metrics_port: int | None = None  # None: the endpoint's own port
    model_server_metrics_path: str = "/metrics"
    model_server_metrics_scheme: str = "http"
    model_server_metrics_insecure_skip_verify: bool = True
    metric_names: MetricNames = DEFAULT_NAMES
    body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED
    ha_enable_leader_election: bool = False
    max_request_body_bytes: int = wire.DEFAULT_MAX_REQUEST_BODY_BYTES
    max_header_bytes: int = wire.DEFAULT_MAX_HEADER_BYTES
    grace_period_s: float = durations.parse_duration(DEFAULT_GRACE_PERIOD)
    drain_period_s: float = durations.parse_duration(DEFAULT_DRAIN_PERIOD)
    access_log_timeout_s: float = durations.parse_duration(DEFAULT_ACCESS_LOG_TIMEOUT)
    verbosity: int = 2
    log_format: str = "json"
    seed: int | None = None
    tracing: bool = False  # --tracing, or OTEL_EXPORTER_OTLP_ENDPOINT set
    metrics_auth_token_file: pathlib.Path | None = None
    decision_log_size: int = decisions.DEFAULT_CAPACITY  # at most decisions.MAX_CAPACITY
    peers: str = ""  # NAME:PORT[,...] of the other active-active replicas; "" = none
    peer_port: int = 9004
    peer_interval_s: float = durations.parse_duration(DEFAULT_PEER_INTERVAL)
    # Mutual TLS on the peer exchange: the pool's CA, this replica's certificate and key. Without
    # them `--peers` needs `peer_insecure` (plaintext, said so loudly at start).
    peer_tls_ca: pathlib.Path | None = None
    peer_tls_cert: pathlib.Path | None = None
    peer_tls_key: pathlib.Path | None = None
    peer_insecure: bool = False

    @property
    def lease_name(self) -> str:
        """Upstream's leader-election lease id."""
        return f"epp-{self.pool_namespace}-{self.pool_name}.gateway-api-inference-extension.sigs.k8s.io"


# Every flag's default is read from here, so a default is written once: on its `ServeSettings` field.
_DEFAULTS = ServeSettings(pool_name="", pool_namespace="")


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}") from err
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} out of range 0-65535")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from err
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _positive_duration(text: str) -> float:
    value = parse_duration(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"duration must be positive, got {text!r}")
    return value


def _non_negative_duration(text: str) -> float:
    value = parse_duration(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"duration must be zero or positive, got {text!r}")
    return value


# Upstream's flag → `MetricNames` field: the vLLM sample names a model server's page is read by.
_METRIC_NAME_FLAGS = (
    ("--total-queued-requests-metric", "waiting", "waiting-requests gauge"),
    ("--total-running-requests-metric", "running", "running-requests gauge"),
    ("--kv-cache-usage-percentage-metric", "kv_usage", "KV-cache usage gauge (0..1)"),
    ("--lora-info-metric", "lora_info", "LoRA adapters gauge"),
    ("--cache-info-metric", "cache_info", "cache configuration info gauge"),
)


def _metric_names(args: argparse.Namespace) -> MetricNames:
    chosen = {
        name: getattr(args, flag.removeprefix("--").replace("-", "_")) for flag, name, _ in _METRIC_NAME_FLAGS
    }
    try:
        return dataclasses.replace(DEFAULT_NAMES, **chosen)
    except ValueError as err:
        raise ConfigError(str(err)) from err


def _body_mode(text: str) -> BodyMode:
    try:
        return BodyMode(text.strip().upper())
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"invalid body mode {text!r} (choose FULL_DUPLEX_STREAMED or BUFFERED)"
        ) from err


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Every `epp serve` flag, with upstream's names and defaults unless the help says otherwise."""
    pool = parser.add_argument_group("pool")
    pool.add_argument("--pool-name", default="", help="InferencePool to serve (required with Kubernetes)")
    pool.add_argument(
        "--pool-namespace",
        default="",
        help="namespace of the InferencePool (default: env NAMESPACE, else 'default')",
    )
    pool.add_argument(
        "--pool-group",
        default=_DEFAULTS.pool_group,
        help="API group of the pool (default %(default)s)",
    )
    pool.add_argument(
        "--pool-file",
        type=pathlib.Path,
        default=_DEFAULTS.pool_file,
        help="read the pool, pods and models from this YAML file instead of Kubernetes (reloaded on change)",
    )
    pool.add_argument(
        "--kubeconfig",
        default=_DEFAULTS.kubeconfig,
        help="kubeconfig path (default: in-cluster, then ~/.kube/config)",
    )

    net = parser.add_argument_group("serving")
    net.add_argument(
        "--host", default=_DEFAULTS.host, help="bind address for every port (default %(default)s)"
    )
    net.add_argument(
        "--grpc-port",
        type=_port,
        default=_DEFAULTS.grpc_port,
        help="ext_proc gRPC port (default %(default)s)",
    )
    net.add_argument(
        "--grpc-health-port",
        type=_port,
        default=_DEFAULTS.grpc_health_port,
        help="gRPC health port, plaintext (default %(default)s)",
    )
    net.add_argument(
        "--metrics-port",
        type=_port,
        default=_DEFAULTS.metrics_port,
        help="Prometheus /metrics port (default %(default)s)",
    )
    add_bool_flag(net, "--secure-serving", default=_DEFAULTS.secure_serving, help="serve ext_proc over TLS")
    net.add_argument(
        "--cert-path",
        type=pathlib.Path,
        default=_DEFAULTS.cert_path,
        help="directory with tls.crt and tls.key (reloaded on change); default: a self-signed certificate",
    )
    net.add_argument(
        "--body-mode",
        type=_body_mode,
        default=_DEFAULTS.body_mode,
        metavar="MODE",
        help="body mode for streams whose first message carries no protocol_config: "
        "FULL_DUPLEX_STREAMED (default) or BUFFERED",
    )
    net.add_argument(
        "--max-request-body-bytes",
        type=_positive_int,
        default=_DEFAULTS.max_request_body_bytes,
        help="larger request bodies get 400 (default %(default)s)",
    )
    net.add_argument(
        "--adapter-catalog",
        type=pathlib.Path,
        default=_DEFAULTS.adapter_catalog,
        metavar="FILE",
        help="adapter catalogue (name -> lora_path, as `epp controller` writes it): a request for a "
        "catalogue adapter that its picked pod has not registered is held until the pod loads it "
        "through vLLM's /v1/load_lora_adapter (default: off)",
    )
    net.add_argument(
        "--adapter-state-port",
        type=_port,
        default=_DEFAULTS.adapter_state_port,
        metavar="PORT",
        help="dial each pod's adapter-state sidecar (`epp sidecar`) on this port and use its pushed "
        "adapter state over the scrape while its stream is up; loads go through it "
        "(default %(default)s: off)",
    )
    net.add_argument(
        "--adapter-idle-unload",
        type=_non_negative_duration,
        default=_DEFAULTS.adapter_idle_unload_s,
        metavar="DURATION",
        help="unload an adapter the EPP loaded on demand once no request for it has gone to that pod "
        f"for this long and it holds no GPU slot there (default {DEFAULT_ADAPTER_IDLE_UNLOAD}; 0: never)",
    )
    net.add_argument(
        "--max-header-bytes",
        type=_positive_int,
        default=_DEFAULTS.max_header_bytes,
        help="larger request header sets get 400 (default %(default)s)",
    )
    net.add_argument(
        "--grace-period",
        type=parse_duration,
        default=_DEFAULTS.grace_period_s,
        help=f"on SIGTERM, after the drain period, time given to open streams to finish "
        f"(default {DEFAULT_GRACE_PERIOD})",
    )
    net.add_argument(
        "--drain-period",
        type=_non_negative_duration,
        default=_DEFAULTS.drain_period_s,
        metavar="DURATION",
        help="on SIGTERM, how long the EPP keeps routing after its health turns NOT_SERVING, so the "
        "gateway's health checks stop sending it new streams first; at least the gateway's "
        f"health-check interval times its unhealthy threshold (default {DEFAULT_DRAIN_PERIOD})",
    )
    net.add_argument(
        "--access-log-timeout",
        type=_positive_duration,
        default=_DEFAULTS.access_log_timeout_s,
        metavar="DURATION",
        help="how long a routed request whose response did not pass through the EPP waits for the "
        "gateway's access-log entry before it counts as finished anyway (default "
        f"{DEFAULT_ACCESS_LOG_TIMEOUT}; longer than the longest request)",
    )
    add_bool_flag(
        net,
        "--ha-enable-leader-election",
        default=_DEFAULTS.ha_enable_leader_election,
        help="run several replicas; only the Lease holder reports ready",
    )
    net.add_argument(
        "--peers",
        default=_DEFAULTS.peers,
        metavar="NAME:PORT[,...]",
        help="active-active replicas: the other replicas' peer address, usually the EPP's headless "
        "Service and --peer-port (resolved again every 5 s; this replica is recognised and left out). "
        "Each replica then counts the others' in-flight requests and the adapters they load. Needs "
        "a policy with scheduler state (the default or a config) (default: off)",
    )
    net.add_argument(
        "--peer-port",
        type=_port,
        default=_DEFAULTS.peer_port,
        metavar="PORT",
        help="where the peer exchange listens (mutual TLS unless --peer-insecure) (default %(default)s)",
    )
    net.add_argument(
        "--peer-interval",
        type=_positive_duration,
        default=_DEFAULTS.peer_interval_s,
        metavar="DURATION",
        help="how often each peer gets a batch (an empty one is a heartbeat; a peer silent for 50 "
        f"intervals, at least 1 s, is forgotten with its requests) (default {DEFAULT_PEER_INTERVAL})",
    )
    for flag, what in (
        ("--peer-tls-ca", "the pool's peer CA certificate (PEM): peers must present a certificate it signed"),
        ("--peer-tls-cert", "this replica's peer certificate (PEM), signed by --peer-tls-ca, with the DNS "
         "name <pool-name>.<pool-namespace>.epp-peers"),
        ("--peer-tls-key", "the key of --peer-tls-cert (PEM, unencrypted)"),
    ):  # fmt: skip
        net.add_argument(
            flag,
            type=pathlib.Path,
            default=getattr(_DEFAULTS, flag.removeprefix("--").replace("-", "_")),
            metavar="FILE",
            help=f"{what}; with --peers, all three are required unless --peer-insecure "
            "(read at start and every 30 s after)",
        )
    add_bool_flag(
        net,
        "--peer-insecure",
        default=_DEFAULTS.peer_insecure,
        help="run the peer exchange in plaintext, without certificates: anyone who reaches "
        "--peer-port can feed this replica routing events, so only behind a NetworkPolicy",
    )

    sched = parser.add_argument_group("scheduling")
    config = sched.add_mutually_exclusive_group()
    config.add_argument(
        "--config-file", type=pathlib.Path, default=None, help="EndpointPickerConfig YAML file"
    )
    config.add_argument("--config-text", default=None, help="EndpointPickerConfig YAML text")
    sched.add_argument(
        "--policy",
        choices=POLICIES,
        default=_DEFAULTS.policy,
        help="scheduling policy when no picker config is given (default: default)",
    )
    sched.add_argument(
        "--seed", type=int, default=_DEFAULTS.seed, help="seed for random choices (reproducible runs)"
    )

    metrics = parser.add_argument_group("model-server metrics")
    metrics.add_argument(
        "--refresh-metrics-interval",
        type=_positive_duration,
        default=_DEFAULTS.refresh_metrics_interval_s,
        help=f"how often each pod's /metrics is scraped (default {DEFAULT_REFRESH_METRICS_INTERVAL}: "
        "a Python scrape costs ~1.5 ms CPU)",
    )
    metrics.add_argument(
        "--metrics-staleness-threshold",
        type=_positive_duration,
        default=_DEFAULTS.metrics_staleness_threshold_s,
        help=f"metrics older than this count as stale (default {DEFAULT_STALENESS_THRESHOLD})",
    )
    metrics.add_argument(
        "--model-server-metrics-port",
        type=_port,
        default=0,  # the flag's spelling of the field's None
        help="port of the model servers' /metrics (default %(default)s: the pool's target port)",
    )
    metrics.add_argument(
        "--model-server-metrics-path",
        default=_DEFAULTS.model_server_metrics_path,
        help="path of the model servers' metrics (default %(default)s)",
    )
    metrics.add_argument(
        "--model-server-metrics-scheme",
        choices=("http", "https"),
        default=_DEFAULTS.model_server_metrics_scheme,
        help="scheme for scraping model servers (default %(default)s)",
    )
    for flag, field_name, what in _METRIC_NAME_FLAGS:
        metrics.add_argument(
            flag,
            default=getattr(_DEFAULTS.metric_names, field_name),
            metavar="NAME",
            help=f"sample name of the model servers' {what} (default %(default)s)",
        )
    add_bool_flag(
        metrics,
        "--model-server-metrics-https-insecure-skip-verify",
        default=_DEFAULTS.model_server_metrics_insecure_skip_verify,
        help="skip certificate verification when scraping over https",
    )

    obs = parser.add_argument_group("observability")
    add_bool_flag(
        obs,
        "--tracing",
        default=_DEFAULTS.tracing,
        help="export a span per routing decision over OTLP (also on when OTEL_EXPORTER_OTLP_ENDPOINT is set)",
    )
    obs.add_argument(
        "--metrics-auth-token-file",
        type=pathlib.Path,
        default=_DEFAULTS.metrics_auth_token_file,
        help="require `Authorization: Bearer <token>` on the metrics port (token read from this file)",
    )
    obs.add_argument(
        "--decision-log-size",
        type=_positive_int,
        default=_DEFAULTS.decision_log_size,
        help="decisions kept for GET /debug/decisions on the metrics port (default %(default)s)",
    )

    logs = parser.add_argument_group("logging")
    logs.add_argument(
        "--v",
        type=int,
        default=_DEFAULTS.verbosity,
        dest="v",
        help="verbosity: 2 info (default), 3 verbose, 4 debug, 5 trace",
    )
    logs.add_argument(
        "--log-format",
        choices=("json", "text"),
        default=_DEFAULTS.log_format,
        help="log line format (default %(default)s)",
    )


def settings_from_args(args: argparse.Namespace, environ: dict[str, str] | None = None) -> ServeSettings:
    """Validate and combine the parsed flags; ConfigError names the flag at fault."""
    env = dict(os.environ) if environ is None else environ
    if args.pool_file is None and not args.pool_name:
        raise ConfigError("--pool-name is required unless --pool-file is given")
    if args.cert_path is not None and not args.secure_serving:
        raise ConfigError("--cert-path needs --secure-serving=true")
    config_text: str | None = args.config_text
    if args.config_file is not None:
        try:
            config_text = args.config_file.read_text()
        except OSError as err:
            raise ConfigError(f"--config-file {args.config_file}: {err.strerror}") from err
    if args.decision_log_size > decisions.MAX_CAPACITY:
        raise ConfigError(f"--decision-log-size must be at most {decisions.MAX_CAPACITY}")
    if config_text is not None and args.policy is not None:
        raise ConfigError("--policy cannot be combined with --config-file/--config-text")
    if args.peers.strip():
        from epp.picker.peers import parse_peers

        parse_peers(args.peers)  # a malformed entry fails at start, not at the first send
        if args.ha_enable_leader_election:
            raise ConfigError(
                "--peers runs replicas active-active, --ha-enable-leader-election active-passive: choose one"
            )
    _check_peer_tls(args)
    return ServeSettings(
        pool_name=args.pool_name,
        pool_namespace=args.pool_namespace or env.get("NAMESPACE", "") or "default",
        pool_group=args.pool_group,
        pool_file=args.pool_file,
        adapter_catalog=args.adapter_catalog,
        adapter_state_port=args.adapter_state_port,
        adapter_idle_unload_s=args.adapter_idle_unload,
        kubeconfig=args.kubeconfig,
        host=args.host,
        grpc_port=args.grpc_port,
        grpc_health_port=args.grpc_health_port,
        metrics_port=args.metrics_port,
        secure_serving=args.secure_serving,
        cert_path=args.cert_path,
        refresh_metrics_interval_s=args.refresh_metrics_interval,
        metrics_staleness_threshold_s=args.metrics_staleness_threshold,
        picker_config_text=config_text,
        policy=args.policy,
        model_server_metrics_port=args.model_server_metrics_port or None,
        model_server_metrics_path=args.model_server_metrics_path,
        model_server_metrics_scheme=args.model_server_metrics_scheme,
        model_server_metrics_insecure_skip_verify=args.model_server_metrics_https_insecure_skip_verify,
        metric_names=_metric_names(args),
        body_mode=args.body_mode,
        ha_enable_leader_election=args.ha_enable_leader_election,
        max_request_body_bytes=args.max_request_body_bytes,
        max_header_bytes=args.max_header_bytes,
        grace_period_s=max(0.0, args.grace_period),
        drain_period_s=args.drain_period,
        access_log_timeout_s=args.access_log_timeout,
        verbosity=args.v,
        log_format=args.log_format,
        seed=args.seed,
        tracing=args.tracing or bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()),
        metrics_auth_token_file=args.metrics_auth_token_file,
        decision_log_size=args.decision_log_size,
        peers=args.peers.strip(),
        peer_port=args.peer_port,
        peer_interval_s=args.peer_interval,
        peer_tls_ca=args.peer_tls_ca,
        peer_tls_cert=args.peer_tls_cert,
        peer_tls_key=args.peer_tls_key,
        peer_insecure=args.peer_insecure,
    )


def _check_peer_tls(args: argparse.Namespace) -> None:
    """All three peer TLS files or none; with `--peers`, files or an explicit `--peer-insecure`."""
    files = {
        "--peer-tls-ca": args.peer_tls_ca,
        "--peer-tls-cert": args.peer_tls_cert,
        "--peer-tls-key": args.peer_tls_key,
    }
    given = [flag for flag, path in files.items() if path is not None]
    if not given:
        if args.peers.strip() and not args.peer_insecure:
            raise ConfigError(
                "--peers needs --peer-tls-ca, --peer-tls-cert and --peer-tls-key (mutual TLS between "
                "replicas), or --peer-insecure to run the peer exchange in plaintext"
            )
        return
    if len(given) < len(files):
        missing = [flag for flag in files if flag not in given]
        raise ConfigError(f"{', '.join(given)} needs {' and '.join(missing)} too")
    if args.peer_insecure:
        raise ConfigError("--peer-insecure and --peer-tls-* contradict each other: choose one")
    if not args.peers.strip():
        raise ConfigError(f"{', '.join(given)} only apply with --peers")
    if not args.pool_name:
        raise ConfigError("--peer-tls-* need --pool-name: the peer certificates name the pool")
