"""Distillation: students against their teacher on the quality-diversity frontier."""
