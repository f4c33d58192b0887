"""Evaluation: metrics on texts (metrics.py), perplexity under an AR judge (perplexity.py),
the figures of `tdiff eval` (evaluate.py) and plots of logs (plots.py).
"""
