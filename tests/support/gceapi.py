"""The Compute Engine double lives with the lab (``flannel_lab.gceapi``), which serves it to
lab nodes; the tests use the same double."""

from flannel_lab.gceapi import FakeCompute, FakeGceMetadata, metadata_paths

__all__ = ["FakeCompute", "FakeGceMetadata", "metadata_paths"]
