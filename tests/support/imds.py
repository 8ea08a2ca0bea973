"""The fake instance metadata service lives with the lab (``flannel_lab.imds``), which
serves it to lab nodes; the tests use the same double."""

from flannel_lab.imds import FakeMetadata, aws_paths

__all__ = ["FakeMetadata", "aws_paths"]
