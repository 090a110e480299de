"""Benchmarks (run by `make bench`; not tests)."""
