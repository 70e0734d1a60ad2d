"""Shared worlds' benchmarks (issue 56): one owner driving while N viewers watch (`watch_load`)."""
