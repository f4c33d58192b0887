"""Benchmarks of tdiff, grouped by subject; each runs as `python -m bench.GROUP.NAME` (index: bench/README.md)."""
