"""Our SET_DEVICE requests against an independent encoder: pyroute2's WireGuard message class
(a test-only dependency; flanneld never imports pyroute2) encodes the same requests to the
same bytes. The one liberty either side takes: the type of an array element's nest (the
kernel reads the elements of WGDEVICE_A_PEERS and WGPEER_A_ALLOWEDIPS whatever their type;
pyroute2 numbers them from 1, ``wg`` and we write 0), set to 0 before comparing."""

from __future__ import annotations

import base64
import struct

import pytest
from pyroute2.netlink.generic.wireguard import wgmsg

from flannel.wireguard import genl
from flannel.wireguard.keys import Secret
from flannel.wireguard.uapi import DeviceUpdate, PeerUpdate

FAMILY = 0x1D
PRIV = Secret(bytes(range(32)))
PSK = Secret(bytes(range(32, 64)))
PUB = base64.b64encode(bytes(range(64, 96))).decode()
PUB2 = base64.b64encode(bytes(range(96, 128))).decode()
NESTED = 0x8000
PEERS, ALLOWEDIPS = 8 | NESTED, 9 | NESTED


def pyroute2_request(seq: int, device: list, peers: list) -> bytes:
    msg = wgmsg()
    msg["cmd"], msg["version"] = 1, 1
    msg["header"]["type"], msg["header"]["flags"] = FAMILY, 0x5
    msg["header"]["sequence_number"] = seq
    msg["attrs"] = [["WGDEVICE_A_IFNAME", "flannel-wg"], *device]
    if peers:
        msg["attrs"].append(["WGDEVICE_A_PEERS", [{"attrs": peer} for peer in peers]])
    msg.encode()
    return bytes(msg.data)


def allowed(family: int, addr: bytes, cidr: int) -> dict:
    return {"attrs": [["WGALLOWEDIP_A_FAMILY", family], ["WGALLOWEDIP_A_IPADDR", addr],
                      ["WGALLOWEDIP_A_CIDR_MASK", cidr]]}


def elements_typed_zero(message: bytes) -> bytes:
    """``message`` with every peer and allowed-IP nest typed 0 (NLA_F_NESTED kept)."""
    out = bytearray(message)

    def children(start: int, end: int) -> list[tuple[int, int, int]]:
        found = []
        while start < end:
            length, kind = struct.unpack_from("=HH", out, start)
            found.append((start, start + length, kind))
            start += (length + 3) & ~3
        return found

    for start, end, kind in children(20, len(out)):
        if kind != PEERS:
            continue
        for peer_start, peer_end, _kind in children(start + 4, end):
            struct.pack_into("=H", out, peer_start + 2, NESTED)
            for attr_start, attr_end, attr_kind in children(peer_start + 4, peer_end):
                if attr_kind == ALLOWEDIPS:
                    for ip_start, _ip_end, _k in children(attr_start + 4, attr_end):
                        struct.pack_into("=H", out, ip_start + 2, NESTED)
    return bytes(out)


CASES = {
    "a new peer in full, with the device's key and port": (
        DeviceUpdate(private_key=PRIV, listen_port=51820, peers=(PeerUpdate(
            PUB, endpoint="192.168.1.2:51820", psk=PSK, set_psk=True, keepalive=25,
            allowed_ips=frozenset({"10.5.2.0/24", "fd00:5:2::/64"})),)),
        [["WGDEVICE_A_PRIVATE_KEY", PRIV.base64()], ["WGDEVICE_A_LISTEN_PORT", 51820]],
        [[["WGPEER_A_PUBLIC_KEY", PUB], ["WGPEER_A_FLAGS", 2],
          ["WGPEER_A_PRESHARED_KEY", PSK.base64()],
          ["WGPEER_A_ENDPOINT", {"addr": "192.168.1.2", "port": 51820}],
          ["WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL", 25],
          ["WGPEER_A_ALLOWEDIPS", [allowed(2, bytes([10, 5, 2, 0]), 24),
                                   allowed(10, bytes.fromhex("fd000005000200000000000000000000"),
                                           64)]]]]),
    "field fixes, a PSK cleared and a removal": (
        DeviceUpdate(peers=(
            PeerUpdate(PUB, update_only=True, endpoint="[fd00::2]:51821"),
            PeerUpdate(PUB2, update_only=True, set_psk=True, keepalive=0),
            PeerUpdate(PUB, remove=True))),
        [],
        [[["WGPEER_A_PUBLIC_KEY", PUB], ["WGPEER_A_FLAGS", 4],
          ["WGPEER_A_ENDPOINT", {"addr": "fd00::2", "port": 51821}]],
         [["WGPEER_A_PUBLIC_KEY", PUB2], ["WGPEER_A_FLAGS", 4],
          ["WGPEER_A_PRESHARED_KEY", base64.b64encode(bytes(32)).decode()],
          ["WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL", 0]],
         [["WGPEER_A_PUBLIC_KEY", PUB], ["WGPEER_A_FLAGS", 1]]]),
}


@pytest.mark.parametrize("name", CASES)
def test_pyroute2_encodes_our_requests_to_the_same_bytes(name):
    update, device, peers = CASES[name]
    (ours,) = genl.encode_set_device(FAMILY, "flannel-wg", update, 9)
    theirs = pyroute2_request(9, device, peers)
    assert elements_typed_zero(theirs) != theirs  # pyroute2 does number its elements
    assert elements_typed_zero(ours) == ours
    assert ours == elements_typed_zero(theirs)
