"""CPU cost of parsing one vLLM `/metrics` page: a full `prometheus_client` parse vs ours.

Run:  .venv/bin/python -m benchmarks.scrape_cost [--repeat 200] [--interval-ms 50 100 200]

For each real capture in `tests/fixtures/vllm-0.32.0/` it measures CPU time (time.process_time)
per parse, averaged over `--repeat` parses in this process, for:
  full      `parse_metrics_unfiltered` (testkit/reference_parse.py): the whole page through
            `text_string_to_metric_families`
  ours      `parse_metrics`: substring filter, then the ≈ 11 needed lines; cache_config memoised
  ours-cold `parse_metrics` when the cache_config line is new every time (a restarted server)
  filter    `select_lines` alone
Then the CPU one endpoint costs at each scrape interval (parse ms × scrapes per second), as a
percentage of one core. Parse cost only: HTTP and the event loop add to it.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from epp.picker.scrape.parse import parse_metrics, select_lines
from testkit.reference_parse import parse_metrics_unfiltered

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "vllm-0.32.0"


def cpu_ms_per_call(call: Callable[[int], object], repeat: int) -> float:
    call(-1)  # warm caches and imports
    started = time.process_time()
    for i in range(repeat):
        call(i)
    return (time.process_time() - started) / repeat * 1000.0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=200, help="parses per measurement")
    parser.add_argument("--interval-ms", type=float, nargs="+", default=[50.0, 100.0, 200.0])
    args = parser.parse_args()

    pages = {path.name: path.read_text(encoding="utf-8") for path in sorted(FIXTURES.glob("*.txt"))}
    header = ("page", "lines", "KB", "full ms", "ours ms", "cold ms", "filter ms", "ratio")
    print("{:<20} {:>6} {:>6} {:>8} {:>8} {:>8} {:>9} {:>6}".format(*header))
    rows: list[tuple[str, float, float]] = []
    marker = 'gpu_memory_utilization="0.92"'
    for name, text in pages.items():

        def full(_i: int, text: str = text) -> object:
            return parse_metrics_unfiltered(text, 0.0)

        def ours(_i: int, text: str = text) -> object:
            return parse_metrics(text, 0.0)

        def cold(i: int, text: str = text) -> object:
            # A distinct cache_config line each call, as after a server restart with new flags.
            return parse_metrics(text.replace(marker, f'gpu_memory_utilization="0.92{i}"'), 0.0)

        def only_filter(_i: int, text: str = text) -> object:
            return select_lines(text)

        full_ms = cpu_ms_per_call(full, max(1, args.repeat // 10))
        ours_ms = cpu_ms_per_call(ours, args.repeat)
        cold_ms = cpu_ms_per_call(cold, args.repeat)
        filter_ms = cpu_ms_per_call(only_filter, args.repeat)
        rows.append((name, full_ms, ours_ms))
        print(
            f"{name:<20} {text.count(chr(10)):>6} {len(text.encode()) / 1000:>6.1f} {full_ms:>8.2f} "
            f"{ours_ms:>8.3f} {cold_ms:>8.3f} {filter_ms:>9.3f} {full_ms / ours_ms:>5.0f}x"
        )

    busy_full = next(full for name, full, _ in rows if name == "busy.txt")
    busy_ours = next(ours for name, _, ours in rows if name == "busy.txt")
    print("\nCPU per endpoint for busy.txt, % of one core (parse only):")
    print(f"{'interval ms':>12} {'scrapes/s':>10} {'full':>8} {'ours':>8}")
    for interval_ms in args.interval_ms:
        per_second = 1000.0 / interval_ms
        print(
            f"{interval_ms:>12.0f} {per_second:>10.1f} {busy_full * per_second / 10:>7.1f}% "
            f"{busy_ours * per_second / 10:>7.2f}%"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
