"""Kubernetes node annotations: names, what we publish, and node -> lease.

Owns the annotation prefix rules of Go flannel (compat reference 4.2), the annotations this
node publishes for its lease (4.3) and the decoding of other nodes' annotations into leases
(4.4). Pure functions over plain dicts; no API calls.
Must not touch: the API server, the kernel.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from functools import cached_property
from ipaddress import IPv4Network, IPv6Network
from typing import Any

from flannel.lease import Lease, LeaseAttrs
from flannel.untrusted import boundedjson
from flannel.untrusted.netutil import parse_ip, quoted

_PREFIX = re.compile(r"(?:[a-z0-9_-]+\.)+[a-z0-9_-]+/(?:[a-z0-9_-]+-)?$")


class AnnotationError(ValueError):
    """An annotation prefix or a node's annotations are unusable."""


class NotManaged(AnnotationError):
    """The node does not run flannel (not a fault: such nodes are simply not peers)."""


@dataclass(frozen=True)
class Annotations:
    """The full annotation names for one prefix."""

    prefix: str

    @classmethod
    def for_prefix(cls, raw: str) -> Annotations:
        if raw.count("/") > 1:
            raise AnnotationError("subnet/kube: prefix can contain at most single slash")
        prefix = raw if "/" in raw else raw + "/"
        if not prefix.endswith(("/", "-")):
            prefix += "-"
        if not _PREFIX.match(prefix):
            raise AnnotationError("subnet/kube: prefix must be in a format: fqdn/[0-9a-z-_]*")
        return cls(prefix)

    def name(self, suffix: str) -> str:
        return self.prefix + suffix

    # Made once: a snapshot reads four of them for every node.
    subnet_manager = cached_property(lambda self: self.name("kube-subnet-manager"))
    backend_type = cached_property(lambda self: self.name("backend-type"))
    backend_data = cached_property(lambda self: self.name("backend-data"))
    backend_v6_data = cached_property(lambda self: self.name("backend-v6-data"))
    public_ip = cached_property(lambda self: self.name("public-ip"))
    public_ipv6 = cached_property(lambda self: self.name("public-ipv6"))
    public_ip_overwrite = cached_property(lambda self: self.name("public-ip-overwrite"))
    public_ipv6_overwrite = cached_property(lambda self: self.name("public-ipv6-overwrite"))
    node_public_ip = cached_property(lambda self: self.name("node-public-ip"))
    node_public_ipv6 = cached_property(lambda self: self.name("node-public-ipv6"))


def published(names: Annotations, attrs: LeaseAttrs, existing: dict[str, str],
              ipv4: bool, ipv6: bool) -> dict[str, str]:
    """The annotations this node must carry for ``attrs`` (upstream's AcquireLease)."""
    out = {names.backend_type: attrs.backend_type, names.subnet_manager: "true"}
    kind = attrs.backend_type
    if ipv4 and not (kind == "vxlan" and attrs.backend_data is None):
        out[names.backend_data] = attrs.backend_data or "null"
        overwrite = existing.get(names.public_ip_overwrite, "")
        out[names.public_ip] = overwrite or (str(attrs.public_ip) if attrs.public_ip else "")
    has_v6_ip = attrs.public_ipv6 is not None
    if ipv6 and (
            (kind == "vxlan" and attrs.backend_v6_data is not None)
            or (kind == "wireguard" and attrs.backend_v6_data is not None and has_v6_ip)
            or (kind in ("host-gw", "extension") and has_v6_ip)):
        out[names.backend_v6_data] = attrs.backend_v6_data or "null"
        overwrite = existing.get(names.public_ipv6_overwrite, "")
        out[names.public_ipv6] = overwrite or str(attrs.public_ipv6)
    return out


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def pod_cidrs(name: str, spec: dict[str, Any]) -> tuple[IPv4Network | None,
                                                          IPv6Network | None]:
    """The node's pod CIDRs by family; AnnotationError with upstream's texts."""
    v4, v6 = _cidr_families(name, spec.get("podCIDR"), spec.get("podCIDRs"))
    return (None if v4 is None else IPv4Network(v4)), v6


def _cidr_families(name: str, pod_cidr: Any, pod_cidrs: Any
                   ) -> tuple[tuple[int, int] | None, IPv6Network | None]:
    """``pod_cidrs``'s: the IPv4 one as (first address, prefix length), the IPv6 one."""
    cidrs = pod_cidrs or []
    if not cidrs and pod_cidr:
        cidrs = [pod_cidr]
    if not isinstance(cidrs, list) or not all(isinstance(text, str) for text in cidrs):
        raise AnnotationError(f'node "{name}": pod CIDRs must be a list of CIDR strings')
    if not cidrs:
        raise AnnotationError(f'node "{name}" pod cidr not assigned')
    if len(cidrs) > 2:
        raise AnnotationError(f'node "{name}" pod cidrs should be IPv4/IPv6 only or dualstack')
    v4: tuple[int, int] | None = None
    v6: IPv6Network | None = None
    for text in cidrs:
        family = _v4_cidr(text)
        if family is None:
            try:
                net = ipaddress.ip_network(text, strict=False)
            except ValueError:
                raise AnnotationError(f'node "{name}": pod CIDR {quoted(text)} is not a CIDR'
                                      ) from None
            if isinstance(net, IPv6Network):
                v6 = v6 or net
                continue
            family = int(net.network_address), net.prefixlen
        v4 = v4 or family
    return v4, v6


_ALL_V4 = (1 << 32) - 1


def _v4_cidr(text: str) -> tuple[int, int] | None:
    """An IPv4 CIDR written ``a.b.c.d/len``, as the API server writes pod CIDRs, read as
    ``ip_network(text, strict=False)`` reads it (its first address, its prefix length) at a
    fifth of the cost (a snapshot reads every node's); None for any other text, read by
    ``ip_network`` (inet_pton accepts exactly the dotted quads ``IPv4Address`` does)."""
    address, slash, bits = text.partition("/")
    if not slash or not (0 < len(bits) <= 2 and bits.isascii() and bits.isdigit()):
        return None
    prefixlen = int(bits)
    if prefixlen > 32:
        return None
    try:
        number = int.from_bytes(socket.inet_pton(socket.AF_INET, address), "big")
    except (OSError, ValueError):
        return None
    return number & (_ALL_V4 ^ (_ALL_V4 >> prefixlen)), prefixlen


def _text(annotations: dict[str, Any], key: str) -> str:
    value = annotations.get(key, "")
    if not isinstance(value, str):
        raise AnnotationError(f"annotation {key} must be a string")
    if len(value) > boundedjson.MAX_LEASE_BYTES:
        raise AnnotationError(f"annotation {key} is longer than the limit of "
                              f"{boundedjson.MAX_LEASE_BYTES} characters")
    return value


def _raw_json(annotations: dict[str, Any], key: str) -> str | None:
    text = _text(annotations, key)
    if text in ("", "null"):
        return None
    try:
        boundedjson.loads(text, what=f"annotation {key}", max_bytes=boundedjson.MAX_LEASE_BYTES)
    except boundedjson.JSONLimitError as err:
        raise AnnotationError(str(err)) from None
    return text


def _public_ip(annotations: dict[str, Any], key: str, version: int) -> Any:
    text = _text(annotations, key)
    try:
        return parse_ip(text, version)
    except ValueError as err:
        raise AnnotationError(f"annotation {key}: {err}") from None


def node_lease(node: dict[str, Any], names: Annotations, ipv4: bool, ipv6: bool,
               created: int = 0) -> Lease:
    """The lease another node publishes (as old as ``created``, the Node's creation time);
    AnnotationError if it publishes none or a bad one.

    Whatever the node object holds (the API server accepts any annotation value), the only
    exception is AnnotationError.
    """
    meta = _mapping(node.get("metadata"))
    name = meta.get("name")
    spec = _mapping(node.get("spec"))
    return lease_of(name if isinstance(name, str) else "?", _mapping(meta.get("annotations")),
                    spec.get("podCIDR"), spec.get("podCIDRs"), names, ipv4, ipv6, created)


def lease_of(name: str, annotations: dict[str, Any], pod_cidr: Any, cidrs: Any,
             names: Annotations, ipv4: bool, ipv6: bool, created: int = 0) -> Lease:
    """``node_lease`` of a node given by its parts (``spec.podCIDR``, ``spec.podCIDRs``):
    a kept node view is read without being made a node again."""
    if annotations.get(names.subnet_manager) != "true":
        raise NotManaged(f"node {name} is not managed by flannel")
    v4, v6 = _cidr_families(name, pod_cidr, cidrs)
    try:
        public_ip = public_ipv6 = None
        data = data6 = None
        if ipv4:
            if v4 is None:
                raise AnnotationError("missing IPv4 address on n.Spec.PodCIDRs")
            public_ip = _public_ip(annotations, names.public_ip, 4)
            data = _raw_json(annotations, names.backend_data)
        if ipv6:
            if v6 is None:
                raise AnnotationError("missing IPv6 address on n.Spec.PodCIDRs")
            public_ipv6 = _public_ip(annotations, names.public_ipv6, 6)
            data6 = _raw_json(annotations, names.backend_v6_data)
        backend_type = _text(annotations, names.backend_type)
    except AnnotationError as err:
        raise AnnotationError(f"node {name}: {err}") from None
    attrs = LeaseAttrs(public_ip=public_ip, public_ipv6=public_ipv6,
                       backend_type=backend_type, backend_data=data, backend_v6_data=data6)
    return Lease.from_numbers(v4 if ipv4 else None, v6 if ipv6 else None, attrs, created=created)
