"""What the EPP reads from real vLLM 0.32.0 `/metrics` pages, and from variations of them.

Every page here is a real capture (`tests/fixtures/vllm-0.32.0/`) or a capture with one
deliberate edit, so the cases stay close to what a model server really sends.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from epp.picker.datastore.types import Metrics
from epp.picker.scrape.parse import MetricNames, MetricsParseError, parse_metrics, select_lines
from testkit.reference_parse import parse_metrics_unfiltered

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "vllm-0.32.0"
PAGES = sorted(p.name for p in FIXTURES.glob("*.txt"))
NOW = 1234.5


def page(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def gauge_on_page(text: str, name: str, **labels: str) -> float:
    """The value of the one sample of `name` whose labels include `labels`, read straight off the text."""
    values = []
    for match in re.finditer(rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$", text, re.MULTILINE):
        if all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
            values.append(float(match.group(2)))
    assert len(values) == 1, (name, labels, values)
    return values[0]


def drop_family(text: str, name: str) -> str:
    """The page without any line about `name` (samples, HELP, TYPE)."""
    pattern = re.compile(rf"^(# (HELP|TYPE) )?{re.escape(name)}[ {{].*$\n?", re.MULTILINE)
    return pattern.sub("", text)


# -- real pages ----------------------------------------------------------------------------

EXPECTED = {
    # page: (running, waiting, deferred, lora_enabled, active adapters, max_lora, block, blocks, model)
    "busy.txt": (8, 10, 0, True, {"lora-0", "lora-1"}, 2, 128, 8192, "tiny-llama"),
    "timeline-000.txt": (8, 10, 0, True, {"lora-0", "lora-1"}, 2, 128, 8192, "tiny-llama"),
    "timeline-009.txt": (8, 2, 1, True, {"lora-2", "lora-3"}, 2, 128, 8192, "tiny-llama"),
    "timeline-018.txt": (2, 0, 0, True, {"lora-3"}, 2, 128, 8192, "tiny-llama"),
    "after.txt": (0, 0, 0, True, set(), 2, 128, 8192, "tiny-llama"),
    "final.txt": (0, 0, 0, True, set(), 2, 128, 8192, "tiny-llama"),
    "busy_deferred.txt": (4, 1, 1, True, {"lora-0", "lora-1"}, 2, 128, 8192, "tiny-llama"),
    # A fresh server: the LoRA family has no sample yet, so max_lora is not known.
    "idle.txt": (0, 0, 0, True, set(), 0, 128, 8192, "tiny-llama"),
    "no-lora.txt": (0, 0, 0, False, set(), 0, 32, 32768, "tiny-a"),
}


def test_every_capture_has_an_expectation() -> None:
    assert sorted(EXPECTED) == PAGES


@pytest.mark.parametrize("name", sorted(EXPECTED), ids=sorted(EXPECTED))
def test_real_page_reads_as_the_server_reported(name: str) -> None:
    text = page(name)
    running, waiting, deferred, lora_enabled, active, max_lora, block, blocks, model = EXPECTED[name]

    metrics = parse_metrics(text, NOW)

    assert metrics.updated_at == NOW
    assert (metrics.running_requests, metrics.waiting_requests, metrics.deferred_requests) == (
        running,
        waiting,
        deferred,
    )
    # The page's own numbers agree with the table (guards against a mistyped expectation).
    assert metrics.running_requests == gauge_on_page(text, "vllm:num_requests_running")
    assert metrics.waiting_requests == gauge_on_page(text, "vllm:num_requests_waiting")
    assert metrics.deferred_requests == gauge_on_page(
        text, "vllm:num_requests_waiting_by_reason", reason="deferred"
    )
    assert metrics.kv_cache_usage == gauge_on_page(text, "vllm:kv_cache_usage_perc")
    assert metrics.lora_enabled is lora_enabled
    assert metrics.active_adapters == active
    # vLLM 0.32.0 puts every in-flight adapter in both labels.
    assert metrics.running_adapters == metrics.waiting_adapters == active
    assert metrics.max_lora == max_lora
    assert (metrics.block_size, metrics.num_gpu_blocks) == (block, blocks)
    assert metrics.served_model_name == model


@pytest.mark.parametrize("name", PAGES, ids=PAGES)
def test_filtered_parse_agrees_with_a_full_parse(name: str) -> None:
    text = page(name)
    assert parse_metrics(text, NOW) == parse_metrics_unfiltered(text, NOW)


def test_filter_keeps_only_the_lines_it_needs() -> None:
    selected = select_lines(page("busy.txt"))
    lines = selected.text.splitlines()
    # 5 families' TYPE lines and their 10 samples out of 658 lines; HELP text is never tokenised.
    assert len(lines) == 15
    assert not any(line.startswith("# HELP") for line in lines)
    assert selected.cache_info_text.count("\n") == 1  # its TYPE line and its one sample


def test_max_lora_survives_a_page_with_no_lora_sample_yet() -> None:
    known = parse_metrics(page("after.txt"), NOW)
    fresh = parse_metrics(page("idle.txt"), NOW + 1, previous=known)
    assert fresh.lora_enabled and fresh.max_lora == 2 and not fresh.active_adapters


# -- edits of a real page ------------------------------------------------------------------

BUSY = page("busy.txt")
BUSY_KV = gauge_on_page(BUSY, "vllm:kv_cache_usage_perc")


@pytest.mark.parametrize(
    ("text", "kv_cache_usage"),
    [
        (BUSY.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), BUSY_KV),
        (
            BUSY.replace(
                "# HELP vllm:kv_cache_usage_perc",
                "# TYPE vllm:gpu_cache_usage_perc gauge\n"
                'vllm:gpu_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.75\n'
                "# HELP vllm:kv_cache_usage_perc",
            ),
            BUSY_KV,
        ),
        (BUSY.replace(f"}} {BUSY_KV!r}\n", "} 7.5e-1\n"), 0.75),
        (BUSY.replace(f"}} {BUSY_KV!r}\n", "} 1.5\n"), 1.0),
        (BUSY.replace(f"}} {BUSY_KV!r}\n", "} -0.1\n"), 0.0),
    ],
    ids=["gpu-cache-fallback", "kv-wins-over-gpu-cache", "exponent", "clamped-high", "clamped-low"],
)
def test_kv_cache_usage(text: str, kv_cache_usage: float) -> None:
    assert parse_metrics(text, NOW).kv_cache_usage == kv_cache_usage


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (drop_family(BUSY, "vllm:num_requests_waiting"), "no vllm:num_requests_waiting sample"),
        (drop_family(BUSY, "vllm:kv_cache_usage_perc"), "no vllm:kv_cache_usage_perc sample"),
        ("<html><body>502 Bad Gateway</body></html>\n", "no vllm:num_requests_waiting sample"),
        ("", "no vllm:num_requests_waiting sample"),
        (
            BUSY.replace(
                'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 10.0',
                "vllm:num_requests_waiting{engine=0} 10",
            ),
            "malformed metrics exposition",
        ),
        (
            BUSY.replace('model_name="tiny-llama"} 10.0', 'model_name="tiny-llama"} NaN'),
            "vllm:num_requests_waiting is nan, not a finite number",
        ),
        (
            BUSY.replace(
                'max_lora="2",running_lora_adapters="lora-0,lora-1"',
                'max_lora="two",running_lora_adapters="lora-0,lora-1"',
            ),
            "max_lora='two', not an integer",
        ),
    ],
    ids=[
        "no-queue-family",
        "no-kv-family",
        "html",
        "empty",
        "malformed-needed-line",
        "nan-queue",
        "bad-max-lora",
    ],
)
def test_unusable_page_is_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(MetricsParseError, match=re.escape(message)):
        parse_metrics(text, NOW)


def test_malformed_line_of_an_unused_family_does_not_fail_the_scrape() -> None:
    text = BUSY.replace("vllm:num_preemptions_total{", "vllm:num_preemptions_total{{broken", 1)
    with pytest.raises(MetricsParseError):
        parse_metrics_unfiltered(text, NOW)
    assert parse_metrics(text, NOW) == parse_metrics(BUSY, NOW)


LORA_NEWEST = (
    'vllm:lora_requests_info{max_lora="2",'
    'running_lora_adapters="lora-0,lora-1",waiting_lora_adapters="lora-0,lora-1"}'
)


@pytest.mark.parametrize(
    ("text", "active"),
    [
        (
            BUSY.replace(
                LORA_NEWEST,
                'vllm:lora_requests_info{waiting_lora_adapters="lora-0,lora-1",running_lora_adapters="lora-0,lora-1",max_lora="2"}',
            ),
            {"lora-0", "lora-1"},
        ),
        (
            BUSY.replace(LORA_NEWEST, LORA_NEWEST.replace("lora-0,lora-1", "lora-0, lora-1")),
            {"lora-0", "lora-1"},
        ),
        (
            BUSY.replace(LORA_NEWEST, LORA_NEWEST.replace("lora-0,lora-1", ",lora-0,,lora-1,")),
            {"lora-0", "lora-1"},
        ),
        (BUSY.replace(f"{LORA_NEWEST} 1.7962154293166177e+09", f"{LORA_NEWEST} NaN"), {"lora-0"}),
        (BUSY.replace(f"{LORA_NEWEST} 1.7962154293166177e+09", f"{LORA_NEWEST} +Inf"), {"lora-0", "lora-1"}),
        (
            BUSY.replace(
                'running_lora_adapters="",waiting_lora_adapters=""} 1.7962154289988997e+09',
                'running_lora_adapters="",waiting_lora_adapters=""} 1.8e+09',
            ),
            set(),
        ),
    ],
    ids=[
        "label-order",
        "space-after-comma",
        "empty-items",
        "nan-sample-skipped",
        "inf-is-newest",
        "empty-newest-wins",
    ],
)
def test_lora_in_flight_set(text: str, active: set[str]) -> None:
    metrics = parse_metrics(text, NOW)
    assert metrics.active_adapters == active
    assert parse_metrics_unfiltered(text, NOW) == metrics


def test_names_in_other_lines_are_not_mistaken_for_samples() -> None:
    decoy = (
        '# HELP decoy_info vllm:num_requests_waiting{engine="0"} 99\n'
        "# TYPE decoy_info gauge\n"
        'decoy_info{note="vllm:num_requests_waiting 99",other="vllm:kv_cache_usage_perc{x=\\"1\\"} 1"} 1.0\n'
        'vllm:num_requests_waiting_extra{engine="0",model_name="tiny-llama"} 99.0\n'
    )
    text = decoy + BUSY
    assert parse_metrics(text, NOW) == parse_metrics(BUSY, NOW)
    assert parse_metrics(text, NOW) == parse_metrics_unfiltered(text, NOW)


@pytest.mark.parametrize(
    "text",
    [
        BUSY.replace("\n", "\r\n"),
        BUSY.replace("# TYPE vllm:num_requests_waiting gauge", "#   TYPE\tvllm:num_requests_waiting   gauge"),
        BUSY.replace("\nvllm:num_requests_waiting{", "\n   vllm:num_requests_waiting{"),
        BUSY.replace('vllm:num_requests_waiting{engine="0",', '{"vllm:num_requests_waiting",engine="0",'),
        BUSY.replace('vllm:num_requests_waiting{engine="0",', '{ "vllm:num_requests_waiting" ,engine="0",'),
        BUSY.replace(
            'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 10.0',
            'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 10.0 1796215429000',
        ),
        BUSY.replace(
            'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 10.0',
            'vllm:num_requests_waiting{ engine = "0" , model_name = "tiny-llama" , } 1e1',
        ),
    ],
    ids=[
        "crlf",
        "blanks-in-type-line",
        "leading-blanks",
        "quoted-name",
        "quoted-name-blanks",
        "with-timestamp",
        "loose-label-syntax",
    ],
)
def test_valid_exposition_variants_read_the_same(text: str) -> None:
    assert parse_metrics(text, NOW) == parse_metrics(BUSY, NOW)
    assert parse_metrics_unfiltered(text, NOW) == parse_metrics(BUSY, NOW)


# -- model selection -----------------------------------------------------------------------

TWO_MODELS = BUSY.replace(
    'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 10.0',
    'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 10.0\n'
    'vllm:num_requests_waiting{engine="0",model_name="other"} 3.0',
).replace(
    'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"}',
    'vllm:kv_cache_usage_perc{engine="0",model_name="other"} 0.5\n'
    'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"}',
)


@pytest.mark.parametrize(
    ("served_model_name", "previous_model", "expected_model", "waiting", "kv"),
    [
        ("tiny-llama", None, "tiny-llama", 10, BUSY_KV),
        ("other", None, "other", 3, 0.5),
        (None, None, "tiny-llama", 10, BUSY_KV),
        (None, "other", "other", 3, 0.5),
        (None, "gone", "tiny-llama", 10, BUSY_KV),
    ],
    ids=["configured", "configured-second", "first-on-page", "keeps-previous", "previous-gone"],
)
def test_model_name_selects_the_series(
    served_model_name: str | None, previous_model: str | None, expected_model: str, waiting: int, kv: float
) -> None:
    previous = Metrics(updated_at=0.0, served_model_name=previous_model) if previous_model else None
    metrics = parse_metrics(TWO_MODELS, NOW, served_model_name=served_model_name, previous=previous)
    assert (metrics.served_model_name, metrics.waiting_requests, metrics.kv_cache_usage) == (
        expected_model,
        waiting,
        kv,
    )


def test_unknown_configured_model_is_an_error() -> None:
    with pytest.raises(MetricsParseError, match="model_name='nope'"):
        parse_metrics(BUSY, NOW, served_model_name="nope")


def test_engines_of_one_server_add_up() -> None:
    text = BUSY.replace(
        'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 10.0',
        'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 10.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="tiny-llama"} 4.0',
    ).replace(
        'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"}',
        'vllm:kv_cache_usage_perc{engine="1",model_name="tiny-llama"} 0.5\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"}',
    )
    metrics = parse_metrics(text, NOW)
    assert (metrics.waiting_requests, metrics.kv_cache_usage) == (14, 0.5)


# -- optional families and configured names ------------------------------------------------


@pytest.mark.parametrize(
    ("text", "field", "value"),
    [
        (drop_family(BUSY, "vllm:num_requests_running"), "running_requests", 0),
        (drop_family(BUSY, "vllm:num_requests_waiting_by_reason"), "deferred_requests", 0),
        (drop_family(BUSY, "vllm:cache_config_info"), "block_size", None),
        (BUSY.replace('num_gpu_blocks="8192"', 'num_gpu_blocks="None"'), "num_gpu_blocks", None),
        (drop_family(BUSY, "vllm:lora_requests_info"), "lora_enabled", False),
    ],
    ids=["no-running", "no-reasons", "no-cache-config", "unset-blocks", "no-lora-family"],
)
def test_optional_family_absent(text: str, field: str, value: object) -> None:
    assert getattr(parse_metrics(text, NOW), field) == value


def test_cache_config_is_kept_from_the_previous_scrape_when_a_page_omits_it() -> None:
    previous = parse_metrics(BUSY, NOW)
    metrics = parse_metrics(drop_family(BUSY, "vllm:cache_config_info"), NOW + 1, previous=previous)
    assert (metrics.block_size, metrics.num_gpu_blocks) == (128, 8192)


def test_configured_metric_names_are_read() -> None:
    renamed = BUSY.replace("vllm:num_requests_waiting{", "srv:queue{").replace(
        "vllm:kv_cache_usage_perc", "srv:kv"
    )
    names = MetricNames(waiting="srv:queue", kv_usage="srv:kv")
    metrics = parse_metrics(renamed, NOW, names=names)
    assert (metrics.waiting_requests, metrics.kv_cache_usage) == (10, BUSY_KV)
    assert parse_metrics_unfiltered(renamed, NOW, names=names) == metrics
    with pytest.raises(MetricsParseError):
        parse_metrics(renamed, NOW)


def test_empty_required_metric_name_is_refused() -> None:
    with pytest.raises(ValueError, match="'waiting' must not be empty"):
        MetricNames(waiting="")
