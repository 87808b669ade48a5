"""`epp sim`: flags → SimSettings, then serve until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys

from aiohttp import web

from epp.cliutil import add_bool_flag, parse_duration, positive_int
from epp.clock import SystemClock
from epp.tools.sim.engine import EngineConfig
from epp.tools.sim.server import SimServer, SimSettings
from epp.tools.vllm_pod.cost import LatencyCost

log = logging.getLogger(__name__)

# How long in-flight requests may run on after SIGTERM/SIGINT.
SHUTDOWN_GRACE_S = 2.0


def parse_lora_module(text: str) -> tuple[str, str]:
    """`name=path` or vLLM's JSON form `{"name": ..., "path": ...}`."""
    if text.lstrip().startswith("{"):
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as err:
            raise argparse.ArgumentTypeError(f"invalid JSON LoRA module {text!r}: {err}") from None
        name, path = (
            spec.get("name") if isinstance(spec, dict) else None,
            spec.get("path") if isinstance(spec, dict) else None,
        )
        if not isinstance(name, str) or not isinstance(path, str) or not name:
            raise argparse.ArgumentTypeError(f"JSON LoRA module needs string 'name' and 'path': {text!r}")
        return name, path
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"LoRA module must be name=path, got {text!r}")
    return name, path


def _non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be ≥ 0, got {value}")
    return value


def _duration(text: str) -> float:
    value = parse_duration(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"duration must be ≥ 0, got {text!r}")
    return value


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show defaults, except where the help already states one or there is none to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help or ""
        if "(default" in help_text or action.default in (None, [], argparse.SUPPRESS):
            return help_text
        return super()._get_help_string(action)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = _HelpFormatter
    parser.epilog = (
        "Durations take seconds or Go-style units (20ms, 1.5s). Example: epp sim --host 127.0.0.2 "
        "--port 8000 --pod-name pod-a --served-model-name base --lora-modules a=/x b=/y --max-loras 2"
    )
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on")
    g.add_argument("--port", type=int, default=8000, help="port to listen on (0 = any free port)")
    g.add_argument("--pod-name", default="sim", help="sent back in every response's x-inference-pod header")
    g.add_argument(
        "--served-model-name", nargs="+", default=["base"], help="base model names; the first labels metrics"
    )
    g.add_argument("--model", default=None, help="base model path shown as `root` in /v1/models")
    g.add_argument("--max-model-len", type=positive_int, default=2048, help="context length in tokens")
    g.add_argument(
        "--default-max-tokens",
        type=positive_int,
        default=16,
        help="tokens a completion without max_tokens generates (vLLM: 16); chat: the rest of the context",
    )
    g.add_argument("--seed", type=int, default=0, help="seed for generated text")
    g.add_argument("--log-level", default="WARNING", help="Python logging level")
    lg = parser.add_argument_group("LoRA")
    lg.add_argument(
        "--lora-modules",
        nargs="*",
        type=parse_lora_module,
        default=[],
        metavar="NAME=PATH",
        help="adapters registered at start (in host memory)",
    )
    add_bool_flag(
        parser, "--enable-lora", default=True, help="serve LoRA adapters and expose vllm:lora_requests_info"
    )
    add_bool_flag(
        parser,
        "--allow-runtime-lora-updating",
        default=True,
        help="enable /v1/load_lora_adapter and /v1/unload_lora_adapter",
    )
    add_bool_flag(
        parser,
        "--check-lora-paths",
        default=False,
        help="runtime loads need lora_path to be a directory holding adapter_config.json, as vLLM does "
        "(off by default, so demos can name adapters that exist nowhere)",
    )
    lg.add_argument(
        "--max-loras", type=positive_int, default=1, help="GPU adapter slots (adapters per batch)"
    )
    lg.add_argument(
        "--max-cpu-loras",
        type=positive_int,
        default=None,
        help="host-memory adapter cache (≥ max-loras; default max-loras)",
    )
    lg.add_argument(
        "--lora-load-latency",
        type=_duration,
        default=0.05,
        help="storage → GPU slot load time (seconds or 50ms)",
    )
    lg.add_argument(
        "--lora-cpu-load-latency", type=_duration, default=0.002, help="host memory → GPU slot load time"
    )
    lg.add_argument(
        "--lora-step-slowdown",
        type=_non_negative,
        default=0.10,
        help="step time × (1 + this × (distinct adapters in batch − 1))",
    )
    eg = parser.add_argument_group("engine")
    eg.add_argument("--max-num-seqs", type=positive_int, default=8, help="running batch size")
    eg.add_argument(
        "--max-num-batched-tokens",
        type=positive_int,
        default=8192,
        help="tokens one step computes (decodes first, then prefill chunks), as vLLM's chunked prefill",
    )
    eg.add_argument("--time-to-first-token", type=_duration, default=0.02, help="fixed prefill step time")
    eg.add_argument(
        "--prefill-time-per-token",
        type=_duration,
        default=0.0,
        help="extra prefill time per uncached prompt token",
    )
    eg.add_argument(
        "--inter-token-latency", type=_duration, default=0.005, help="decode step time for a batch of one"
    )
    eg.add_argument(
        "--itl-batch-factor", type=_non_negative, default=0.05, help="ITL × (1 + this × (batch − 1))"
    )
    eg.add_argument("--kv-cache-tokens", type=positive_int, default=65536, help="KV cache capacity in tokens")
    eg.add_argument(
        "--block-size",
        type=positive_int,
        default=16,
        help="KV block size in tokens (prefix hits are whole blocks)",
    )


def settings_from_args(args: argparse.Namespace) -> SimSettings:
    """Raises ValueError for inconsistent flags."""
    max_cpu_loras = args.max_cpu_loras if args.max_cpu_loras is not None else args.max_loras
    if max_cpu_loras < args.max_loras:
        raise ValueError(f"--max-cpu-loras ({max_cpu_loras}) must be ≥ --max-loras ({args.max_loras})")
    if args.kv_cache_tokens < args.block_size:
        raise ValueError("--kv-cache-tokens must be at least one block")
    names = [name for name, _ in args.lora_modules]
    if len(set(names)) != len(names):
        raise ValueError("duplicate adapter name in --lora-modules")
    if set(names) & set(args.served_model_name):
        raise ValueError("an adapter name in --lora-modules equals a --served-model-name")
    engine = EngineConfig(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_loras=args.max_loras,
        max_cpu_loras=max_cpu_loras,
        cost=LatencyCost(
            time_to_first_token_s=args.time_to_first_token,
            inter_token_latency_s=args.inter_token_latency,
            prefill_time_per_token_s=args.prefill_time_per_token,
            lora_load_latency_s=args.lora_load_latency,
            lora_cpu_load_latency_s=args.lora_cpu_load_latency,
            itl_batch_factor=args.itl_batch_factor,
            lora_step_slowdown=args.lora_step_slowdown,
        ),
        kv_cache_tokens=args.kv_cache_tokens,
        block_size=args.block_size,
    )
    return SimSettings(
        host=args.host,
        port=args.port,
        pod_name=args.pod_name,
        served_model_names=tuple(args.served_model_name),
        model_path=args.model,
        lora_modules=tuple(args.lora_modules) if args.enable_lora else (),
        enable_lora=args.enable_lora,
        allow_runtime_lora_updating=args.allow_runtime_lora_updating,
        check_lora_paths=args.check_lora_paths,
        max_model_len=args.max_model_len,
        default_max_tokens=args.default_max_tokens,
        seed=args.seed,
        engine=engine,
    )


async def serve(settings: SimSettings) -> None:
    """Listen, print one line, run until SIGTERM/SIGINT, then close cleanly."""
    server = SimServer(settings, SystemClock())
    runner = web.AppRunner(server.build_app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, shutdown_timeout=SHUTDOWN_GRACE_S)
    await site.start()
    ports = [address[1] for address in runner.addresses if isinstance(address, tuple)]
    port = ports[0] if ports else settings.port
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    driver_task = asyncio.create_task(server.driver.run(), name="sim-engine")
    print(f"epp sim: pod {settings.pod_name} listening on http://{settings.host}:{port}", flush=True)
    try:
        done, _ = await asyncio.wait(
            [driver_task, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED
        )
        if driver_task in done:
            driver_task.result()  # the engine loop only ends by raising; surface it
    finally:
        # Stop listening and let in-flight requests finish (bounded) while the engine still runs.
        await runner.cleanup()
        driver_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await driver_task


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    try:
        settings = settings_from_args(args)
    except ValueError as err:
        print(f"epp sim: {err}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(settings))
    except OSError as err:
        print(f"epp sim: cannot listen on {settings.host}:{settings.port}: {err}", file=sys.stderr)
        return 1
    return 0
