"""`epp controller`: reconcile LLMInferenceServices in one namespace until stopped.

Each pass lists the namespace's LLMInferenceServices, reconciles each
(`epp.controller.reconcile`), then watches from the list's resourceVersion and reconciles
every change at once, until the watch ends after `--resync-period` and the next pass
begins (so status, e.g. ready replicas, follows within one period). A reconcile writes only
what differs, so our own status writes coming back as events cost reads only. API errors
(410 Gone included) relist after a doubling backoff. SIGTERM or SIGINT ends the loop.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from types import FrameType

import urllib3

from epp.cliutil import parse_duration
from epp.controller.kubeapi import KubeApi, KubeApiError
from epp.controller.reconcile import SERVICE_REF, Reconciler
from epp.controller.render import RenderSettings
from epp.errors import ConfigError
from epp.sources.kube import load_api_client

log = logging.getLogger(__name__)

BACKOFF_INITIAL_S = 0.2
BACKOFF_MAX_S = 10.0


def _positive_duration(text: str) -> float:
    value = parse_duration(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"duration must be > 0, got {text!r}")
    return value


def configure_parser(parser: argparse.ArgumentParser) -> None:
    defaults = RenderSettings()
    parser.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then ~/.kube)"
    )
    parser.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE", "default"),
        help="namespace to reconcile (default: $POD_NAMESPACE or default)",
    )
    parser.add_argument(
        "--resync-period",
        type=_positive_duration,
        default=30.0,
        help="seconds (or 30s) between full passes; changes are reconciled at once through a watch",
    )
    parser.add_argument("--vllm-image", default=defaults.vllm_image, help="model-server image")
    parser.add_argument("--epp-image", default=defaults.epp_image, help="endpoint-picker image")
    parser.add_argument("--s3-fetch-image", default=defaults.s3_fetch_image, help="image with the aws CLI")
    parser.add_argument(
        "--sidecar-port",
        type=int,
        default=defaults.sidecar_port,
        help="adapter-state sidecar port in model-server pods (0: no sidecar)",
    )
    parser.add_argument("--once", action="store_true", help="one pass, then exit (non-zero if any failed)")
    parser.add_argument("--log-level", default="INFO", help="Python logging level")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper())
    try:
        api = KubeApi(load_api_client(args.kubeconfig))
    except ConfigError as error:
        log.error("cannot start", extra={"error": str(error)})
        return 2
    settings = RenderSettings(
        vllm_image=args.vllm_image,
        epp_image=args.epp_image,
        s3_fetch_image=args.s3_fetch_image,
        sidecar_port=args.sidecar_port,
    )
    reconciler = Reconciler(api, settings)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.once:
        try:
            outcomes = reconciler.reconcile_namespace(args.namespace)
        except (KubeApiError, OSError, urllib3.exceptions.HTTPError) as error:
            log.error("listing LLMInferenceServices failed", extra={"error": str(error)})
            return 1
        return 1 if any(o.reason in ("InvalidSpec", "ApplyFailed") for o in outcomes.values()) else 0
    backoff_s = BACKOFF_INITIAL_S
    while not stop.is_set():
        try:
            _pass(api, reconciler, args.namespace, max(1, round(args.resync_period)), stop)
            backoff_s = BACKOFF_INITIAL_S
        except (KubeApiError, OSError, urllib3.exceptions.HTTPError) as error:
            log.warning("reconcile pass failed", extra={"error": str(error), "retry_in_s": backoff_s})
            stop.wait(backoff_s)
            backoff_s = min(backoff_s * 2, BACKOFF_MAX_S)
    return 0


def _pass(api: KubeApi, reconciler: Reconciler, namespace: str, watch_s: int, stop: threading.Event) -> None:
    """List and reconcile everything, then reconcile each change until the watch ends (the resync)."""
    items, resource_version = api.list_with_version(SERVICE_REF, namespace)
    for obj in items:
        reconciler.reconcile(obj)
    for event_type, obj in api.watch(SERVICE_REF, namespace, resource_version, watch_s):
        if stop.is_set():
            return
        if event_type in ("ADDED", "MODIFIED"):
            reconciler.reconcile(obj)
