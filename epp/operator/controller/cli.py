"""`epp controller`: reconcile LLMInferenceServices in one namespace until stopped.

Each pass lists the namespace's LLMInferenceServices, reconciles each
(`epp.operator.controller.reconcile`), then watches from the list's resourceVersion and reconciles
every change at once, until the watch ends after `--resync-period` and the next pass
begins (so status, e.g. ready replicas and adapters loaded on the pods, follows within one
period). Reconciles run on `--workers` threads, one at a time per object, so an object whose
pods are slow to answer the adapter survey never delays another. A reconcile writes only
what differs, so our own status writes coming back as events cost reads only. List and
watch errors (410 Gone included) relist after a doubling backoff; a failed reconcile is
logged and retried on the next pass. SIGTERM or SIGINT ends the loop.
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
from epp.errors import ConfigError
from epp.kube.api import KubeApi, KubeApiError, Obj, load_api_client
from epp.operator.controller.adapter_survey import DEFAULT_TIMEOUT_S, AdapterSurvey
from epp.operator.controller.reconcile import SERVICE_REF, Reconciler
from epp.operator.controller.render import RenderSettings
from epp.operator.controller.workqueue import WorkQueue

log = logging.getLogger(__name__)

BACKOFF_INITIAL_S = 0.2
BACKOFF_MAX_S = 10.0


def _positive_duration(text: str) -> float:
    value = parse_duration(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"duration must be > 0, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
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
    parser.add_argument(
        "--adapter-probe-timeout",
        type=_positive_duration,
        default=DEFAULT_TIMEOUT_S,
        help="seconds (or 500ms) to wait for a model-server pod's /v1/models in the adapter survey",
    )
    parser.add_argument("--workers", type=_positive_int, default=4, help="objects reconciled in parallel")
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
    survey = AdapterSurvey(timeout_s=args.adapter_probe_timeout)
    reconciler = Reconciler(api, settings, survey=survey)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        if args.once:
            return _once(reconciler, args.namespace)
        _run_until_stopped(api, reconciler, args, stop)
        return 0
    finally:
        survey.close()


def _once(reconciler: Reconciler, namespace: str) -> int:
    try:
        outcomes = reconciler.reconcile_namespace(namespace)
    except (KubeApiError, OSError, urllib3.exceptions.HTTPError) as error:
        log.error("listing LLMInferenceServices failed", extra={"error": str(error)})
        return 1
    return 1 if any(o.reason in ("InvalidSpec", "ApplyFailed") for o in outcomes.values()) else 0


def _run_until_stopped(
    api: KubeApi, reconciler: Reconciler, args: argparse.Namespace, stop: threading.Event
) -> None:
    def reconcile(obj: Obj) -> None:
        try:
            reconciler.reconcile(obj)
        except (KubeApiError, OSError, urllib3.exceptions.HTTPError) as error:
            name = obj["metadata"]["name"]
            log.warning("reconcile failed, retried next pass", extra={"object": name, "error": str(error)})

    queue: WorkQueue[Obj] = WorkQueue(reconcile, args.workers)
    backoff_s = BACKOFF_INITIAL_S
    try:
        while not stop.is_set():
            try:
                _pass(api, queue, args.namespace, max(1, round(args.resync_period)), stop)
                backoff_s = BACKOFF_INITIAL_S
            except (KubeApiError, OSError, urllib3.exceptions.HTTPError) as error:
                log.warning("reconcile pass failed", extra={"error": str(error), "retry_in_s": backoff_s})
                stop.wait(backoff_s)
                backoff_s = min(backoff_s * 2, BACKOFF_MAX_S)
    finally:
        queue.shutdown()


def _pass(api: KubeApi, queue: WorkQueue[Obj], namespace: str, watch_s: int, stop: threading.Event) -> None:
    """List and queue everything, then queue each change until the watch ends (the resync)."""
    items, resource_version = api.list_with_version(SERVICE_REF, namespace)
    for obj in items:
        queue.add(str(obj["metadata"]["name"]), obj)
    for event_type, obj in api.watch(SERVICE_REF, namespace, resource_version, watch_s):
        if stop.is_set():
            return
        if event_type in ("ADDED", "MODIFIED"):
            queue.add(str(obj["metadata"]["name"]), obj)
