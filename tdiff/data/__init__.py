"""Datasets: token-id JSONL records and their batching (token_ids.py), texts encoded to latents
(latents.py).
"""
