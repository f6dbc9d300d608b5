"""Benchmark-only baselines (not part of the product API)."""
