"""Fuzz targets for the CNI plugin (placeholder until the plugin's targets are written)."""

TARGETS: list = []
