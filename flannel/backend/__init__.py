"""Backend registry: backend type names (lower-case, as in the network config) to classes.

The backends of this package are imported only when selected, so a node pays for the one it
runs. ``register`` adds a backend defined elsewhere (a class, or "module:Class" imported when
selected): it then runs under flanneld, shows in /status and is judged and cleaned up by
the operator tools through its declared footprint, like the package's own.
"""

from __future__ import annotations

import importlib
import re

from flannel.backend.base import Backend, BackendConfigError, BackendError, BackendOptions
from flannel.backend.footprint import Footprint

_REGISTRY: dict[str, str | type[Backend]] = {
    "alloc": "flannel.backend.alloc:AllocBackend",
    "ali-vpc": "flannel.backend.alivpc:AliVpcBackend",
    "aws-vpc": "flannel.backend.awsvpc:AwsVpcBackend",
    "extension": "flannel.backend.extension:ExtensionBackend",
    "gce": "flannel.backend.gce:GceBackend",
    "host-gw": "flannel.backend.hostgw:HostGwBackend",
    "ipip": "flannel.backend.ipip:IpipBackend",
    "ipsec": "flannel.backend.ipsec:IpsecBackend",
    "tencent-vpc": "flannel.backend.tencentvpc:TencentVpcBackend",
    "udp": "flannel.backend.udp:UdpBackend",
    "vxlan": "flannel.backend.vxlan:VxlanBackend",
    "wireguard": "flannel.backend.wireguard:WireguardBackend",
}


#: A backend type as the network config names it (lower-case; compared lower-cased).
_TYPE_NAME = re.compile(r"[a-z][a-z0-9-]{0,31}")


def supported() -> list[str]:
    return sorted(_REGISTRY)


def register(backend_type: str, backend: type[Backend] | str) -> None:
    """Make ``backend`` (a ``Backend`` subclass with its ``footprint``, or "module:Class")
    the backend of ``backend_type``. A programming error (a bad name, a type already taken)
    raises ValueError."""
    if not _TYPE_NAME.fullmatch(backend_type):
        raise ValueError(f"backend type {backend_type!r}: lower-case letters, digits and "
                         "dashes, starting with a letter")
    if backend_type in _REGISTRY:
        raise ValueError(f"backend type {backend_type!r} is already registered")
    if not isinstance(backend, str) and not isinstance(getattr(backend, "footprint", None),
                                                       Footprint):
        raise ValueError(f"backend {backend.__name__} declares no footprint")
    _REGISTRY[backend_type] = backend


def unregister(backend_type: str) -> None:
    """Forget a backend ``register`` added (nothing when it is unknown)."""
    _REGISTRY.pop(backend_type, None)


def backend_class(backend_type: str) -> type[Backend]:
    """The class for a backend type; BackendError names the supported types otherwise."""
    target = _REGISTRY.get(backend_type)
    if target is None:
        known = ", ".join(supported())
        raise BackendError(f"unknown backend type: {backend_type}; set Backend.Type in the "
                           f"network config to one of: {known}")
    if not isinstance(target, str):
        return target
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


def footprints() -> dict[str, Footprint]:
    """Every registered backend type's footprint (imports every backend's module, runs
    nothing): what ``flannelctl cleanup`` looks for on a node, whatever ran there."""
    return {backend_type: backend_class(backend_type).footprint for backend_type in supported()}


__all__ = ["Backend", "BackendConfigError", "BackendError", "BackendOptions", "Footprint",
           "backend_class", "describe", "footprints", "register", "supported", "unregister"]
