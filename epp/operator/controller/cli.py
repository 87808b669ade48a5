"""`epp controller`: reconcile LLMInferenceServices in one namespace until stopped.

Each pass lists the namespace's LLMInferenceServices, reconciles each
(`epp.operator.controller.reconcile`), then watches from the list's resourceVersion and reconciles
every change at once, until the watch ends after `--resync-period` and the next pass
begins (so status, e.g. ready replicas and adapters loaded on the pods, follows within one
period). Everything runs on one asyncio loop: the pass is one task and reconciles run on
`--workers` worker tasks (`workqueue`), one at a time per object, so an object whose pods
are slow to answer the adapter survey never delays another. A reconcile writes only what
differs, so our own status writes coming back as events cost reads only. List and watch
errors (410 Gone included) relist after a doubling backoff; a failed reconcile is logged
and retried on the next pass. SIGTERM or SIGINT cancels the watch at once, lets running
reconciles finish and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

from epp.cliutil import positive_duration, positive_int
from epp.errors import ConfigError
from epp.kube.api import API_ERRORS, LISTED, AsyncKubeApi, Obj, list_then_watch, load_api_client
from epp.operator.controller.adapter_survey import DEFAULT_TIMEOUT_S, AdapterSurvey
from epp.operator.controller.reconcile import SERVICE_REF, Reconciler
from epp.operator.controller.render import RenderSettings
from epp.operator.controller.workqueue import WorkQueue

log = logging.getLogger(__name__)

BACKOFF_INITIAL_S = 0.2
BACKOFF_MAX_S = 10.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

T = TypeVar("T")


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
        type=positive_duration,
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
        type=positive_duration,
        default=DEFAULT_TIMEOUT_S,
        help="seconds (or 500ms) to wait for a model-server pod's /v1/models in the adapter survey",
    )
    parser.add_argument("--workers", type=positive_int, default=4, help="objects reconciled in parallel")
    parser.add_argument("--once", action="store_true", help="one pass, then exit (non-zero if any failed)")
    parser.add_argument("--log-level", default="INFO", help="Python logging level")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper())
    try:
        api = AsyncKubeApi(load_api_client(args.kubeconfig))
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
    return asyncio.run(_main(api, reconciler, args))


async def _main(api: AsyncKubeApi, reconciler: Reconciler, args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stop.set)
    try:
        if args.once:
            # Stopped before the pass finished: not everything was reconciled.
            outcome = await _unless_stopped(_once(reconciler, args.namespace), stop)
            return 1 if outcome is None else outcome
        await _run_until_stopped(api, reconciler, args, stop)
        return 0
    finally:
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)


async def _unless_stopped(work: Coroutine[Any, Any, T], stop: asyncio.Event) -> T | None:
    """`work`'s result, or None if `stop` was set first (then `work` is cancelled)."""
    async with asyncio.TaskGroup() as tasks:
        job = tasks.create_task(work)
        stopped = tasks.create_task(stop.wait())
        await asyncio.wait({job, stopped}, return_when=asyncio.FIRST_COMPLETED)
        job.cancel()
        stopped.cancel()
    return None if job.cancelled() else job.result()


async def _once(reconciler: Reconciler, namespace: str) -> int:
    try:
        outcomes = await reconciler.reconcile_namespace(namespace)
    except API_ERRORS as error:
        log.error("listing LLMInferenceServices failed", extra={"error": str(error)})
        return 1
    return 1 if any(o.reason in ("InvalidSpec", "ApplyFailed") for o in outcomes.values()) else 0


async def _run_until_stopped(
    api: AsyncKubeApi, reconciler: Reconciler, args: argparse.Namespace, stop: asyncio.Event
) -> None:
    async def reconcile(obj: Obj) -> None:
        try:
            await reconciler.reconcile(obj)
        except API_ERRORS as error:
            name = obj["metadata"]["name"]
            log.warning("reconcile failed, retried next pass", extra={"object": name, "error": str(error)})

    queue: WorkQueue[Obj] = WorkQueue(reconcile, args.workers)
    watch_s = max(1, round(args.resync_period))
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(queue.run())
        passes = tasks.create_task(_follow(api, queue, args.namespace, watch_s))
        await stop.wait()
        passes.cancel()
        await queue.shutdown()


async def _follow(api: AsyncKubeApi, queue: WorkQueue[Obj], namespace: str, watch_s: int) -> None:
    """Pass after pass: queue every object listed and every change until the watch ends (the resync).

    Returns only when cancelled; a failed pass is retried after a doubling backoff.
    """
    backoff_s = BACKOFF_INITIAL_S
    while True:
        try:
            async for event_type, obj in list_then_watch(api, SERVICE_REF, namespace, watch_s):
                if event_type in (LISTED, "ADDED", "MODIFIED"):
                    queue.add(str(obj["metadata"]["name"]), obj)
            backoff_s = BACKOFF_INITIAL_S
        except API_ERRORS as error:
            log.warning("reconcile pass failed", extra={"error": str(error), "retry_in_s": backoff_s})
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, BACKOFF_MAX_S)
