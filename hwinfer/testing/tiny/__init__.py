"""Tiny configurations of each architecture for generated checkpoints."""
