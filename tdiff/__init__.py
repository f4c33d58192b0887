"""tdiff: a Unix-style toolkit for latent text diffusion language models."""

__version__ = "0.1.0"
