"""Subnet managers: where leases live (etcd v3 or the Kubernetes API) and how they are watched.

Nothing in this package touches the kernel.
"""
