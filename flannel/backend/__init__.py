"""Backend registry: backend type names (lower-case, as in the network config) to classes.

Backends are imported only when selected, so a node pays for the one it runs.
"""

from __future__ import annotations

import importlib

from flannel.backend.base import Backend, BackendError, BackendOptions
from flannel.backend.footprint import Footprint

_REGISTRY = {
    "alloc": "flannel.backend.alloc:AllocBackend",
    "aws-vpc": "flannel.backend.awsvpc:AwsVpcBackend",
    "extension": "flannel.backend.extension:ExtensionBackend",
    "host-gw": "flannel.backend.hostgw:HostGwBackend",
    "ipip": "flannel.backend.ipip:IpipBackend",
    "tencent-vpc": "flannel.backend.tencentvpc:TencentVpcBackend",
    "udp": "flannel.backend.udp:UdpBackend",
    "vxlan": "flannel.backend.vxlan:VxlanBackend",
    "wireguard": "flannel.backend.wireguard:WireguardBackend",
}
# Types Go flannel knows; named in the error so an operator can tell "not yet" from "typo".
_UPSTREAM_ONLY = ("ipsec",)


def supported() -> list[str]:
    return sorted(_REGISTRY)


def backend_class(backend_type: str) -> type[Backend]:
    """The class for a backend type; BackendError names the supported types otherwise."""
    target = _REGISTRY.get(backend_type)
    if target is None:
        known = ", ".join(supported())
        if backend_type in _UPSTREAM_ONLY:
            raise BackendError(f"backend type {backend_type!r} is not available in this "
                               f"pyflannel build; available: {known}")
        raise BackendError(f"unknown backend type: {backend_type}; set Backend.Type in the "
                           f"network config to one of: {known}")
    module_name, _, class_name = target.partition(":")
    found: type[Backend] = getattr(importlib.import_module(module_name), class_name)
    return found


def describe(backend_type: str) -> tuple[str, Footprint] | None:
    """(the BackendType its leases carry, its footprint) for a configured backend type; None
    when it is unknown. For the operator tools: imports the backend's module, runs nothing."""
    try:
        cls = backend_class(backend_type)
    except BackendError:
        return None
    return cls.backend_type, cls.footprint


__all__ = ["Backend", "BackendError", "BackendOptions", "Footprint", "backend_class", "describe",
           "supported"]
