"""Clearly named fakes for hardware that cannot run here (no NVIDIA GPU on this machine)."""
