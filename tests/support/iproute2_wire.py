"""What iproute2's ``ip`` sends to the kernel for a link or address request, and the same
request from ``flannel/kernel/links.py``, for comparing them byte for byte.

``capture`` runs ``ip -n <ns> ...`` under strace (``-e write=all`` dumps every buffer a
``sendmsg`` sends) and returns the netlink messages; ``CASES`` pairs each ``ip`` command with
the encoder call that must produce the same message. Sequence numbers and port ids are
zeroed before comparing (``normalised``); device indices are the namespace's own.
``GOLDEN`` holds the messages iproute2 6.1 sent when these cases were captured (device
indices: veth0 3, flannel.1 4, flannel-v6.1 5, gone.9 6), so the comparison also runs where
strace is not installed.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address, ip_address

from flannel.kernel import links, rtnl

#: A line of strace's hex dump: " | 00010  hex bytes (16, in two groups)  ascii |".
HEX_LINE = re.compile(r"^ \| [0-9a-f]{5}  ")
#: Request types compared; ``ip`` also sends RTM_GETLINK lookups to resolve names.
CHANGES = (rtnl.RTM_NEWLINK, rtnl.RTM_DELLINK, rtnl.RTM_NEWADDR, rtnl.RTM_DELADDR)


def strace_available() -> bool:
    return shutil.which("strace") is not None


def capture(ns: str, *args: str) -> list[bytes]:
    """The netlink messages ``ip -n ns args`` sent (whether or not the kernel accepted them)."""
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        subprocess.run(["strace", "-f", "-qq", "-e", "trace=sendmsg", "-e", "write=all",
                        "-o", out.name, "ip", "-n", ns, *args], capture_output=True,
                       timeout=30, check=False)
        buffers: list[bytearray] = []
        for line in out.read().splitlines():
            if "bytes in buffer" in line:
                buffers.append(bytearray())
            elif HEX_LINE.match(line) and buffers:
                buffers[-1] += bytes.fromhex("".join(line[10:59].split()))
    messages = []
    for buffer in buffers:
        offset = 0
        while offset + 16 <= len(buffer):
            length = struct.unpack_from("=I", buffer, offset)[0]
            messages.append(bytes(buffer[offset:offset + length]))
            offset += (length + 3) & ~3
    return messages


def change_request(messages: list[bytes]) -> bytes:
    """The one link/address change among what ``ip`` sent."""
    found = [m for m in messages if struct.unpack_from("=H", m, 4)[0] in CHANGES]
    assert len(found) == 1, f"expected one change request, got {len(found)}"
    return found[0]


def normalised(message: bytes) -> bytes:
    return message[:8] + b"\0" * 8 + message[16:]


@dataclass(frozen=True)
class Case:
    name: str
    args: tuple[str, ...]
    encode: Callable[[dict[str, int]], bytes]  # device name -> index, to the message


V4, V6 = IPv4Address("192.168.50.2"), IPv6Address("fd00:50::2")
MAC, MAC2 = "0e:00:00:00:00:01", "0e:00:00:00:00:09"


def _vxlan(name: str, info: Callable[[dict[str, int]], links.VxlanInfo], mtu: int = 0,
           mac: str = "") -> Callable[[dict[str, int]], bytes]:
    return lambda idx: links.encode_new_link(links.NewLink(name, "vxlan", info(idx), mtu, mac), 0)


def _iptun(name: str, info: Callable[[dict[str, int]], links.IptunInfo]
           ) -> Callable[[dict[str, int]], bytes]:
    return lambda idx: links.encode_new_link(links.NewLink(name, "ipip", info(idx)), 0)


def _addr(msg_type: int, dev: str, text: str, flags: int = 0
          ) -> Callable[[dict[str, int]], bytes]:
    address = ip_address(text.split("/")[0])
    plen = int(text.split("/")[1])
    return lambda idx: links.encode_address(msg_type, idx[dev], address, plen, 0, flags)


CASES = (
    Case("vxlan v4, every option",
         ("link", "add", "vx4", "address", MAC, "mtu", "1450", "type", "vxlan", "dev", "veth0",
          "gbp", "l2miss", "id", "7", "local", str(V4), "nolearning", "dstport", "4789"),
         _vxlan("vx4", lambda idx: links.VxlanInfo(7, V4, idx["veth0"], 4789, learning=False,
                                                   gbp=True, l2miss=True), 1450, MAC)),
    Case("vxlan v4 as flanneld creates it",
         ("link", "add", "flannel.2", "address", MAC, "mtu", "1450", "type", "vxlan", "dev",
          "veth0", "id", "2", "local", str(V4), "nolearning"),
         _vxlan("flannel.2", lambda idx: links.VxlanInfo(2, V4, idx["veth0"], learning=False),
                1450, MAC)),
    Case("vxlan v6 with port, learning and GBP",
         ("link", "add", "vx6", "address", MAC, "mtu", "1430", "type", "vxlan", "dev", "veth0",
          "gbp", "id", "8", "local", str(V6), "learning", "dstport", "8472"),
         _vxlan("vx6", lambda idx: links.VxlanInfo(8, V6, idx["veth0"], 8472, gbp=True),
                1430, MAC)),
    Case("vxlan without underlay device or local address",
         ("link", "add", "vx9", "type", "vxlan", "id", "9", "nolearning"),
         _vxlan("vx9", lambda idx: links.VxlanInfo(9, learning=False))),
    Case("ipip with local, link and ttl",
         ("link", "add", "flannel.ipip", "type", "ipip", "local", str(V4), "dev", "veth0",
          "ttl", "64"),
         _iptun("flannel.ipip", lambda idx: links.IptunInfo(V4, underlay=idx["veth0"], ttl=64,
                                                            pmtudisc=True))),
    Case("ipip as Go flannel creates it",
         ("link", "add", "flannel.ipip", "type", "ipip", "local", str(V4), "nopmtudisc"),
         _iptun("flannel.ipip", lambda idx: links.IptunInfo(V4))),
    Case("ipip with a remote",
         ("link", "add", "t1", "type", "ipip", "local", str(V4), "remote", "192.168.50.9",
          "dev", "veth0", "ttl", "64"),
         _iptun("t1", lambda idx: links.IptunInfo(V4, IPv4Address("192.168.50.9"),
                                                  idx["veth0"], 64, True))),
    Case("wireguard",
         ("link", "add", "flannel-wg", "mtu", "1420", "type", "wireguard"),
         lambda idx: links.encode_new_link(links.NewLink("flannel-wg", "wireguard", mtu=1420),
                                           0)),
    Case("link set mtu",
         ("link", "set", "dev", "flannel.1", "mtu", "1400"),
         lambda idx: links.encode_set_link(idx["flannel.1"], 0, mtu=1400)),
    Case("link set mac",
         ("link", "set", "dev", "flannel.1", "address", MAC2),
         lambda idx: links.encode_set_link(idx["flannel.1"], 0, mac=MAC2)),
    Case("link set mtu, mac and up",
         ("link", "set", "dev", "flannel.1", "mtu", "1450", "address", MAC, "up"),
         lambda idx: links.encode_set_link(idx["flannel.1"], 0, mtu=1450, mac=MAC, up=True)),
    Case("link set up",
         ("link", "set", "dev", "flannel.1", "up"),
         lambda idx: links.encode_set_link(idx["flannel.1"], 0, up=True)),
    Case("link set down",
         ("link", "set", "dev", "flannel.1", "down"),
         lambda idx: links.encode_set_link(idx["flannel.1"], 0, up=False)),
    Case("link delete",
         ("link", "del", "gone.9"),
         lambda idx: links.encode_del_link(idx["gone.9"], 0)),
    Case("address add v4",
         ("addr", "add", "10.244.1.0/32", "dev", "flannel.1"),
         _addr(rtnl.RTM_NEWADDR, "flannel.1", "10.244.1.0/32")),
    Case("address add v6 nodad",
         ("addr", "add", "fd00:244:0:1::/128", "dev", "flannel-v6.1", "nodad"),
         _addr(rtnl.RTM_NEWADDR, "flannel-v6.1", "fd00:244:0:1::/128", links.IFA_F_NODAD)),
    Case("address delete v4",
         ("addr", "del", "10.244.1.0/32", "dev", "flannel.1"),
         _addr(rtnl.RTM_DELADDR, "flannel.1", "10.244.1.0/32")),
    Case("address delete v6",
         ("addr", "del", "fd00:244:0:1::/128", "dev", "flannel-v6.1"),
         _addr(rtnl.RTM_DELADDR, "flannel-v6.1", "fd00:244:0:1::/128")),
)

#: The namespace ``capture`` runs the cases in (created in this order: the indices follow).
SETUP = (
    ("link", "add", "veth0", "type", "veth", "peer", "name", "veth1"),
    ("link", "add", "flannel.1", "type", "vxlan", "id", "1", "local", str(V4), "dev", "veth0"),
    ("link", "add", "flannel-v6.1", "type", "vxlan", "id", "1", "local", str(V6), "dev",
     "veth0"),
    ("link", "add", "gone.9", "type", "vxlan", "id", "99", "dev", "veth0"),
)
GOLDEN_INDICES = {"veth0": 3, "flannel.1": 4, "flannel-v6.1": 5, "gone.9": 6}

GOLDEN: dict[str, str] = {
    "vxlan v4, every option": (
        "84000000100005060000000000000000000000000000000000000000000000000a0001000e000000"
        "0001000008000400aa0500000800030076783400480012000900010076786c616e00000038000200"
        "08000300030000000400170005000d0001000000080001000700000008000400c0a8320205000700"
        "0000000006000f0012b50000"),
    "vxlan v4 as flanneld creates it": (
        "78000000100005060000000000000000000000000000000000000000000000000a0001000e000000"
        "0001000008000400aa0500000e000300666c616e6e656c2e32000000340012000900010076786c61"
        "6e000000240002000800030003000000080001000200000008000400c0a832020500070000000000"),
    "vxlan v6 with port, learning and GBP": (
        "88000000100005060000000000000000000000000000000000000000000000000a0001000e000000"
        "00010000080004009605000008000300767836004c0012000900010076786c616e0000003c000200"
        "080003000300000004001700080001000800000014001100fd000050000000000000000000000002"
        "050007000100000006000f0021180000"),
    "vxlan without underlay device or local address": (
        "4c000000100005060000000000000000000000000000000000000000000000000800030076783900"
        "240012000900010076786c616e0000001400020008000100090000000500070000000000"),
    "ipip with local, link and ttl": (
        "9c0000001000050600000000000000000000000000000000000000000000000011000300666c616e"
        "6e656c2e69706970000000006800120008000100697069705c000200050009000000000008000200"
        "c0a8320205000a000100000005000500000000000500040040000000080001000300000008001400"
        "0000000006000f0000000000060010000000000006001100000000000600120000000000"),
    "ipip as Go flannel creates it": (
        "9c0000001000050600000000000000000000000000000000000000000000000011000300666c616e"
        "6e656c2e69706970000000006800120008000100697069705c000200050009000000000008000200"
        "c0a8320205000a000000000005000500000000000500040000000000080001000000000008001400"
        "0000000006000f0000000000060010000000000006001100000000000600120000000000"),
    "ipip with a remote": (
        "98000000100005060000000000000000000000000000000000000000000000000700030074310000"
        "70001200080001006970697064000200050009000000000008000200c0a8320208000300c0a83209"
        "05000a00010000000500050000000000050004004000000008000100030000000800140000000000"
        "06000f0000000000060010000000000006001100000000000600120000000000"),
    "wireguard": (
        "4c00000010000506000000000000000000000000000000000000000000000000080004008c050000"
        "0f000300666c616e6e656c2d77670000140012000d000100776972656775617264000000"),
    "link set mtu": (
        "28000000100005000000000000000000000000000400000000000000000000000800040078050000"),
    "link set mac": (
        "2c000000100005000000000000000000000000000400000000000000000000000a0001000e000000"
        "00090000"),
    "link set mtu, mac and up": (
        "340000001000050000000000000000000000000004000000010000000100000008000400aa050000"
        "0a0001000e00000000010000"),
    "link set up": (
        "2000000010000500000000000000000000000000040000000100000001000000"),
    "link set down": (
        "2000000010000500000000000000000000000000040000000000000001000000"),
    "link delete": (
        "2000000011000500000000000000000000000000060000000000000000000000"),
    "address add v4": (
        "280000001400050600000000000000000220000004000000080002000af40100080001000af40100"),
    "address add v6 nodad": (
        "400000001400050600000000000000000a8002000500000014000200fd0002440000000100000000"
        "0000000014000100fd000244000000010000000000000000"),
    "address delete v4": (
        "280000001500050000000000000000000220000004000000080002000af40100080001000af40100"),
    "address delete v6": (
        "400000001500050000000000000000000a8000000500000014000200fd0002440000000100000000"
        "0000000014000100fd000244000000010000000000000000"),
}
