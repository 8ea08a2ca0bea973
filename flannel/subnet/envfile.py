"""subnet.env: the file flanneld writes for the CNI plugin and reads back on restart.

Owns the exact line format and order of upstream's ``WriteSubnetFile`` and the dotenv-style
reading used to find the previous subnet. Must not touch: the store, the kernel.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network
from pathlib import Path

from flannel.fileutil import write_atomic

DEFAULT_PATH = "/run/flannel/subnet.env"


@dataclass(frozen=True)
class SubnetEnv:
    """What subnet.env says about this node."""

    network: IPv4Network | None
    subnet: IPv4Network | None
    ipv6_network: IPv6Network | None
    ipv6_subnet: IPv6Network | None
    mtu: int
    ip_masq: bool

    def render(self) -> str:
        lines = []
        if self.network is not None and self.subnet is not None:
            lines.append(f"FLANNEL_NETWORK={self.network}")
            lines.append(f"FLANNEL_SUBNET={_first_usable(self.subnet)}")
        if self.ipv6_network is not None and self.ipv6_subnet is not None:
            lines.append(f"FLANNEL_IPV6_NETWORK={self.ipv6_network}")
            lines.append(f"FLANNEL_IPV6_SUBNET={_first_usable(self.ipv6_subnet)}")
        lines.append(f"FLANNEL_MTU={self.mtu}")
        lines.append(f"FLANNEL_IPMASQ={'true' if self.ip_masq else 'false'}")
        return "".join(line + "\n" for line in lines)


def _first_usable(subnet: IPv4Network | IPv6Network) -> str:
    return f"{subnet.network_address + 1}/{subnet.prefixlen}"


def write_subnet_env(path: str | Path, env: SubnetEnv) -> None:
    """Write subnet.env atomically, mode 0644 whatever the umask, parent dirs 0755."""
    write_atomic(path, env.render().encode(), mode=0o644, dir_mode=0o755)


def parse_dotenv(text: str) -> dict[str, str]:
    """Parse dotenv text (``KEY=value``, ``export``, quotes, ``#`` comments) as godotenv does."""
    values: dict[str, str] = {}
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        key, sep, value = line.partition("=")
        if not sep:
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        values[key.strip()] = value
    return values


def read_env(path: str | Path) -> dict[str, str]:
    """The key/values of a subnet.env; empty when the file does not exist."""
    try:
        return parse_dotenv(Path(path).read_text())
    except FileNotFoundError:
        return {}


def cidrs_of(values: dict[str, str], key: str) -> list[IPv4Network | IPv6Network]:
    """Comma-separated CIDRs of ``key``, masked (``10.5.72.1/24`` -> ``10.5.72.0/24``).

    Items that do not parse are skipped, as upstream does.
    """
    out: list[IPv4Network | IPv6Network] = []
    for item in values.get(key, "").split(","):
        try:
            out.append(ipaddress.ip_network(item.strip(), strict=False))
        except ValueError:
            continue
    return out


def single_cidr(values: dict[str, str], key: str, version: int) -> IPv4Network | IPv6Network | None:
    """The one CIDR of ``key`` in the given family; None when there are zero or several."""
    found = [net for net in cidrs_of(values, key) if net.version == version]
    return found[0] if len(found) == 1 else None
