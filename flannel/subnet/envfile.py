"""subnet.env: the file flanneld writes for the CNI plugin and reads back on restart.

Owns the exact line format and order of upstream's ``WriteSubnetFile`` and the dotenv-style
reading used to find the previous subnet. The previous file is read tolerantly: whatever
cannot be read or parsed is ignored with a warning, never fatal (it only helps reuse the
previous subnet). A directory on the way to the file that other users can write (so they
could replace what every pod's network is made from) is warned about once per path.
Must not touch: the store, the kernel.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network
from pathlib import Path
from typing import Literal, overload

from flannel.files.fileutil import read_head, unsafe_path, write_atomic

log = logging.getLogger(__name__)

DEFAULT_PATH = "/run/flannel/subnet.env"
#: How much of a previous subnet.env is read; the real file is about 150 bytes.
MAX_ENV_BYTES = 64 * 1024

_warned: set[str] = set()


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
    if str(path) in _warned:
        return
    try:
        why, _ = unsafe_path(Path(path))
    except OSError:
        return  # replaced meanwhile: the next write checks again
    if why is not None:
        _warned.add(str(path))
        log.warning("%s can be replaced by other users: %s; the CNI plugin builds every pod's "
                    "network from it", path, why)


def _parse_line(raw_line: str) -> tuple[str, str] | Literal[False] | None:
    """One dotenv line: (key, value), None for a blank or comment line, False if unparsable."""
    line = raw_line.strip()
    if not line or line.startswith("#"):
        return None
    if line.startswith("export "):
        line = line[len("export "):].lstrip()
    key, sep, value = line.partition("=")
    if not sep or not key.strip():
        return False
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]
    elif " #" in value:
        value = value.split(" #", 1)[0].rstrip()
    return key.strip(), value


def parse_dotenv(text: str) -> dict[str, str]:
    """Parse dotenv text (``KEY=value``, ``export``, quotes, ``#`` comments) as godotenv does.

    Lines that are not ``KEY=value`` are skipped.
    """
    values: dict[str, str] = {}
    for raw_line in text.splitlines():
        parsed = _parse_line(raw_line)
        if parsed:
            values[parsed[0]] = parsed[1]
    return values


def read_env(path: str | Path) -> dict[str, str]:
    """The key/values of a previous subnet.env; empty when there is none or it is unreadable.

    Never raises: lines that are not UTF-8 or not ``KEY=value`` are skipped, a directory or
    an unreadable file counts as absent, and a file beyond MAX_ENV_BYTES is cut there; each
    is logged once as a warning naming the path.
    """
    try:
        data, truncated = read_head(path, MAX_ENV_BYTES)
    except FileNotFoundError:
        return {}
    except OSError as err:
        log.warning("ignoring the previous %s: %s; a new subnet may be chosen", path,
                    err.strerror or err)
        return {}
    lines = data.split(b"\n")
    if truncated:
        log.warning("%s is larger than %d bytes; ignoring the rest", path, MAX_ENV_BYTES)
        lines.pop()  # cut in the middle
    values: dict[str, str] = {}
    ignored: list[int] = []
    for number, raw_line in enumerate(lines, 1):
        try:
            parsed = _parse_line(raw_line.decode())
        except UnicodeDecodeError:
            parsed = False
        if parsed is False:
            ignored.append(number)
        elif parsed:
            values[parsed[0]] = parsed[1]
    if ignored:
        shown = ", ".join(map(str, ignored[:5])) + (", ..." if len(ignored) > 5 else "")
        log.warning("ignoring %d line(s) of %s that are not UTF-8 KEY=value (line %s)",
                    len(ignored), path, shown)
    return values


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


@overload
def single_cidr(values: dict[str, str], key: str, version: Literal[4]) -> IPv4Network | None: ...
@overload
def single_cidr(values: dict[str, str], key: str, version: Literal[6]) -> IPv6Network | None: ...
def single_cidr(values: dict[str, str], key: str, version: int) -> IPv4Network | IPv6Network | None:
    """The one CIDR of ``key`` in the given family; None when there are zero or several."""
    found = [net for net in cidrs_of(values, key) if net.version == version]
    return found[0] if len(found) == 1 else None
