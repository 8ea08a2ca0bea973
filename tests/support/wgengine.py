"""A node of the WireGuard engine's tests, here on wireguard-go and in the vm lane on the
kernel's module: its namespace, underlay address, subnet, key and run directory, the device
it asks for and the lease it publishes."""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

from flannel.kernel.host import Host
from flannel.lease import Lease, LeaseAttrs
from flannel.wireguard.config import encode_lease_data
from flannel.wireguard.device import DeviceSpec
from flannel.wireguard.keys import Secret, public_key

NETWORK = IPv4Network("10.5.0.0/16")


@dataclass
class Node:
    ns: str
    underlay: IPv4Address
    subnet: IPv4Network
    key: Secret
    run_dir: Path

    def spec(self) -> DeviceSpec:
        base = self.subnet.network_address
        return DeviceSpec("flannel-wg", 51820, 1420, self.key, addresses=((base, NETWORK),),
                          routes=(NETWORK,), host=Host(self.ns), run_dir=self.run_dir,
                          log_path=self.run_dir / "wireguard-go.log")

    def lease(self) -> Lease:
        return Lease(self.subnet, attrs=LeaseAttrs(
            public_ip=self.underlay, backend_type="wireguard",
            backend_data=encode_lease_data(public_key(self.key), 51820)))
