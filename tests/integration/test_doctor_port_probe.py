"""doctor's probe of a peer's UDP port, against a real kernel in two namespaces of the test's
own: a peer that has already spent its burst of ICMP errors on this node (the overlay's own
datagrams to a port nothing listens on spend it) still answers the probe with port
unreachable, so doctor says nothing listens there, not that a firewall drops it."""

from __future__ import annotations

import socket

import pytest

from flannel.kernel.host import Host
from flannel.ops.checks.probes import udp_port_refused
from tests.support import netns

pytestmark = [pytest.mark.netns]

HERE, PEER = "10.99.0.1", "10.99.0.2"
PORT = 8285  # nothing listens on it in the peer's namespace


def spend_the_peers_icmp_errors() -> int:
    """Datagrams to the closed port until the peer stops answering: its burst is spent.
    How many port unreachables came back."""
    refused = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((PEER, PORT))
        sock.settimeout(0.02)
        for _ in range(20):
            try:
                sock.send(b"overlay traffic")
                sock.recv(64)
            except ConnectionRefusedError:
                refused += 1
            except TimeoutError:
                continue
    return refused


def test_a_peer_whose_icmp_errors_were_spent_is_still_found_not_listening(ns):
    peer = netns.create("p")
    try:
        netns.ip("link", "add", "veth0", "type", "veth", "peer", "name", "veth1", "netns", peer,
                 netns=ns)
        for name, device, address in ((ns, "veth0", HERE), (peer, "veth1", PEER)):
            netns.ip("addr", "add", f"{address}/24", "dev", device, netns=name)
            netns.ip("link", "set", device, "up", netns=name)
        with Host(ns).entered():
            # The kernel's default: one error a second to an address once a burst is spent.
            assert spend_the_peers_icmp_errors() < 20
            assert udp_port_refused(PEER, PORT, timeout=0.5) is True
    finally:
        netns.delete(peer)
