"""Sampling: the diffusion sampler with its control options (sample.py, control.py), the
compiled fast path (compiled.py) and the autoregressive baseline's sampler (ar.py).
"""
