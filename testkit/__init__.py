"""What the tests, the loopback e2e stack and the benchmarks share: waiting on conditions, faults
injected into a local stack, the reference metrics parser, and the inference-perf loopback run.

Its own package so that none of `tests/`, `e2e/` and `benchmarks/` imports another.
"""
