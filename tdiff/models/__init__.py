"""Neural networks of tdiff: the text VAE (vae.py), the DiT denoiser (dit.py) and their shared
Transformer layers (layers.py). The diffusion process that trains and samples with them lives in
tdiff/diffusion; the networks know nothing about noise schedules or parameterisations.
"""

from tdiff.models.dit import DiT, DiTConfig
from tdiff.models.vae import TextVAE, VAEConfig, text_lengths

__all__ = ["DiT", "DiTConfig", "TextVAE", "VAEConfig", "text_lengths"]
