"""The simulator's /metrics: vLLM 0.32.0's families, types, labels, HELP and buckets.

Names, labels and bucket bounds are facts from real vLLM 0.32.0 scrapes (tests/fixtures/vllm-0.32.0/,
metric_catalog.tsv). Families the simulator does not model (multi-modal cache, external KV transfer,
FLOP estimates, preemptions, admission rejections) are exposed with their real labels at 0 so a
parser written against real vLLM sees the same page. Plus `vllm_sim:lora_adapter_loads_total`.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from epp.tools.sim.engine import EngineConfig, EngineStats, FinishedRequest, StepOutcome, StepPlan
from epp.tools.vllm_pod.lora import Activation

# Real vLLM's exposition content type (prometheus_client's 0.0.4 text format).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

ENGINE = "0"
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHED_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0)  # fmt: skip
REQUEST_TIME_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                        120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
TOKEN_COUNT_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0)
PARAMS_N_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0)
PREEMPTION_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)
ITERATION_TOKEN_BUCKETS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
                           16384.0)  # fmt: skip

CACHE_CONFIG_LABELS = (
    "_block_size_resolved", "block_size", "cache_dtype", "cache_hit_alignment_tokens",
    "effective_attention_block_size", "enable_mamba_shared_prefix_checkpoint", "enable_prefix_caching",
    "engine", "gpu_memory_utilization", "hash_block_size", "is_attention_free", "kv_cache_dtype_skip_layers",
    "kv_cache_layout", "kv_cache_max_concurrency", "kv_cache_memory_bytes", "kv_cache_size_tokens",
    "kv_offloading_backend", "kv_offloading_size", "kv_sharing_fast_prefill", "mamba_block_size",
    "mamba_cache_dtype", "mamba_cache_mode", "mamba_page_size_padded", "mamba_ssm_cache_dtype",
    "num_cpu_blocks", "num_gpu_blocks", "num_gpu_blocks_override", "prefix_cache_retention_interval",
    "prefix_caching_hash_algo", "prefix_match_unit", "replayssm_buffer_len", "skip_page_size_padded",
    "sliding_window", "swa_bounded_replay", "use_kda_recoverssm", "use_replayssm",
    "user_specified_block_size",
)  # fmt: skip
KV_BYTES_PER_TOKEN = 1024  # what the reference capture shows (1 GiB for 1,048,576 tokens)


def cache_config_labels(config: EngineConfig, max_model_len: int) -> dict[str, str]:
    """`vllm:cache_config_info` labels: the simulated geometry, the rest as the real capture shows."""
    return {
        "_block_size_resolved": "True",
        "block_size": str(config.block_size),
        "cache_dtype": "auto",
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": str(config.block_size),
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": "True",
        "engine": ENGINE,
        "gpu_memory_utilization": "0.92",
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(config.num_blocks * config.block_size / max_model_len),
        "kv_cache_memory_bytes": str(config.num_blocks * config.block_size * KV_BYTES_PER_TOKEN),
        "kv_cache_size_tokens": str(config.num_blocks * config.block_size),
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "auto",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(config.num_blocks),
        "num_gpu_blocks_override": "None",
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None",
        "sliding_window": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": "False",
    }


class SimMetrics:
    """Owns a private registry; the driver reports engine stats, steps, loads and finished requests."""

    def __init__(
        self,
        *,
        model_name: str,
        config: EngineConfig,
        max_model_len: int,
        lora_enabled: bool,
        wall_clock: Callable[[], float],
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._wall_clock = wall_clock
        self._lora_enabled = lora_enabled
        self._max_lora = str(config.max_loras)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        r = self.registry
        base = ("engine", "model_name")
        self._base = {"engine": ENGINE, "model_name": model_name}

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, [*base, *extra], registry=r)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, [*base, *extra], registry=r)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, list(base), buckets=buckets, registry=r)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.waiting_by_reason = gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
            "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked "
            "status). Sum of all reasons equals vllm:num_requests_waiting.",
            ("reason",),
        )
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.sleep_state = gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            ("sleep_state",),
        )
        self.cache_config = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            CACHE_CONFIG_LABELS,
            registry=r,
        )
        self.lora_info: Gauge | None = None
        if lora_enabled:
            self.lora_info = Gauge(
                "vllm:lora_requests_info",
                "Running stats on lora requests.",
                ["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
                registry=r,
            )
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.prompt_by_source = counter(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ("source",)
        )
        self.prompt_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        )
        self.prompt_cached_by_source = counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host "
            "(offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
            "external_unspecified. "
            "Counted at admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
            ("source",),
        )
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.request_success = counter(
            "vllm:request_success", "Count of successfully processed requests.", ("finished_reason",)
        )
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        zero_counters = [
            counter(
                "vllm:external_prefix_cache_queries",
                "External prefix cache queries from KV connector cross-instance cache sharing, in terms of "
                "number of queried tokens.",
            ),
            counter(
                "vllm:external_prefix_cache_hits",
                "External prefix cache hits from KV connector cross-instance cache sharing, in terms of "
                "number of cached tokens.",
            ),
            counter(
                "vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items."
            ),
            counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items."),
            counter(
                "vllm:estimated_flops_per_gpu",
                "Estimated number of floating point operations per GPU (for Model Flops Utilization "
                "calculations).",
            ),
            counter(
                "vllm:estimated_read_bytes_per_gpu",
                "Estimated number of bytes read from memory per GPU (for Model Flops Utilization "
                "calculations).",
            ),
            counter(
                "vllm:estimated_write_bytes_per_gpu",
                "Estimated number of bytes written to memory per GPU (for Model Flops Utilization "
                "calculations).",
            ),
        ]
        self.admission_rejections = Counter(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            ["model_name", "reason"],
            registry=r,
        )
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKEN_BUCKETS,
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS
        )
        self.tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_TIME_BUCKETS,
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
            REQUEST_TIME_BUCKETS,
        )  # fmt: skip
        self.inference_time = histogram(
            "vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
            REQUEST_TIME_BUCKETS,
        )  # fmt: skip
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
            REQUEST_TIME_BUCKETS,
        )  # fmt: skip
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
            REQUEST_TIME_BUCKETS,
        )  # fmt: skip
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", TOKEN_COUNT_BUCKETS
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", TOKEN_COUNT_BUCKETS
        )
        self.request_max_generation_tokens = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            TOKEN_COUNT_BUCKETS,
        )
        self.params_n = histogram(
            "vllm:request_params_n", "Histogram of the n request parameter.", PARAMS_N_BUCKETS
        )
        self.params_max_tokens = histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            TOKEN_COUNT_BUCKETS,
        )
        self.request_preemptions = histogram(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            PREEMPTION_BUCKETS,
        )
        self.prefill_kv_computed = histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            TOKEN_COUNT_BUCKETS,
        )
        self.lora_loads = Counter(
            "vllm_sim:lora_adapter_loads",
            "LoRA adapter loads into a GPU slot (simulator only), by adapter.",
            ["adapter"],
            registry=r,
        )

        # Series real vLLM exposes from the first scrape.
        for child in (self.running, self.waiting, self.kv_usage):
            child.labels(**self._base).set(0)
        for reason in ("capacity", "deferred"):
            self.waiting_by_reason.labels(**self._base, reason=reason).set(0)
        for state in SLEEP_STATES:
            self.sleep_state.labels(**self._base, sleep_state=state).set(1 if state == "awake" else 0)
        self.cache_config.labels(**cache_config_labels(config, max_model_len)).set(1)
        for c in (self.preemptions, self.prompt_tokens, self.prompt_cached, self.generation_tokens,
                  self.prefix_queries, self.prefix_hits, *zero_counters):  # fmt: skip
            c.labels(**self._base)
        for source in PROMPT_SOURCES:
            self.prompt_by_source.labels(**self._base, source=source)
        for source in CACHED_SOURCES:
            self.prompt_cached_by_source.labels(**self._base, source=source)
        for reason in FINISH_REASONS:
            self.request_success.labels(**self._base, finished_reason=reason)
        for reason in ADMISSION_REASONS:
            self.admission_rejections.labels(model_name=model_name, reason=reason)
        for h in (self.iteration_tokens, self.ttft, self.itl, self.tpot, self.e2e, self.queue_time,
                  self.inference_time, self.prefill_time, self.decode_time, self.request_prompt_tokens,
                  self.request_generation_tokens, self.request_max_generation_tokens, self.params_n,
                  self.params_max_tokens, self.request_preemptions, self.prefill_kv_computed):  # fmt: skip
            h.labels(**self._base)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # ---- observations ---------------------------------------------------------------------
    def observe_stats(self, stats: EngineStats) -> None:
        """Scheduler gauges and, per engine step, the LoRA in-flight combination (vLLM 0.32.0's
        quirks, as its captured /metrics show them)."""
        b = self._base
        self.running.labels(**b).set(stats.running)
        self.waiting.labels(**b).set(stats.waiting)
        self.waiting_by_reason.labels(**b, reason="capacity").set(stats.waiting_capacity)
        self.waiting_by_reason.labels(**b, reason="deferred").set(stats.waiting_deferred)
        self.kv_usage.labels(**b).set(stats.kv_cache_usage)

    def observe_step_stats(self, stats: EngineStats) -> None:
        """Called once per engine step: also stamps `lora_requests_info` for the current combination."""
        self.observe_stats(stats)
        if self.lora_info is not None:
            adapters = ",".join(stats.lora_in_flight)
            self.lora_info.labels(
                max_lora=self._max_lora, running_lora_adapters=adapters, waiting_lora_adapters=adapters
            ).set(self._wall_clock())

    def observe_plan(self, plan: StepPlan) -> None:
        b = self._base
        self.prefix_queries.labels(**b).inc(plan.prefix_queries_tokens)
        self.prefix_hits.labels(**b).inc(plan.prefix_hits_tokens)
        self.prompt_tokens.labels(**b).inc(plan.prefix_queries_tokens)
        self.prompt_by_source.labels(**b, source="local_compute").inc(plan.prefill_tokens)
        self.prompt_by_source.labels(**b, source="local_cache_hit").inc(plan.prefix_hits_tokens)
        self.prompt_cached.labels(**b).inc(plan.prefix_hits_tokens)
        self.prompt_cached_by_source.labels(**b, source="device").inc(plan.prefix_hits_tokens)
        for activation in plan.activations:
            self.observe_lora_load(activation)

    def observe_lora_load(self, activation: Activation) -> None:
        self.lora_loads.labels(adapter=activation.adapter).inc()

    def observe_outcome(self, outcome: StepOutcome) -> None:
        b = self._base
        self.iteration_tokens.labels(**b).observe(outcome.iteration_tokens)
        self.generation_tokens.labels(**b).inc(len(outcome.tokens))
        for finished in outcome.finished:
            self.observe_finished(finished)

    def observe_finished(self, done: FinishedRequest) -> None:
        b = self._base
        self.request_success.labels(**b, finished_reason=done.finish_reason).inc()
        if done.time_to_first_token_s is not None:
            self.ttft.labels(**b).observe(done.time_to_first_token_s)
        for gap_s in done.inter_token_latencies_s:
            self.itl.labels(**b).observe(gap_s)
        if done.generation_tokens > 1:
            self.tpot.labels(**b).observe(done.decode_time_s / (done.generation_tokens - 1))
        self.e2e.labels(**b).observe(done.e2e_latency_s)
        self.queue_time.labels(**b).observe(done.queue_time_s)
        self.inference_time.labels(**b).observe(done.inference_time_s)
        self.prefill_time.labels(**b).observe(done.prefill_time_s)
        self.decode_time.labels(**b).observe(done.decode_time_s)
        self.request_prompt_tokens.labels(**b).observe(done.prompt_tokens)
        self.request_generation_tokens.labels(**b).observe(done.generation_tokens)
        self.request_max_generation_tokens.labels(**b).observe(done.max_tokens)
        self.params_n.labels(**b).observe(1)
        self.params_max_tokens.labels(**b).observe(done.max_tokens)
        self.request_preemptions.labels(**b).observe(0)
        self.prefill_kv_computed.labels(**b).observe(done.prompt_tokens - done.cached_tokens)
