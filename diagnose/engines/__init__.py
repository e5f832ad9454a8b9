"""Engines: detection, metric maps and settings (detect), and each engine's spelling of a setting for experiments (experiments)."""
