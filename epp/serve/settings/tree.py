"""`epp serve`'s settings as a tree: one frozen dataclass per concern, each field with its one default.

Flag names are upstream's v1 kebab-case names. The metrics refresh default is 100ms rather than
upstream's 50ms: a Python scrape costs about 1.5 ms of CPU per pod, so 50ms would spend ~3% of a core
per pod on scraping alone, while 100ms still sees queue changes well within one request's lifetime.
"""

from __future__ import annotations

import argparse
import pathlib
from dataclasses import dataclass, field

from epp.cliutil import non_negative_duration, positive_int
from epp.picker import wire
from epp.picker.extproc.stream import BodyMode
from epp.picker.observability import decisions
from epp.picker.scrape.parse import DEFAULT_NAMES, MetricNames
from epp.serve.settings.flags import (
    FLAG,
    SUB_FLAGS,
    Flag,
    concern,
    duration,
    duration_or_zero,
    option,
    optional_path,
    port_number,
    required,
    size,
    stripped,
)

POLICIES = ("default", "round-robin", "random", "least-queue", "gie-v0.3", "gie-v1")
GROUP = "group"  # metadata key on `ServeSettings`' fields: the concern's argument group in `--help`


@concern
class PoolSettings:
    """Which InferencePool is served, and where its pods are read from."""

    name: str = field(
        metadata=required("--pool-name", "InferencePool to serve (required with Kubernetes)", absent="")
    )
    namespace: str = field(
        metadata=required(
            "--pool-namespace",
            "namespace of the InferencePool (default: env NAMESPACE, else 'default')",
            absent="",
        )
    )
    group: str = option(
        default="inference.networking.k8s.io",
        flag="--pool-group",
        help="API group of the pool (default %(default)s)",
    )
    file: pathlib.Path | None = optional_path(
        default=None,
        flag="--pool-file",
        help="read the pool, pods and models from this YAML file instead of Kubernetes (reloaded on change)",
    )
    kubeconfig: str | None = option(
        default=None, flag="--kubeconfig", help="kubeconfig path (default: in-cluster, then ~/.kube/config)"
    )


def _body_mode(text: str) -> BodyMode:
    try:
        return BodyMode(text.strip().upper())
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"invalid body mode {text!r} (choose FULL_DUPLEX_STREAMED or BUFFERED)"
        ) from err


@concern
class ListenSettings:
    """The ports the EPP listens on, ext_proc's TLS, and what one ext_proc stream may carry."""

    host: str = option(
        default="0.0.0.0", flag="--host", help="bind address for every port (default %(default)s)"
    )
    grpc_port: int = option(
        default=9002, flag="--grpc-port", help="ext_proc gRPC port (default %(default)s)", parse=port_number
    )
    grpc_health_port: int = option(
        default=9003,
        flag="--grpc-health-port",
        help="gRPC health port, plaintext (default %(default)s)",
        parse=port_number,
    )
    metrics_port: int = option(
        default=9090,
        flag="--metrics-port",
        help="Prometheus /metrics port (default %(default)s)",
        parse=port_number,
    )
    secure_serving: bool = option(default=True, flag="--secure-serving", help="serve ext_proc over TLS")
    cert_path: pathlib.Path | None = optional_path(
        default=None,
        flag="--cert-path",
        help="directory with tls.crt and tls.key (reloaded on change); default: a self-signed certificate",
    )
    body_mode: BodyMode = option(
        default=BodyMode.FULL_DUPLEX_STREAMED,
        flag="--body-mode",
        help="body mode for streams whose first message carries no protocol_config: "
        "FULL_DUPLEX_STREAMED (default) or BUFFERED",
        parse=_body_mode,
        metavar="MODE",
    )
    max_request_body_bytes: int = size(
        default=wire.DEFAULT_MAX_REQUEST_BODY_BYTES,
        flag="--max-request-body-bytes",
        help="larger request bodies get 400 (default %(default)s)",
    )
    max_header_bytes: int = size(
        default=wire.DEFAULT_MAX_HEADER_BYTES,
        flag="--max-header-bytes",
        help="larger request header sets get 400 (default %(default)s)",
    )
    access_log_timeout_s: float = duration(
        default="10m",
        flag="--access-log-timeout",
        help="how long a routed request whose response did not pass through the EPP waits for the "
        "gateway's access-log entry before it counts as finished anyway (default "
        "%(default)s; longer than the longest request)",
        metavar="DURATION",
    )


@concern
class DrainSettings:
    """What SIGTERM does: keep routing while the gateway notices, then give open streams time."""

    # Envoy's health check on the EPP (what `epp envoy-config` writes) runs every second with a 1 s
    # timeout and one failure to mark it down: 5 s covers that with room for a slower gateway.
    drain_period_s: float = duration(
        default="5s",
        flag="--drain-period",
        help="on SIGTERM, how long the EPP keeps routing after its health turns NOT_SERVING, so the "
        "gateway's health checks stop sending it new streams first; at least the gateway's "
        "health-check interval times its unhealthy threshold (default %(default)s)",
        parse=non_negative_duration,
        metavar="DURATION",
    )
    grace_period_s: float = duration(
        default="10s",
        flag="--grace-period",
        help="on SIGTERM, after the drain period, time given to open streams to finish (default %(default)s)",
        parse=duration_or_zero,
    )


@concern
class AdapterSettings:
    """On-demand LoRA adapters: the catalogue, the pods' sidecar, and unloading idle ones."""

    catalog: pathlib.Path | None = optional_path(
        default=None,
        flag="--adapter-catalog",
        help="adapter catalogue (name -> lora_path, as `epp controller` writes it): a request for a "
        "catalogue adapter that its picked pod has not registered is held until the pod loads it "
        "through vLLM's /v1/load_lora_adapter (default: off)",
        metavar="FILE",
    )
    state_port: int = option(
        default=0,
        flag="--adapter-state-port",
        help="dial each pod's adapter-state sidecar (`epp sidecar`) on this port and use its pushed "
        "adapter state over the scrape while its stream is up; loads go through it "
        "(default %(default)s: off)",
        parse=port_number,
        metavar="PORT",
    )
    idle_unload_s: float = duration(
        default="10m",
        flag="--adapter-idle-unload",
        help="unload an adapter the EPP loaded on demand once no request for it has gone to that pod "
        "for this long and it holds no GPU slot there (default %(default)s; 0: never)",
        parse=non_negative_duration,
        metavar="DURATION",
    )


_PEER_TLS_FILES = (
    "; with --peers, all three are required unless --peer-insecure (read at start and every 30 s after)"
)


@concern
class PeerSettings:
    """Active-active replicas: who the peers are, how often they hear from this one, and its TLS."""

    addresses: str = option(
        default="",
        flag="--peers",
        help="active-active replicas: the other replicas' peer address, usually the EPP's headless "
        "Service and --peer-port (resolved again every 5 s; this replica is recognised and left out). "
        "Each replica then counts the others' in-flight requests and the adapters they load. Needs "
        "a policy with scheduler state (the default or a config) (default: off)",
        parse=stripped,
        metavar="NAME:PORT[,...]",
    )
    selector: str = option(
        default="",
        flag="--peer-selector",
        help="active-active replicas found through the Kubernetes API instead of DNS: the Pods of "
        "the pool's namespace with these labels (each one's IP on --peer-port, Ready or not, none "
        "being deleted; listed again every 5 s; this replica is recognised and left out). Uses the "
        "list on pods the EPP is granted anyway; not with --pool-file (default: off)",
        parse=stripped,
        metavar="KEY=VALUE[,...]",
    )
    port: int = option(
        default=9004,
        flag="--peer-port",
        help="where the peer exchange listens (mutual TLS unless --peer-insecure) (default %(default)s)",
        parse=port_number,
        metavar="PORT",
    )
    interval_s: float = duration(
        default="100ms",
        flag="--peer-interval",
        help="how often each peer gets a batch (an empty one is a heartbeat; a peer silent for 50 "
        "intervals, at least 1 s, is forgotten with its requests) (default %(default)s)",
        metavar="DURATION",
    )
    tls_ca: pathlib.Path | None = optional_path(
        default=None,
        flag="--peer-tls-ca",
        help="the pool's peer CA certificate (PEM): peers must present a certificate it signed"
        + _PEER_TLS_FILES,
        metavar="FILE",
    )
    tls_cert: pathlib.Path | None = optional_path(
        default=None,
        flag="--peer-tls-cert",
        help="this replica's peer certificate (PEM), signed by --peer-tls-ca, with the DNS "
        "name <pool-name>.<pool-namespace>.epp-peers" + _PEER_TLS_FILES,
        metavar="FILE",
    )
    tls_key: pathlib.Path | None = optional_path(
        default=None,
        flag="--peer-tls-key",
        help="the key of --peer-tls-cert (PEM, unencrypted)" + _PEER_TLS_FILES,
        metavar="FILE",
    )
    insecure: bool = option(
        default=False,
        flag="--peer-insecure",
        help="run the peer exchange in plaintext, without certificates: anyone who reaches "
        "--peer-port can feed this replica routing events, so only behind a NetworkPolicy",
    )

    @property
    def enabled(self) -> bool:
        """Active-active: peers by DNS name (`--peers`) or by Pod labels (`--peer-selector`)."""
        return bool(self.addresses or self.selector)

    @property
    def flag(self) -> str:
        """The flag that turned active-active on, for messages."""
        return "--peers" if self.addresses else "--peer-selector"


@concern
class LeaderSettings:
    """Active-passive replicas: only the Lease holder reports ready."""

    enabled: bool = option(
        default=False,
        flag="--ha-enable-leader-election",
        help="run several replicas; only the Lease holder reports ready",
    )


@concern
class SchedulingSettings:
    """How an endpoint is picked: an EndpointPickerConfig, or a named policy."""

    picker_config_text: str | None = field(
        default=None,
        metadata={
            FLAG: Flag(
                "--config-text",
                "EndpointPickerConfig YAML text",
                file_flag="--config-file",
                file_help="EndpointPickerConfig YAML file",
            )
        },
    )
    policy: str | None = option(
        default=None,
        flag="--policy",
        help="scheduling policy when no picker config is given (default: default)",
        choices=POLICIES,
    )
    seed: int | None = option(
        default=None, flag="--seed", help="seed for random choices (reproducible runs)", parse=int
    )


def _metric_name(flag: str, what: str) -> Flag:
    return Flag(flag, f"sample name of the model servers' {what} (default %(default)s)", metavar="NAME")


# Upstream's metric-name flags, one per `MetricNames` field: the sample names a page is read by.
_METRIC_NAME_FLAGS = {
    "waiting": _metric_name("--total-queued-requests-metric", "waiting-requests gauge"),
    "running": _metric_name("--total-running-requests-metric", "running-requests gauge"),
    "kv_usage": _metric_name("--kv-cache-usage-percentage-metric", "KV-cache usage gauge (0..1)"),
    "lora_info": _metric_name("--lora-info-metric", "LoRA adapters gauge"),
    "cache_info": _metric_name("--cache-info-metric", "cache configuration info gauge"),
}


@concern
class ScrapeSettings:
    """How often and where each model server's /metrics page is read, and which samples on it."""

    refresh_metrics_interval_s: float = duration(
        default="100ms",
        flag="--refresh-metrics-interval",
        help="how often each pod's /metrics is scraped "
        "(default %(default)s: a Python scrape costs ~1.5 ms CPU)",
    )
    staleness_threshold_s: float = duration(
        default="2s",
        flag="--metrics-staleness-threshold",
        help="metrics older than this count as stale (default %(default)s)",
    )
    port: int | None = option(  # None: the endpoint's own port
        default=None,
        flag="--model-server-metrics-port",
        help="port of the model servers' /metrics (default %(default)s: the pool's target port)",
        parse=port_number,
        absent=0,
    )
    path: str = option(
        default="/metrics",
        flag="--model-server-metrics-path",
        help="path of the model servers' metrics (default %(default)s)",
    )
    scheme: str = option(
        default="http",
        flag="--model-server-metrics-scheme",
        help="scheme for scraping model servers (default %(default)s)",
        choices=("http", "https"),
    )
    insecure_skip_verify: bool = option(
        default=True,
        flag="--model-server-metrics-https-insecure-skip-verify",
        help="skip certificate verification when scraping over https",
    )
    metric_names: MetricNames = field(default=DEFAULT_NAMES, metadata={SUB_FLAGS: _METRIC_NAME_FLAGS})


@concern
class ObservabilitySettings:
    """Tracing, the metrics port's token, and the decision log behind /debug/decisions."""

    tracing: bool = option(  # also on when OTEL_EXPORTER_OTLP_ENDPOINT is set
        default=False,
        flag="--tracing",
        help="export a span per routing decision over OTLP (also on when OTEL_EXPORTER_OTLP_ENDPOINT is set)",
    )
    metrics_auth_token_file: pathlib.Path | None = optional_path(
        default=None,
        flag="--metrics-auth-token-file",
        help="require `Authorization: Bearer <token>` on the metrics port (token read from this file)",
    )
    decision_log_size: int = option(  # at most decisions.MAX_CAPACITY
        default=decisions.DEFAULT_CAPACITY,
        flag="--decision-log-size",
        help="decisions kept for GET /debug/decisions on the metrics port (default %(default)s)",
        parse=positive_int,
    )


@concern
class LogSettings:
    """What the EPP logs and how each line looks."""

    verbosity: int = option(
        default=2, flag="--v", help="verbosity: 2 info (default), 3 verbose, 4 debug, 5 trace", parse=int
    )
    log_format: str = option(
        default="json",
        flag="--log-format",
        help="log line format (default %(default)s)",
        choices=("json", "text"),
    )


@dataclass(frozen=True, slots=True)
class ServeSettings:
    """Everything `epp serve` is told, one member per concern; each concern is one `--help` group."""

    pool: PoolSettings = field(metadata={GROUP: "pool"})
    listen: ListenSettings = field(default_factory=ListenSettings, metadata={GROUP: "serving"})
    drain: DrainSettings = field(default_factory=DrainSettings, metadata={GROUP: "drain"})
    scheduling: SchedulingSettings = field(default_factory=SchedulingSettings, metadata={GROUP: "scheduling"})
    scrape: ScrapeSettings = field(default_factory=ScrapeSettings, metadata={GROUP: "model-server metrics"})
    adapters: AdapterSettings = field(default_factory=AdapterSettings, metadata={GROUP: "adapters"})
    peers: PeerSettings = field(default_factory=PeerSettings, metadata={GROUP: "peers (active-active)"})
    leader: LeaderSettings = field(
        default_factory=LeaderSettings, metadata={GROUP: "leader election (active-passive)"}
    )
    observability: ObservabilitySettings = field(
        default_factory=ObservabilitySettings, metadata={GROUP: "observability"}
    )
    logging: LogSettings = field(default_factory=LogSettings, metadata={GROUP: "logging"})

    @property
    def lease_name(self) -> str:
        """Upstream's leader-election lease id."""
        return f"epp-{self.pool.namespace}-{self.pool.name}.gateway-api-inference-extension.sigs.k8s.io"
