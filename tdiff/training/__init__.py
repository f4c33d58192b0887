"""Training: the shared loop, checkpoints, data batching."""
