"""Fixtures that several integration modules use, defined in tests/support/ by what they
make: a Compute Engine or Alibaba VPC double (``compute``, ``cloud``), the Kubernetes API
double (``api``), a host namespace with its own etcd (``node``)."""

from tests.support.alivpc import cloud  # noqa: F401
from tests.support.flanneld import node  # noqa: F401
from tests.support.gce import compute  # noqa: F401
from tests.support.kubestore import api  # noqa: F401
