"""Benchmarks for Baton: offline workloads and the baselines Baton is compared against."""
