"""Network configuration: the JSON at ``<prefix>/config`` (etcd) or ``net-conf.json`` (kube).

Owns Go-compatible decoding (case-insensitive member names, typed fields, unknown members
ignored as Go does but each named once in a warning with the nearest known key, here and,
through ``warn_unknown_keys``, in each backend's options; bounded by
``flannel.untrusted.boundedjson``), the backend type rule, the ranges a Network must stay
out of, and, for etcd mode, the SubnetLen/SubnetMin/SubnetMax defaulting and validation with
upstream's exact error texts (plus SubnetMin <= SubnetMax).
Must not touch: files, the store, the kernel.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import Any

from flannel.untrusted import boundedjson, gojson
from flannel.untrusted.netutil import parse_ip, quoted

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """The network configuration is malformed or inconsistent.

    ``str(err)`` is upstream's exact text where upstream has one; ``hint`` says how to fix it.
    """

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint

    def describe(self) -> str:
        return f"{self}; {self.hint}" if self.hint else str(self)


@dataclass
class NetworkConfig:
    """A decoded network configuration. ``backend`` is the raw Backend object."""

    enable_ipv4: bool = True
    enable_ipv6: bool = False
    enable_nftables: bool = False
    network: IPv4Network | None = None
    ipv6_network: IPv6Network | None = None
    subnet_len: int = 0
    subnet_min: IPv4Address | None = None
    subnet_max: IPv4Address | None = None
    ipv6_subnet_len: int = 0
    ipv6_subnet_min: IPv6Address | None = None
    ipv6_subnet_max: IPv6Address | None = None
    backend_type: str = "udp"
    backend: dict[str, Any] = field(default_factory=dict)
    #: pyflannel extension: destinations pod traffic reaches without masquerade.
    non_masquerade: tuple[IPv4Network | IPv6Network, ...] = ()


_FIELDS = {name.lower(): name for name in (
    "Network", "IPv6Network", "EnableIPv4", "EnableIPv6", "EnableNFTables", "SubnetLen",
    "SubnetMin", "SubnetMax", "IPv6SubnetLen", "IPv6SubnetMin", "IPv6SubnetMax", "Backend",
    "NonMasqueradeCIDRs",
)}


#: (where, key) of every unknown key warned about: each is named once per process.
_warned_keys: set[tuple[str, str]] = set()
#: Unknown keys named one by one in each object; the rest are counted.
_MAX_UNKNOWN = 10


def unknown_keys(obj: Mapping[str, Any], known: Iterable[str], where: str
                 ) -> list[tuple[str, str]]:
    """(key, message) for each member of ``obj`` that matches none of ``known``
    (case-insensitively, as Go matches them); the message names the nearest known key. Go
    ignores such members without a word, so a misspelt option silently means its default."""
    names = {name.lower(): name for name in known}
    unknown = [key for key in obj if key.lower() not in names]
    found = []
    for key in unknown[:_MAX_UNKNOWN]:
        import difflib  # only for a misspelt key: not held by every flanneld

        nearest = difflib.get_close_matches(key.lower(), list(names), n=1, cutoff=0.6)
        advice = (f'did you mean "{names[nearest[0]]}"?' if nearest else
                  f"known keys: {', '.join(sorted(names.values()))}")
        found.append((key, f"unknown key {gojson.shown(key)} in {where} is ignored; {advice}"))
    if len(unknown) > _MAX_UNKNOWN:
        found.append(("", f"{len(unknown) - _MAX_UNKNOWN} more unknown keys in {where} are "
                          "ignored"))
    return found


def warn_unknown_keys(obj: Mapping[str, Any], known: Iterable[str], where: str) -> None:
    """Log each of ``unknown_keys`` as a warning, once per process."""
    for key, message in unknown_keys(obj, known, where):
        if (where, key) not in _warned_keys:
            _warned_keys.add((where, key))
            log.warning("%s", message)


def _typed(name: str, value: Any, want: type, go_type: str) -> Any:
    ok = isinstance(value, want) and not (want is int and isinstance(value, bool))
    if not ok:
        raise ConfigError(
            f"config field {name!r}: cannot use JSON {gojson.type_name(value)} "
            f"{gojson.shown(value)} as {go_type}"
        )
    return value


def _uint(name: str, value: Any) -> int:
    number: int = _typed(name, value, int, "an unsigned integer")
    if number < 0:
        raise ConfigError(f"config field {name!r}: {number} is negative; give a prefix length")
    return number


def _cidr(name: str, value: Any, version: int) -> IPv4Network | IPv6Network:
    text = _typed(name, value, str, "a CIDR string")
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise ConfigError(
            f"config field {name!r}: {quoted(text)} is not a CIDR such as "
            f"{'10.244.0.0/16' if version == 4 else 'fd00:10:244::/56'}"
        ) from None
    if net.version != version:
        raise ConfigError(
            f"config field {name!r}: {quoted(text)}: invalid IPv{version} CIDR format"
            + (" (put IPv6 networks in IPv6Network)" if version == 4 else "")
        )
    return net


# Ranges a pod network must stay out of: the kernel treats these addresses specially.
_RESERVED = tuple((ipaddress.ip_network(cidr), what) for cidr, what in (
    ("0.0.0.0/8", "the 'this network' range 0.0.0.0/8"),
    ("127.0.0.0/8", "the loopback range 127.0.0.0/8"),
    ("169.254.0.0/16", "the link-local range 169.254.0.0/16"),
    ("224.0.0.0/4", "the multicast range 224.0.0.0/4"),
    ("::1/128", "the loopback address ::1"),
    ("fe80::/10", "the link-local range fe80::/10"),
    ("ff00::/8", "the multicast range ff00::/8"),
))


def _outside_reserved(name: str, net: IPv4Network | IPv6Network) -> IPv4Network | IPv6Network:
    # A zero-length network gets upstream's own message from check_network_config.
    if net.prefixlen == 0:
        return net
    for reserved, what in _RESERVED:
        if net.version == reserved.version and net.overlaps(reserved):
            example = "10.244.0.0/16" if net.version == 4 else "fd00:10:244::/56"
            raise ConfigError(f"config field {name!r}: {net} overlaps {what}",
                              f"use a private range such as {example}")
    return net


def network_overlaps_underlay(cfg: NetworkConfig,
                              ext_addrs: Iterable[IPv4Address | IPv6Address | None]
                              ) -> str | None:
    """What is wrong when a node's own (interface or public) address lies inside the pod
    network: its traffic to other hosts would be routed into the overlay. None when fine."""
    for addr in ext_addrs:
        if addr is None:
            continue
        net = cfg.network if addr.version == 4 else cfg.ipv6_network
        enabled = cfg.enable_ipv4 if addr.version == 4 else cfg.enable_ipv6
        if enabled and net is not None and addr in net:
            field_name = "Network" if addr.version == 4 else "IPv6Network"
            return (f"{field_name} {net} contains this node's address {addr}; choose another "
                    f"{field_name} that does not overlap the hosts' own network")
    return None


def _address(name: str, value: Any, version: int) -> IPv4Address | IPv6Address:
    text = _typed(name, value, str, "an IP address string")
    try:
        return parse_ip(text, version)
    except ValueError as err:
        raise ConfigError(f"config field {name!r}: {err}") from None


def _cidr_list(name: str, value: Any) -> tuple[IPv4Network | IPv6Network, ...]:
    items = _typed(name, value, list, "a list of CIDR strings")
    out = []
    for item in items:
        text = _typed(name, item, str, "a CIDR string")
        try:
            out.append(ipaddress.ip_network(text, strict=False))
        except ValueError:
            raise ConfigError(f"config field {name!r}: {quoted(text)} is not a CIDR such as "
                              "192.168.0.0/16") from None
    return tuple(out)


def parse_backend_type(present: bool, backend: Any) -> str:
    """The backend type, lower-cased; ``udp`` when Backend is absent (upstream's rule)."""
    if not present:
        return "udp"
    if backend is None:
        return ""
    if not isinstance(backend, dict):
        raise ConfigError(
            "error decoding Backend property of config: cannot unmarshal "
            f"{gojson.type_name(backend)} into an object",
            'write "Backend": {"Type": "vxlan"}')
    members = gojson.fold_keys(backend, {"type": "Type"})
    type_value = members.get("Type")
    if type_value is None:
        return ""
    if not isinstance(type_value, str):
        raise ConfigError(
            "error decoding Backend property of config: Backend.Type must be a string, got "
            f"{gojson.type_name(type_value)}"
        )
    return type_value.lower()


def parse_config(raw: bytes | str) -> NetworkConfig:
    """Decode a network configuration without applying etcd-mode defaults."""
    try:
        doc = boundedjson.loads(raw, what="network config",
                                max_bytes=boundedjson.MAX_CONFIG_BYTES)
    except boundedjson.JSONLimitError as err:
        raise ConfigError(str(err),
                          "a network config is one small JSON object, e.g. {\"Network\": "
                          "\"10.244.0.0/16\", \"Backend\": {\"Type\": \"vxlan\"}}") from None
    if not isinstance(doc, dict):
        raise ConfigError(
            f"network config must be a JSON object, got {gojson.type_name(doc)}"
        )
    warn_unknown_keys(doc, _FIELDS.values(), "the network config")
    members = gojson.fold_keys(doc, _FIELDS)
    cfg = NetworkConfig()
    setters = {
        "Network": lambda v: setattr(
            cfg, "network", _outside_reserved("Network", _cidr("Network", v, 4))),
        "IPv6Network": lambda v: setattr(
            cfg, "ipv6_network", _outside_reserved("IPv6Network", _cidr("IPv6Network", v, 6))),
        "EnableIPv4": lambda v: setattr(cfg, "enable_ipv4", _typed("EnableIPv4", v, bool, "bool")),
        "EnableIPv6": lambda v: setattr(cfg, "enable_ipv6", _typed("EnableIPv6", v, bool, "bool")),
        "EnableNFTables": lambda v: setattr(
            cfg, "enable_nftables", _typed("EnableNFTables", v, bool, "bool")),
        "SubnetLen": lambda v: setattr(cfg, "subnet_len", _uint("SubnetLen", v)),
        "SubnetMin": lambda v: setattr(cfg, "subnet_min", _address("SubnetMin", v, 4)),
        "SubnetMax": lambda v: setattr(cfg, "subnet_max", _address("SubnetMax", v, 4)),
        "IPv6SubnetLen": lambda v: setattr(cfg, "ipv6_subnet_len", _uint("IPv6SubnetLen", v)),
        "IPv6SubnetMin": lambda v: setattr(
            cfg, "ipv6_subnet_min", _address("IPv6SubnetMin", v, 6)),
        "IPv6SubnetMax": lambda v: setattr(
            cfg, "ipv6_subnet_max", _address("IPv6SubnetMax", v, 6)),
        "NonMasqueradeCIDRs": lambda v: setattr(
            cfg, "non_masquerade", _cidr_list("NonMasqueradeCIDRs", v)),
    }
    for name, value in members.items():
        # Go leaves a field untouched when its JSON value is null.
        if name != "Backend" and value is not None:
            setters[name](value)
    cfg.backend_type = parse_backend_type("Backend" in members, members.get("Backend"))
    if not cfg.backend_type:
        raise ConfigError("Backend.Type is missing",
                          'name the backend, e.g. "Backend": {"Type": "vxlan"}')
    if isinstance(members.get("Backend"), dict):
        cfg.backend = members["Backend"]
    return cfg


def _check_family(
    network: IPv4Network | IPv6Network | None,
    subnet_len: int,
    subnet_min: IPv4Address | IPv6Address | None,
    subnet_max: IPv4Address | IPv6Address | None,
    *,
    v6: bool,
) -> tuple[int, Any, Any]:
    bits = 128 if v6 else 32
    net_name = "IPv6Network" if v6 else "Network"
    key_prefix = "IPv6" if v6 else ""
    if network is None or network.prefixlen == 0:
        raise ConfigError(
            f"please define a correct {net_name} parameter in the flannel config",
            f"set \"{net_name}\" to the cluster CIDR, e.g. "
            f"{'fd00:10:244::/56' if v6 else '10.244.0.0/16'}")
    prefix = network.prefixlen
    if subnet_len > 0:
        if subnet_len > bits - 2:
            raise ConfigError(f"SubnetLen must be less than /{bits - 1}",
                              f"set {key_prefix}SubnetLen to at most {bits - 2}")
        if subnet_len < prefix + 2:
            raise ConfigError("network must be able to accommodate at least four subnets",
                              f"set {key_prefix}SubnetLen to at least {prefix + 2} "
                              f"or use a larger {net_name}")
    elif prefix > bits - 4:
        raise ConfigError(
            f"{net_name if v6 else 'network'} is too small. "
            f"Minimum useful network prefix is /{bits - 4}",
            f"use a {net_name} of /{bits - 4} or larger")
    elif prefix <= (62 if v6 else 22):
        subnet_len = 64 if v6 else 24
    else:
        subnet_len = prefix + 2

    size = 1 << (bits - subnet_len)
    base = int(network.network_address)
    addr_type = IPv6Address if v6 else IPv4Address
    if subnet_min is None or int(subnet_min) == 0:
        subnet_min = addr_type(base + size)
    elif subnet_min not in network:
        raise ConfigError(f"{key_prefix}SubnetMin is not in the range of the {net_name}",
                          f"{key_prefix}SubnetMin {subnet_min} must lie inside {network}")
    if subnet_max is None or int(subnet_max) == 0:
        subnet_max = addr_type(base + (1 << (bits - prefix)) - size)
    elif subnet_max not in network:
        raise ConfigError(f"{key_prefix}SubnetMax is not in the range of the {net_name}",
                          f"{key_prefix}SubnetMax {subnet_max} must lie inside {network}")
    if int(subnet_min) > int(subnet_max):
        raise ConfigError(
            f"{key_prefix}SubnetMin {subnet_min} is greater than {key_prefix}SubnetMax "
            f"{subnet_max}", f"swap them, or leave them out to use all of the {net_name}")
    if int(subnet_min) % size:
        raise ConfigError(f"{key_prefix}SubnetMin is not on a SubnetLen boundary: {subnet_min}",
                          f"use a base address of a /{subnet_len}")
    if int(subnet_max) % size:
        raise ConfigError(f"{key_prefix}SubnetMax is not on a SubnetLen boundary: {subnet_max}",
                          f"use a base address of a /{subnet_len}")
    return subnet_len, subnet_min, subnet_max


def check_network_config(cfg: NetworkConfig) -> None:
    """Apply etcd-mode defaults and validation in place (upstream ``CheckNetworkConfig``)."""
    if not cfg.enable_ipv4 and not cfg.enable_ipv6:
        raise ConfigError("none defined stack", "set EnableIPv4 or EnableIPv6 to true")
    if cfg.enable_ipv4:
        cfg.subnet_len, cfg.subnet_min, cfg.subnet_max = _check_family(
            cfg.network, cfg.subnet_len, cfg.subnet_min, cfg.subnet_max, v6=False)
    if cfg.enable_ipv6:
        cfg.ipv6_subnet_len, cfg.ipv6_subnet_min, cfg.ipv6_subnet_max = _check_family(
            cfg.ipv6_network, cfg.ipv6_subnet_len, cfg.ipv6_subnet_min, cfg.ipv6_subnet_max,
            v6=True)
