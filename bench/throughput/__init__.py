"""Throughput benchmarks: `tdiff clean`, `tdiff tokenize`, and the training step."""
