"""The Alibaba Cloud VPC API and metadata service doubles live with the lab
(``flannel_lab.aliyunapi``), which serves them to lab nodes; the tests use the same doubles."""

from flannel_lab.aliyunapi import FakeAliyunMetadata, FakeAliyunVpc

__all__ = ["FakeAliyunMetadata", "FakeAliyunVpc"]
