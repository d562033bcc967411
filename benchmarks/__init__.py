"""Benchmarks of the provider against plain baselines; see benchmarks/README.md."""
