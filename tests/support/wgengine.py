"""A node of the WireGuard engine's tests, here on wireguard-go and in the vm lane on the
kernel's module: its namespace, underlay address, subnet, key and run directory, the device
it asks for and the lease it publishes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

from flannel.kernel.host import Host
from flannel.lease import Lease, LeaseAttrs
from flannel.wireguard.config import encode_lease_data
from flannel.wireguard.device import DeviceSpec
from flannel.wireguard.keys import Secret, generate_private_key, public_key
from tests.support import netns

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


@contextlib.contextmanager
def linked_pair(prefix: str, run_dir: Callable[[], Path]) -> Iterator[tuple[Node, Node]]:
    """Two nodes in namespaces of their own (named from ``prefix``) joined by a veth on
    192.168.77.0/24, each with a run directory from ``run_dir``; the namespaces are removed
    at the end, whatever happened."""
    created: list[str] = []
    try:
        nodes = []
        for n in (1, 2):
            created.append(netns.create(prefix))
            nodes.append(Node(created[-1], IPv4Address(f"192.168.77.{n}"),
                              IPv4Network(f"10.5.{n}.0/24"), generate_private_key(), run_dir()))
        a, b = nodes
        netns.ip("link", "add", "ul0", "type", "veth", "peer", "name", "ul0", "netns", b.ns,
                 netns=a.ns)
        for node in nodes:
            netns.ip("addr", "add", f"{node.underlay}/24", "dev", "ul0", netns=node.ns)
            netns.ip("link", "set", "ul0", "up", netns=node.ns)
        yield a, b
    finally:
        for name in created:
            netns.delete(name)
