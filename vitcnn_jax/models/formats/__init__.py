"""Checkpoint files: what every reader shares, and the containers they come in."""
