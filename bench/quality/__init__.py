"""Sample-quality benchmarks on songci: the quality report, the equal-diversity frontier, ablations."""
