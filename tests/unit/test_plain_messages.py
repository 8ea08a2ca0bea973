"""The kernel's messages for the IPv4 entries flanneld installs, read whole in their plain
layout (flannel.kernel.rtnl.plain_neighbour, plain_route), say what the attribute decoder
says; any other layout is left to it; and the VTEP entry sets tell their own entries from
those readings exactly as from the decoded entries."""

import socket
import struct
from ipaddress import IPv4Address, IPv4Network

import pytest

from flannel.backend.vtep import VtepFdb, VtepNeighbours, VtepRoutes, VtepTable, mac_number
from flannel.kernel import rtnl
from flannel.kernel.rtnl import attr
from flannel.lease import Lease, LeaseAttrs

MAC = bytes.fromhex("0e0000000002")
BASE = IPv4Address("10.244.2.0").packed
PUBLIC = IPv4Address("192.168.50.3").packed
CACHEINFO = attr(3, bytes(range(16)))


def neighbour(ip: bytes = BASE, mac: bytes = MAC, *, ifindex: int = 5, family: int = 2,
              extra: bytes = attr(4, struct.pack("=I", 0)) + CACHEINFO + attr(12, b"\x97")
              ) -> bytes:
    """A neighbour message as the kernel dumps a permanent one flanneld installed."""
    return (rtnl._NDMSG.pack(family, 0, 0, ifindex, rtnl.NUD_PERMANENT, 0, rtnl.RTN_UNICAST)
            + attr(rtnl.NDA_DST, ip) + attr(rtnl.NDA_LLADDR, mac) + extra)


def fdb(mac: bytes = MAC, dst: bytes = PUBLIC, *, ifindex: int = 5, extra: bytes = b"") -> bytes:
    return (rtnl._NDMSG.pack(rtnl.AF_BRIDGE, 0, 0, ifindex, rtnl.NUD_PERMANENT, rtnl.NTF_SELF,
                             0) + attr(rtnl.NDA_LLADDR, mac) + attr(rtnl.NDA_DST, dst) + extra
            + CACHEINFO)


def route(dst: bytes = BASE, gateway: bytes = BASE, *, length: int = 24, oif: int = 5,
          flags: int = rtnl.RTNH_F_ONLINK, extra: bytes = b"") -> bytes:
    return (rtnl._RTMSG.pack(socket.AF_INET, length, 0, 0, rtnl.RT_TABLE_MAIN,
                             rtnl.RTPROT_FLANNEL, 0, rtnl.RTN_UNICAST, flags)
            + attr(rtnl.RTA_TABLE, struct.pack("=I", rtnl.RT_TABLE_MAIN)) + attr(rtnl.RTA_DST, dst)
            + attr(rtnl.RTA_GATEWAY, gateway) + attr(rtnl.RTA_OIF, struct.pack("=i", oif))
            + extra)


def test_the_plain_layouts_read_as_the_decoder_reads_them():
    plain = rtnl.plain_neighbour(neighbour())
    entry, state, flags = rtnl.decode_neighbour(neighbour())
    assert plain == (5, rtnl.NUD_PERMANENT, 0, BASE, MAC)
    assert (entry.ifindex, entry.ip, entry.mac, state, flags) == (
        5, "10.244.2.0", "0e:00:00:00:00:02", rtnl.NUD_PERMANENT, 0)
    assert rtnl.plain_neighbour(fdb()) == (5, rtnl.NUD_PERMANENT, rtnl.NTF_SELF, PUBLIC, MAC)
    assert rtnl.decode_neighbour(fdb())[0] == rtnl.FdbEntry(5, "0e:00:00:00:00:02",
                                                            "192.168.50.3")
    assert rtnl.plain_route(route()) == (rtnl.RTPROT_FLANNEL, rtnl.RT_TABLE_MAIN,
                                         rtnl.RTN_UNICAST, rtnl.RTNH_F_ONLINK, 5, BASE, 24,
                                         BASE)
    assert rtnl.decode_route(route())[0] == rtnl.Route("10.244.2.0/24", "10.244.2.0", 5,
                                                       onlink=True)


@pytest.mark.parametrize(("read", "body"), [
    (rtnl.plain_neighbour, neighbour(extra=attr(4, struct.pack("=I", 0)) + CACHEINFO)),
    (rtnl.plain_neighbour, neighbour(family=socket.AF_INET6, ip=bytes(16))),
    (rtnl.plain_neighbour, fdb(extra=attr(rtnl.NDA_PORT, struct.pack("!H", 9999)))),
    (rtnl.plain_neighbour, fdb(extra=attr(rtnl.NDA_VNI, struct.pack("=I", 7)))),
    (rtnl.plain_route, route(extra=attr(rtnl.RTA_PRIORITY, struct.pack("=I", 5)))),
    (rtnl.plain_route, route()[:-8]),
], ids=["neighbour without protocol", "IPv6 neighbour", "FDB port", "FDB VNI", "metric",
        "no device"])
def test_any_other_layout_is_left_to_the_decoder(read, body):
    assert read(body) is None


def sets() -> tuple[VtepRoutes, VtepNeighbours, VtepFdb]:
    table = VtepTable(5, 4)
    lease = Lease(IPv4Network("10.244.2.0/24"), None, LeaseAttrs(
        public_ip=IPv4Address("192.168.50.3"), backend_type="vxlan",
        backend_data='{"VNI":1,"VtepMAC":"0e:00:00:00:00:02"}'))
    mac = mac_number("0e:00:00:00:00:02")
    assert mac is not None
    table.add(int(lease.subnet.network_address), mac, lease)
    return VtepRoutes((table,), frozenset()), VtepNeighbours((table,)), VtepFdb((table,))


@pytest.mark.parametrize(("kind", "body"), [
    ("neighbours", neighbour()), ("neighbours", neighbour(mac=bytes.fromhex("0e0000000099"))),
    ("neighbours", neighbour(ip=IPv4Address("10.244.3.0").packed)),
    ("neighbours", neighbour(ifindex=6)),
    ("fdb", fdb()), ("fdb", fdb(dst=IPv4Address("192.168.50.99").packed)),
    ("fdb", fdb(mac=bytes.fromhex("0e0000000099"))), ("fdb", fdb(ifindex=6)),
    ("routes", route()), ("routes", route(length=25)),
    ("routes", route(gateway=PUBLIC)), ("routes", route(flags=0)), ("routes", route(oif=6)),
])
def test_a_vtep_set_tells_its_entries_from_a_plain_reading_as_from_the_entry(kind, body):
    routes, neighbours, entries = sets()
    held = {"routes": routes, "neighbours": neighbours, "fdb": entries}[kind]
    if kind == "routes":
        plain, decoded = rtnl.plain_route(body), rtnl.decode_route(body)
    else:
        plain, decoded = rtnl.plain_neighbour(body), rtnl.decode_neighbour(body)
    assert plain is not None and decoded is not None
    assert held.holds_plain(plain) == (decoded[0] in held)
