"""`epp envoy-config`: print (or write) an Envoy bootstrap that routes through the EPP.

Example: `epp envoy-config --pool-file examples/pool.yaml --epp-address 127.0.0.1:9002 --output envoy.yaml`
then `envoy -c envoy.yaml`. The pool file supplies the failure mode and the pods for the FailOpen
pool cluster; `--failure-mode` and `--pool-endpoint` override it.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from epp.cliutil import add_bool_flag, parse_duration
from epp.errors import ConfigError
from epp.picker.datastore.types import FailureMode
from epp.picker.extproc.stream import BodyMode
from epp.picker.sources.file import parse_pool_file
from epp.tools.envoy.bootstrap import (
    BODY_MODES,
    DEFAULT_EPP,
    DEFAULT_EPP_HEALTH_PORT,
    EnvoyOptions,
    EppEndpoint,
    HostPort,
    RoutingMode,
    Upstream,
    build_bootstrap,
    parse_host_port,
    render_yaml,
)

_FAILURE_MODES = {"FailOpen": FailureMode.FAIL_OPEN, "FailClose": FailureMode.FAIL_CLOSE}


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mode",
        choices=[m.value for m in RoutingMode],
        default=RoutingMode.EPP.value,
        help="epp: route through the EPP; round-robin: a plain cluster of the pods (default epp)",
    )
    parser.add_argument(
        "--upstream",
        choices=[u.value for u in Upstream],
        default=Upstream.OVERRIDE_HOST.value,
        help="override-host: cluster of the pool's pods, understands fallback lists (default);"
        " original-dst: dial the one ip:port the EPP names (needs maxNumOfEndpoints 1)",
    )
    parser.add_argument("--listen-address", default="0.0.0.0", help="listener address (default 0.0.0.0)")
    parser.add_argument("--listen-port", type=int, default=8081, help="listener port (default 8081)")
    parser.add_argument(
        "--admin-port", type=int, default=0, help="admin port on 127.0.0.1 (default 0 = ephemeral)"
    )
    parser.add_argument(
        "--epp-address",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help=f"EPP ext_proc HOST:PORT (default {DEFAULT_EPP.host}:{DEFAULT_EPP.port}); repeat it for "
        "several EPP replicas, each health-checked on --epp-health-port",
    )
    parser.add_argument(
        "--epp-health-port",
        type=int,
        default=DEFAULT_EPP_HEALTH_PORT,
        help="EPP gRPC health port for Envoy's active check (0 = no check; default %(default)s)",
    )
    add_bool_flag(parser, "--epp-tls", default=True, help="TLS to the EPP, certificate not verified")
    defaults = EnvoyOptions()
    parser.add_argument(
        "--body-mode",
        choices=[m.value for m in BODY_MODES],
        default=defaults.body_mode.value,
        help="ext_proc request body mode (default BUFFERED: Envoy keeps the body while the EPP routes, "
        "so a request whose EPP dies mid-routing fails open; FULL_DUPLEX_STREAMED hands it over)",
    )
    parser.add_argument(
        "--max-request-body-bytes",
        type=int,
        default=defaults.max_request_body_bytes,
        help="the most request body Envoy buffers; larger bodies get 413. Keep it equal to `epp serve "
        f"--max-request-body-bytes` (default {defaults.max_request_body_bytes})",
    )
    add_bool_flag(
        parser,
        "--process-responses",
        default=False,
        help="also send response headers and bodies through the EPP, for its token-usage metrics and "
        "first-byte TTFT. Costs EPP CPU for every streamed chunk (0.06-0.15 ms per token, more at low "
        "load; benchmarks/soak.py), and an EPP crash or restart then cuts the responses in flight",
    )
    add_bool_flag(
        parser,
        "--access-log",
        default=True,
        help="send Envoy's gRPC access log of routed requests to the EPP, so it learns when, where and "
        "how each request ended (in-flight counts, latency and status metrics); batched, off the "
        "request path",
    )
    parser.add_argument("--pool-file", type=pathlib.Path, help="pool file: failure mode and pod endpoints")
    parser.add_argument(
        "--failure-mode", choices=sorted(_FAILURE_MODES), help="override the pool's failureMode"
    )
    parser.add_argument(
        "--pool-endpoint",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a pod endpoint for the pool's cluster (repeatable; replaces the pool file's pods)",
    )
    parser.add_argument(
        "--stream-idle-timeout",
        type=parse_duration,
        default=defaults.stream_idle_timeout_s,
        help=f"default {defaults.stream_idle_timeout_s:g}s; keep it above the EPP's queue TTL",
    )
    parser.add_argument(
        "--route-timeout",
        type=parse_duration,
        default=defaults.route_timeout_s,
        help=f"default {defaults.route_timeout_s:g}s",
    )
    parser.add_argument(
        "--message-timeout",
        type=parse_duration,
        default=defaults.message_timeout_s,
        help=f"BUFFERED only; default {defaults.message_timeout_s:g}s",
    )
    parser.add_argument(
        "--max-message-timeout",
        type=parse_duration,
        default=defaults.max_message_timeout_s,
        help="BUFFERED only: the longest the EPP may extend one message's timeout while its request "
        f"waits in a queue or for an adapter load; default {defaults.max_message_timeout_s:g}s",
    )
    parser.add_argument("--output", "-o", type=pathlib.Path, help="write here instead of stdout")


def options_from_args(args: argparse.Namespace) -> EnvoyOptions:
    """Raises ConfigError for bad values or an unreadable pool file."""
    failure_mode = FailureMode.FAIL_CLOSE
    endpoints: list[HostPort] = []
    if args.pool_file is not None:
        try:
            text = args.pool_file.read_text()
        except OSError as err:
            raise ConfigError(f"cannot read pool file {args.pool_file}: {err.strerror}") from err
        pool_file = parse_pool_file(text, source=str(args.pool_file), pool_name="", pool_namespace="")
        failure_mode = pool_file.pool.failure_mode
        endpoints = [
            HostPort(pod.ip, port)
            for pod in pool_file.pods
            if pod.ready and not pod.deleting and pod.ip
            for port in pool_file.pool.target_ports
        ]
    if args.failure_mode is not None:
        failure_mode = _FAILURE_MODES[args.failure_mode]
    if args.pool_endpoint:
        endpoints = [parse_host_port(text) for text in args.pool_endpoint]
    for port in (args.listen_port, args.admin_port, args.epp_health_port):
        if not 0 <= port < 65536:
            raise ConfigError(f"port out of range: {port}")
    if not 0 < args.max_request_body_bytes < 1 << 32:
        raise ConfigError(f"--max-request-body-bytes out of range: {args.max_request_body_bytes}")
    epps = [parse_host_port(text) for text in args.epp_address] or [DEFAULT_EPP]
    health_port = args.epp_health_port or None
    options = EnvoyOptions(
        listen_address=args.listen_address,
        listen_port=args.listen_port,
        admin_port=args.admin_port,
        mode=RoutingMode(args.mode),
        upstream=Upstream(args.upstream),
        epp=epps[0],
        epp_health_port=health_port,
        more_epps=tuple(EppEndpoint(address, health_port) for address in epps[1:]),
        epp_tls=args.epp_tls,
        body_mode=BodyMode(args.body_mode),
        max_request_body_bytes=args.max_request_body_bytes,
        process_responses=args.process_responses,
        access_log=args.access_log,
        failure_mode=failure_mode,
        pool_endpoints=tuple(endpoints),
        stream_idle_timeout_s=args.stream_idle_timeout,
        max_message_timeout_s=args.max_message_timeout,
        route_timeout_s=args.route_timeout,
        message_timeout_s=args.message_timeout,
    )
    return options


def run(args: argparse.Namespace) -> int:
    try:
        text = render_yaml(build_bootstrap(options_from_args(args)))
    except ConfigError as err:
        print(f"epp envoy-config: {err}", file=sys.stderr)
        return 2
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text)
    return 0
