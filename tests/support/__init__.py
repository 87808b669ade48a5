"""Helpers the test tiers share (and the benchmarks that compare against a reference)."""
