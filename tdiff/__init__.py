"""tdiff: a Unix-style toolkit for latent text diffusion language models.

The Python API::

    import tdiff
    m = tdiff.load("model.safetensors")     # a diffusion model, a distilled student or a train-ar directory
    texts = m.sample(n=4, steps=12, solver="dpm")
"""

from tdiff.core.version import __version__

__all__ = ["__version__", "load"]


def load(path, device: str = "cpu", **options):
    """Load the artifact at PATH for use from Python; see `tdiff.api.load`."""
    from tdiff.api import load as _load

    return _load(path, device=device, **options)
