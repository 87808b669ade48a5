"""Benchmark scripts: each says how to run it and what it measures."""
