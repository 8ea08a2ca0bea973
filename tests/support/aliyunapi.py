"""The Alibaba Cloud VPC API double lives with the lab (``flannel.lab.aliyunapi``), which
serves it to lab nodes; the tests use the same double."""

from flannel.lab.aliyunapi import FakeAliyunVpc

__all__ = ["FakeAliyunVpc"]
